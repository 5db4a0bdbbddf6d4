"""Everything a bundle's manifest names with a sha256 is held to it: variants, eval images,
side files; at `models verify`, at install into the device's store, and when signing (issue
36: an eval.npz differing from the manifest's sha256, the header re-signed over the new
bytes, passed `models verify` and deployed)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from support.model_dirs import model_dir
from support.under_test import child_env

from runtime.engine.onnx_model import file_sha256
from runtime.ota.bundle import HEADER, SIG, BundleError, make, unpack
from runtime.ota.model_store import ModelStore
from runtime.wire.commands import generate_keypair, key_id, load_private_key, load_public_keys


@pytest.fixture
def keys(tmp_path):
    generate_keypair(tmp_path / "pub.pem", tmp_path / "pub.pub")
    return {"key": load_private_key(tmp_path / "pub.pem"),
            "trusted": load_public_keys([str(tmp_path / "pub.pub")])}


def _with_side_files(where: Path) -> Path:
    """model_dir plus an eval set and a side file, both named in the manifest with a hash."""
    src = model_dir(where)
    (src / "eval.npz").write_bytes(b"the publisher's eval images" * 50)
    (src / "anchors.bin").write_bytes(b"\x01\x02" * 64)
    doc = json.loads((src / "manifest.json").read_text())
    doc["eval"] = {"tiny": {"file": "eval.npz", "sha256": file_sha256(src / "eval.npz"),
                            "images": 4, "basis": "agreement"}}
    doc["side"] = [{"file": "anchors.bin", "sha256": file_sha256(src / "anchors.bin")}]
    (src / "manifest.json").write_text(json.dumps(doc))
    return src


def _resigned(bundle: Path, out: Path, key, name: str, data: bytes) -> Path:
    """`bundle` with member `name` replaced by `data` and the header
    re-signed over the new bytes by the publisher's own key; the manifest untouched."""
    with tarfile.open(bundle) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    members[name] = data
    header = json.loads(members[HEADER])
    files = [f for f in header["files"] if f["name"] != name]
    files.append({"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    header["files"] = files
    raw = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    members[HEADER] = raw
    members[SIG] = json.dumps({"key_id": key_id(key.public_key()),
                               "sig": base64.b64encode(key.sign(raw)).decode()}).encode()
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for n in [HEADER, SIG, *(f["name"] for f in files)]:
            ti = tarfile.TarInfo(n)
            ti.size = len(members[n])
            tar.addfile(ti, io.BytesIO(members[n]))
    return out


def test_hashed_files_finds_variants_eval_images_and_side_files(tmp_path):
    from runtime.engine.manifest import hashed_files

    src = _with_side_files(tmp_path / "src")
    got = {(where, f) for where, f, _ in hashed_files(src)}
    assert got == {("variants[0]", "fp32.onnx"), ("eval.tiny", "eval.npz"),
                   ("side[0]", "anchors.bin")}


@pytest.mark.parametrize("member", ["eval.npz", "anchors.bin", "fp32.onnx"])
def test_a_file_differing_from_the_manifest_is_refused_by_unpack(tmp_path, keys, member):
    src = _with_side_files(tmp_path / "src")
    info = make(src, keys["key"], tmp_path / "b.edgerun", "1")
    assert {f["name"] for f in info.files} >= {"eval.npz", "anchors.bin"}
    unpack(tmp_path / "b.edgerun", tmp_path / "ok", keys["trusted"])  # the honest one
    bad = _resigned(tmp_path / "b.edgerun", tmp_path / "t.edgerun", keys["key"], member,
                    b"other bytes, signed by the publisher")
    with pytest.raises(BundleError, match=rf"{member} has sha256 .* the manifest says"):
        unpack(bad, tmp_path / "out", keys["trusted"])
    assert not (tmp_path / "out").exists()


def test_tampered_eval_is_refused_by_models_verify_and_by_install(tmp_path, keys):
    """The CLI's verify (the coordinator's side: what an operator runs before a rollout) and
    the device's store (install and deploy both add a bundle through it)."""
    src = _with_side_files(tmp_path / "src")
    make(src, keys["key"], tmp_path / "b.edgerun", "1")
    bad = _resigned(tmp_path / "b.edgerun", tmp_path / "t.edgerun", keys["key"], "eval.npz",
                    b"images chosen to make a bad precision look accurate")
    out = subprocess.run([sys.executable, "-m", "runtime.cli", "models", "verify", str(bad),
                          "--publisher-key", str(tmp_path / "pub.pub")],
                         capture_output=True, text=True, env=child_env(), timeout=60)
    assert out.returncode == 1 and "REFUSED" in out.stderr and "eval.npz" in out.stderr, (
        out.stdout, out.stderr)
    store = ModelStore(tmp_path / "state")
    with pytest.raises(BundleError, match="eval.npz has sha256"):
        store.add(bad, keys["trusted"])
    assert store.ids() == []


def test_a_directory_whose_eval_differs_from_its_manifest_is_never_signed(tmp_path, keys):
    src = _with_side_files(tmp_path / "src")
    (src / "eval.npz").write_bytes(b"changed after the manifest was written")
    with pytest.raises(BundleError, match=r"eval.npz: sha256 does not match the manifest"):
        make(src, keys["key"], tmp_path / "b.edgerun", "1")
