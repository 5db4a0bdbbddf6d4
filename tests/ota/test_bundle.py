"""Signed model bundles (runtime/ota/bundle.py) and the on-device store's pointer
(runtime/ota/model_store.py): real files, real keys, the real CLI."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from support.model_dirs import model_dir
from support.under_test import child_env

from runtime.ota.bundle import BundleError, make, read_info, unpack
from runtime.ota.model_store import ModelStore
from runtime.wire.commands import generate_keypair, load_private_key, load_public_keys

ROOT = Path(__file__).parents[2]


@pytest.fixture
def keys(tmp_path):
    generate_keypair(tmp_path / "pub.pem", tmp_path / "pub.pub")
    generate_keypair(tmp_path / "other.pem", tmp_path / "other.pub")
    return {"key": load_private_key(tmp_path / "pub.pem"),
            "other": load_private_key(tmp_path / "other.pem"),
            "trusted": load_public_keys([str(tmp_path / "pub.pub")])}


def test_signed_bundle_unpacks_to_the_same_files(tmp_path, keys):
    src = model_dir(tmp_path / "src")
    info = make(src, keys["key"], tmp_path / "b.edgerun", "1.0")
    assert (info.name, info.version, info.id) == ("m", "1.0", "m@1.0")
    got = unpack(tmp_path / "b.edgerun", tmp_path / "out", keys["trusted"])
    assert got.id == "m@1.0" and read_info(tmp_path / "b.edgerun", keys["trusted"]) == got
    for f in ("manifest.json", "fp32.onnx"):
        assert (tmp_path / "out" / f).read_bytes() == (src / f).read_bytes()


def _refused(bundle: Path, trusted, tmp_path: Path, match: str) -> None:
    with pytest.raises(BundleError, match=match):
        unpack(bundle, tmp_path / "out", trusted)
    assert not (tmp_path / "out").exists()  # nothing refused stays on disk


def test_unsigned_bundle_is_refused(tmp_path, keys):
    src = model_dir(tmp_path / "src")
    with tarfile.open(tmp_path / "u.edgerun", "w") as tar:
        tar.add(src / "manifest.json", "edgerun-bundle.json")
        tar.add(src / "manifest.json", "manifest.json")
    _refused(tmp_path / "u.edgerun", keys["trusted"], tmp_path, "unsigned")


def test_bundle_signed_by_an_untrusted_key_is_refused(tmp_path, keys):
    make(model_dir(tmp_path / "src"), keys["other"], tmp_path / "b.edgerun", "1")
    _refused(tmp_path / "b.edgerun", keys["trusted"], tmp_path,
             "not one of the publisher keys this device trusts")


def test_command_keys_are_not_publisher_keys(tmp_path, keys):
    """The trust sets are separate: a device with no publisher keys trusts no bundle."""
    make(model_dir(tmp_path / "src"), keys["key"], tmp_path / "b.edgerun", "1")
    _refused(tmp_path / "b.edgerun", {}, tmp_path, "none configured")


def _rewrite(bundle: Path, out: Path, change) -> None:
    """Copy a bundle member by member, letting `change(name, data)` alter the bytes."""
    with tarfile.open(bundle) as src, tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as dst:
        for m in src.getmembers():
            data = change(m.name, src.extractfile(m).read())
            m.size = len(data)
            import io
            dst.addfile(m, io.BytesIO(data))


def test_tampered_file_is_refused_naming_it(tmp_path, keys):
    make(model_dir(tmp_path / "src"), keys["key"], tmp_path / "b.edgerun", "1")

    def flip(name, data):
        if name != "fp32.onnx":
            return data
        return data[:-10] + bytes([data[-10] ^ 1]) + data[-9:]

    _rewrite(tmp_path / "b.edgerun", tmp_path / "t.edgerun", flip)
    _refused(tmp_path / "t.edgerun", keys["trusted"], tmp_path,
             r"fp32.onnx: sha256 .* does not match the signed .*tampered")


def test_tampered_header_breaks_the_signature(tmp_path, keys):
    make(model_dir(tmp_path / "src"), keys["key"], tmp_path / "b.edgerun", "1")
    _rewrite(tmp_path / "b.edgerun", tmp_path / "t.edgerun",
             lambda n, d: d.replace(b'"version":"1"', b'"version":"2"')
             if n == "edgerun-bundle.json" else d)
    _refused(tmp_path / "t.edgerun", keys["trusted"], tmp_path, "bad signature")


def test_extra_file_is_refused(tmp_path, keys):
    make(model_dir(tmp_path / "src"), keys["key"], tmp_path / "b.edgerun", "1")
    import io
    with tarfile.open(tmp_path / "b.edgerun", "a") as tar:
        info = tarfile.TarInfo("evil.sh")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"hi\n"))
    _refused(tmp_path / "b.edgerun", keys["trusted"], tmp_path,
             "carries 'evil.sh', which the signed header does not list")


@pytest.mark.parametrize("keep", [0.3, 0.7, 0.98])
def test_truncated_bundle_is_refused(tmp_path, keys, keep):
    make(model_dir(tmp_path / "src"), keys["key"], tmp_path / "b.edgerun", "1")
    data = (tmp_path / "b.edgerun").read_bytes()
    with tarfile.open(tmp_path / "b.edgerun") as tar:  # where the content ends (tar pads
        last = tar.getmembers()[-1]  # to 10 KiB records: a cut in the padding loses nothing)
    (tmp_path / "t.edgerun").write_bytes(data[:int((last.offset_data + last.size) * keep)])
    _refused(tmp_path / "t.edgerun", keys["trusted"], tmp_path, "truncated")


def test_size_cap_is_checked_from_the_signed_header(tmp_path, keys):
    make(model_dir(tmp_path / "src"), keys["key"], tmp_path / "b.edgerun", "1")
    with pytest.raises(BundleError, match="over the cap"):
        unpack(tmp_path / "b.edgerun", tmp_path / "out", keys["trusted"], max_bytes=1000)


def test_corrupt_model_directory_is_never_signed(tmp_path, keys):
    src = model_dir(tmp_path / "src")
    with (src / "fp32.onnx").open("ab") as f:
        f.write(b"x")
    with pytest.raises(BundleError, match="refusing to sign"):
        make(src, keys["key"], tmp_path / "b.edgerun", "1")


def test_cli_bundle_then_verify(tmp_path, keys):
    src = model_dir(tmp_path / "src", name="inspect")
    env = child_env()
    out = subprocess.run([sys.executable, "-m", "runtime.cli", "models", "bundle", str(src),
                          "--sign", str(tmp_path / "pub.pem"), "--version", "2.1"],
                         cwd=tmp_path, capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "model inspect version 2.1, 2 files" in out.stdout
    bundle = tmp_path / "inspect-2.1.edgerun"
    ok = subprocess.run([sys.executable, "-m", "runtime.cli", "models", "verify", str(bundle),
                         "--publisher-key", str(tmp_path / "pub.pub")],
                        capture_output=True, text=True, env=env, timeout=60)
    assert ok.returncode == 0 and "2 files verified" in ok.stdout, ok.stderr
    bad = subprocess.run([sys.executable, "-m", "runtime.cli", "models", "verify", str(bundle),
                          "--publisher-key", str(tmp_path / "other.pub")],
                         capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 1 and "REFUSED" in bad.stderr and "not one of the publisher" \
        in bad.stderr


# -- the store's pointer ----------------------------------------------------------------------

def test_store_switch_keeps_previous_and_rollback_remembers_why(tmp_path, keys):
    store = ModelStore(tmp_path / "state")
    for i, v in enumerate(("1", "2", "3")):
        make(model_dir(tmp_path / f"src{v}", seed=i), keys["key"], tmp_path / f"{v}.b", v)
        store.add(tmp_path / f"{v}.b", keys["trusted"])
        store.switch(f"m@{v}", {"frames": 10 * i})
    assert store.read()["previous"] == "m@2" and store.read()["probation"]["baseline"] == {
        "frames": 20}
    assert store.ids() == ["m@2", "m@3"]  # m@1 was pruned: neither current nor previous
    assert store.rollback("agreement 5%") == "m@2"
    assert store.serving()[0] == "m@2" and store.rejected("m@3") == "agreement 5%"
    assert store.read()["probation"] is None


def test_crash_loop_rolls_back_after_n_starts(tmp_path, keys):
    store = ModelStore(tmp_path / "state")
    for v in ("1", "2"):
        make(model_dir(tmp_path / f"src{v}"), keys["key"], tmp_path / f"{v}.b", v)
        store.add(tmp_path / f"{v}.b", keys["trusted"])
        store.switch(f"m@{v}")
    assert store.boot(3) is None and store.boot(3) is None
    why = store.boot(3)
    assert why and "crash loop: 3 starts" in why and store.serving()[0] == "m@1"


def test_unreadable_pointer_falls_back_to_the_configured_model(tmp_path):
    store = ModelStore(tmp_path / "state")
    store.pointer.write_text("{not json")
    assert store.serving() == (None, None)
    assert (store.root / "current.json.bad").exists()


def test_a_signature_nested_too_deeply_is_refused_not_a_traceback(tmp_path, keys):
    """`edgerun-bundle.sig` of 200,000 `[`: json.loads raised RecursionError, which the
    signature check did not catch (only ValueError, KeyError, TypeError): read_info and
    unpack, and so `edgerun models verify` and the device's verify step, ended in a
    traceback instead of refusing an unsigned bundle. Checked before any key is."""
    import io

    bad = tmp_path / "deep.edgerun"
    with tarfile.open(bad, "w") as tar:
        for name, data in (("edgerun-bundle.json", b'{"schema": "edgerun.bundle/1"}'),
                           ("edgerun-bundle.sig", b"[" * 200_000)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    for check in (lambda: read_info(bad, keys["trusted"]),
                  lambda: unpack(bad, tmp_path / "out", keys["trusted"])):
        with pytest.raises(BundleError, match="unsigned"):
            check()
    assert not (tmp_path / "out").exists()
