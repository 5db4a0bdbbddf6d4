"""Bundle names are names: a model name and version become one directory name on the device and
on the coordinator's shelf, so both sides apply one rule (runtime.ota.bundle.model_id), and a
bundle signed by the trusted publisher key is still refused when its name is a path. The CLI
(`models verify`, `models install`) runs as a real subprocess."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from support.model_dirs import model_dir

from runtime.coordinator.bundles import BundleRefused, _peek, check_id
from runtime.ota.bundle import (
    HEADER,
    SCHEMA,
    SIG,
    BundleError,
    check_name,
    check_version,
    inside,
    model_id,
    parse_id,
    read_info,
)
from runtime.ota.model_store import ModelStore
from runtime.wire.commands import generate_keypair, key_id, load_private_key, load_public_keys

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("name, ok", [
    ("inspection", True), ("yolo_v8.n-int8", True), ("a" * 128, True), ("_x", True),
    ("../../../../tmp/x", False), ("..", False), (".", False), (".hidden", False),
    ("a/b", False), ("a\\b", False), ("a..b", False), ("x\n", False), ("", False),
    ("a" * 129, False), ("-x", False), ("a@b", False), ("a b", False), ("é", False),
    (None, False), (3, False), (["x"], False),
])
def test_model_name_table(name, ok):
    if ok:
        assert check_name(name) == name
    else:
        with pytest.raises(BundleError, match="model name"):
            check_name(name)


@pytest.mark.parametrize("version, ok", [
    ("1", True), ("2.1.0+build7", True), ("a" * 64, True), ("t9b", True),
    ("..", False), ("1..2", False), ("../x", False), ("1/2", False), ("+1", False),
    ("a" * 65, False), ("1\n", False), ("", False), (1, False),
])
def test_version_table(version, ok):
    if ok:
        assert check_version(version) == version
    else:
        with pytest.raises(BundleError, match="version"):
            check_version(version)


@pytest.mark.parametrize("vid, ok", [
    ("m@1", True), ("inspection@2.1", True), ("m@1@2", False), ("m", False),
    ("../x@1", False), ("m@../1", False), ("@1", False), ("m@", False), (None, False),
])
def test_id_table_is_the_same_on_both_sides(vid, ok):
    """The device's parse and the coordinator's URL check agree on every id."""
    if ok:
        assert parse_id(vid) == tuple(vid.split("@")) and check_id(vid) == vid
    else:
        with pytest.raises(BundleError):
            parse_id(vid)
        if isinstance(vid, str):
            with pytest.raises(BundleRefused):
                check_id(vid)


def test_inside_refuses_links_out_of_the_root(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "out").mkdir()
    (root / "link@1").symlink_to(tmp_path / "out")
    assert inside(root, "m@1") == (root / "m@1").resolve()
    for bad in ("link@1", "../out", ".", ""):
        with pytest.raises(BundleError, match="not inside"):
            inside(root, bad)


# -- a hostile bundle signed by the trusted key ------------------------------------------------

HOSTILE = "../../../../tmp/x"


def signed_bundle(tmp_path: Path, name: str, version: str, key_path: Path) -> Path:
    """A bundle whose header and manifest both say `name`, correctly signed by `key_path`: what
    a publisher with a bug (or a stolen key) could produce; `make` itself refuses such names."""
    src = model_dir(tmp_path / "src")
    manifest = json.loads((src / "manifest.json").read_text())
    manifest["name"] = name
    files = {"manifest.json": json.dumps(manifest).encode(),
             "fp32.onnx": (src / "fp32.onnx").read_bytes()}


    header = {"schema": SCHEMA, "name": name, "version": version, "created": 0.0,
              "files": [{"name": n, "size": len(b), "sha256": hashlib.sha256(b).hexdigest()}
                        for n, b in files.items()]}
    raw = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    key = load_private_key(key_path)
    sig = json.dumps({"key_id": key_id(key.public_key()),
                      "sig": base64.b64encode(key.sign(raw)).decode()}).encode()
    out = tmp_path / "hostile.edgerun"
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for n, b in [(HEADER, raw), (SIG, sig), *files.items()]:
            info = tarfile.TarInfo(n)
            info.size, info.mode = len(b), 0o644
            tar.addfile(info, io.BytesIO(b))
    return out


@pytest.fixture
def publisher(tmp_path):
    generate_keypair(tmp_path / "pub.pem", tmp_path / "pub.pub")
    return tmp_path / "pub.pem", tmp_path / "pub.pub"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runtime.cli", "models", *args],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_traversal_name_signed_by_the_trusted_key_is_refused_by_verify_and_install(
        tmp_path, publisher):
    key, pub = publisher
    bundle = signed_bundle(tmp_path, HOSTILE, "t9b", key)
    # the signature itself is good: only the name is wrong
    with pytest.raises(BundleError, match="model name"):
        read_info(bundle, load_public_keys([str(pub)]))
    # a state dir deep enough that the traversal would land inside tmp_path (at a/tmp/x@t9b)
    state = tmp_path / "a" / "b" / "state"
    state.mkdir(parents=True)
    cfg = tmp_path / "edgerun.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{state}"\n[models]\npublisher_keys = ["{pub}"]\n')
    before, tmp_before = _tree(tmp_path), set(os.listdir("/tmp"))

    v = _cli("verify", str(bundle), "--publisher-key", str(pub))
    assert v.returncode == 1 and "REFUSED" in v.stderr and "model name" in v.stderr, \
        (v.stdout, v.stderr)
    assert "OK" not in v.stdout

    got = _cli("install", str(bundle), "--config", str(cfg))
    assert got.returncode == 1 and "REFUSED" in got.stderr and "model name" in got.stderr, \
        (got.stdout, got.stderr)
    assert "[swap]" not in got.stderr
    # nothing written outside the store: the store's own empty directories are all that is new
    new = _tree(tmp_path) - before
    assert new and all(p.startswith("a/b/state/models") for p in new), new
    assert not (tmp_path / "a" / "tmp").exists()
    assert not [n for n in set(os.listdir("/tmp")) - tmp_before if n.startswith("x@")]
    store = ModelStore(state)
    assert store.ids() == [] and store.serving() == (None, None)
    assert not any(store.staging.iterdir()) and not any(store.versions.iterdir())


def test_the_coordinator_refuses_the_same_bundle_with_the_same_rule(tmp_path, publisher):
    bundle = signed_bundle(tmp_path, HOSTILE, "t9b", publisher[0])
    with bundle.open("rb") as f, pytest.raises(BundleRefused, match="model name"):
        _peek(f)
    ok = signed_bundle(tmp_path / "ok", "inspection", "2", publisher[0])
    with ok.open("rb") as f:
        assert _peek(f) == ("inspection", "2") and model_id("inspection", "2") == "inspection@2"


def test_store_paths_are_proven_inside_the_store(tmp_path):
    """The swap (`switch`) and every lookup go through the same check: a pointer or a command
    naming a path is 'not on this device', never a directory elsewhere."""
    store = ModelStore(tmp_path / "state")
    outside = tmp_path / "x@1"
    outside.mkdir()
    (outside / "manifest.json").write_text("{}")
    for vid in ("../../../x@1", "../../x@1", "x@1/..", "/abs@1"):
        assert store.path(vid) is None and not store.has(vid)
        with pytest.raises(BundleError, match="not on this device"):
            store.switch(vid)
    assert store.read()["current"] is None


def test_install_refuses_a_sha256_that_would_name_a_path(tmp_path):
    """`models install URL --sha256 X`: X names the download file, so it must be hex."""
    state = tmp_path / "state"
    cfg = tmp_path / "edgerun.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{state}"\n')
    got = _cli("install", "http://127.0.0.1:9/b.edgerun", "--size", "10", "--sha256",
               "../../../../escaped", "--config", str(cfg))
    assert got.returncode == 1 and "64 lowercase hex" in got.stderr, got.stderr
    assert not list(tmp_path.rglob("escaped*"))
