"""The command line (issue 14, item 8): global options after the subcommand, `keys` never
overwrites a key without --force."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest
from support.under_test import child_env

from runtime.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]


def _parse(*argv: str):
    return build_parser().parse_args(list(argv))


@pytest.mark.parametrize("argv", [
    ("-v", "serve", "--config", "x.toml"),
    ("serve", "--config", "x.toml", "-v"),
    ("serve", "-v", "--config", "x.toml"),
    ("check", "x.toml", "--verbose"),
    ("fleet", "ls", "-v"),
    ("fleet", "-v", "ls"),
    ("models", "prepare", "m.onnx", "--calib", "c", "--val", "v", "--out", "o", "-v"),
    ("keys", "--private", "a", "--public", "b", "-v"),
])
def test_verbose_anywhere(argv):
    assert _parse(*argv).verbose is True


@pytest.mark.parametrize("argv", [("serve",), ("fleet", "ls"), ("check", "x.toml")])
def test_verbose_off_by_default(argv):
    assert _parse(*argv).verbose is False


def test_fleet_options_before_or_after_the_action():
    for argv in (("fleet", "--json", "ls"), ("fleet", "ls", "--json")):
        assert _parse(*argv).json is True
    assert _parse("fleet", "ls").json is False
    a = _parse("fleet", "show", "box1", "--api", "http://h:1", "--token-file", "t", "--json")
    assert (a.device, a.api, a.token_file, a.json) == ("box1", "http://h:1", Path("t"), True)
    a = _parse("fleet", "--config", "c.toml", "send", "box1", "set_rate", "fps=5", "--json")
    assert (a.config, a.cmd, a.kv, a.json) == (Path("c.toml"), "set_rate", ["fps=5"], True)
    a = _parse("fleet", "--api", "http://outer", "ls", "--api", "http://inner")
    assert a.api == "http://inner"  # the later one wins, as with any repeated option
    assert _parse("fleet", "--api", "http://outer", "ls").api == "http://outer"
    assert _parse("fleet", "ls").api is None and _parse("fleet", "ls").config is None


def test_verbose_after_the_subcommand_turns_on_debug_logging():
    code = ("import logging, sys; from runtime.cli import main; main(sys.argv[1:]); "
            "print(logging.getLogger().level)")
    env = child_env()
    for argv, level in ((["schemas", "-v"], "10"), (["schemas"], "20")):
        out = subprocess.run([sys.executable, "-c", code, *argv], env=env, check=True,
                             capture_output=True, text=True, timeout=60).stdout
        assert out.splitlines()[-1] == level, (argv, out[-200:])


def test_keys_makes_a_pair(tmp_path, capsys):
    priv, pub = tmp_path / "k" / "cmd.pem", tmp_path / "k" / "cmd.pub"
    assert main(["keys", "--private", str(priv), "--public", str(pub)]) == 0
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    assert b"PRIVATE KEY" in priv.read_bytes() and b"PUBLIC KEY" in pub.read_bytes()
    assert "key " in capsys.readouterr().out


@pytest.mark.parametrize("existing", ["private", "public", "both"])
def test_keys_refuses_to_overwrite_without_force(tmp_path, capsys, existing):
    priv, pub = tmp_path / "cmd.pem", tmp_path / "cmd.pub"
    if existing in ("private", "both"):
        priv.write_bytes(b"the key devices trust")
    if existing in ("public", "both"):
        pub.write_bytes(b"the public half")
    before = {f: f.read_bytes() for f in (priv, pub) if f.exists()}
    assert main(["keys", "--private", str(priv), "--public", str(pub)]) == 2
    err = capsys.readouterr().err
    assert "--force" in err and "refusing to overwrite" in err
    for f in before:
        assert str(f) in err
        assert f.read_bytes() == before[f]  # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f.name for f in before)


def test_keys_refuses_a_dangling_symlink_too(tmp_path, capsys):
    priv, pub = tmp_path / "cmd.pem", tmp_path / "cmd.pub"
    priv.symlink_to(tmp_path / "elsewhere.pem")
    assert main(["keys", "--private", str(priv), "--public", str(pub)]) == 2
    assert not (tmp_path / "elsewhere.pem").exists() and not pub.exists()


def test_keys_force_replaces_and_keeps_0600(tmp_path, capsys):
    priv, pub = tmp_path / "cmd.pem", tmp_path / "cmd.pub"
    priv.write_bytes(b"old")
    priv.chmod(0o644)
    pub.write_bytes(b"old")
    assert main(["keys", "--private", str(priv), "--public", str(pub), "--force"]) == 0
    assert b"PRIVATE KEY" in priv.read_bytes() and b"PUBLIC KEY" in pub.read_bytes()
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600


def test_generate_keypair_exclusive_leaves_no_half_pair(tmp_path):
    from runtime.wire.commands import generate_keypair

    priv, pub = tmp_path / "cmd.pem", tmp_path / "cmd.pub"
    pub.write_bytes(b"someone else's")
    with pytest.raises(FileExistsError):
        generate_keypair(priv, pub, overwrite=False)
    assert not priv.exists() and pub.read_bytes() == b"someone else's"
