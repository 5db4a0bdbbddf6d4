"""Prepared model directories (manifest + variants) and signed bundles, made on the spot."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper, save

from models import bundled
from runtime.engine.onnx_model import file_sha256
from runtime.ota.bundle import make
from runtime.wire.commands import generate_keypair, load_private_key
from support.modelgen import tiny_cnn


def model_dir(where: Path, name: str = "m", seed: int = 0) -> Path:
    """A one-variant prepared model directory (manifest + fp32.onnx)."""
    where.mkdir(parents=True)
    f = tiny_cnn(where / "fp32.onnx", batch=1, seed=seed)
    (where / "manifest.json").write_text(json.dumps({
        "schema": "edgerun.manifest/1", "name": name, "labels": list("abcde"),
        "preprocess": {}, "output": "probabilities", "accuracy_basis": "agreement",
        "eval_images": 0, "variants": [{
            "name": "fp32", "precision": "fp32", "file": "fp32.onnx",
            "sha256": file_sha256(f), "input_name": "x", "input_shape": [1, 3, 32, 32],
            "accuracy": 1.0, "agreement": 1.0, "max_abs_diff": 0.0, "mean_abs_diff": 0.0,
            "size_bytes": f.stat().st_size, "source": "tiny"}]}))
    return where


def write_manifest(where: Path, name: str, onnx: Path, shape: list[int]) -> Path:
    """A one-variant manifest for `onnx` in `where`, the bundled model's other fields kept."""
    base = json.loads((bundled() / "manifest.json").read_text())
    (where / "manifest.json").write_text(json.dumps({
        **base, "name": name, "failed": [], "variants": [{
            "name": "fp32", "precision": "fp32", "file": onnx.name,
            "sha256": file_sha256(onnx), "input_name": _input_name(onnx), "input_shape": shape,
            "accuracy": 0.99, "agreement": 1.0, "max_abs_diff": 0.0, "mean_abs_diff": 0.0,
            "size_bytes": onnx.stat().st_size, "source": onnx.name}]}))
    return where


def _input_name(onnx_path: Path) -> str:
    import onnx

    return onnx.load(str(onnx_path)).graph.input[0].name


def inspection_dir(where: Path, name: str = "inspection", tag: str = "") -> Path:
    """The bundled inspection model's fp32 form alone (one rung: fast to profile). `tag`
    goes into the file's doc string: the same network in a file of its own, which a profile
    cache (keyed by the file's bytes) has not seen, so a deploy of it is really profiled."""
    where.mkdir(parents=True)
    if tag:
        import onnx

        m = onnx.load(str(bundled() / "fp32.onnx"))
        m.doc_string = tag
        onnx.save(m, str(where / "fp32.onnx"))
    else:
        shutil.copy(bundled() / "fp32.onnx", where / "fp32.onnx")
    return write_manifest(where, name, where / "fp32.onnx", [1, 3, 96, 96])


def constant_dir(where: Path, cls: int = 1) -> Path:
    """A model that answers class `cls` ("scratch") whatever the frame."""
    where.mkdir(parents=True)
    onehot = np.zeros((1, 5), np.float32)
    onehot[0, cls] = 1.0
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[1, 2, 3], keepdims=0),
             helper.make_node("Reshape", ["m", "shape"], ["m2"]),
             helper.make_node("Mul", ["m2", "zero"], ["z"]),
             helper.make_node("Add", ["z", "onehot"], ["y"])]
    graph = helper.make_graph(
        nodes, "constant", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                          [1, 3, 96, 96])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        [numpy_helper.from_array(np.array([1, 1], np.int64), "shape"),
         numpy_helper.from_array(np.zeros((1, 5), np.float32), "zero"),
         numpy_helper.from_array(onehot, "onehot")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    save(model, str(where / "fp32.onnx"))
    return write_manifest(where, "constant", where / "fp32.onnx", [1, 3, 96, 96])


def slow_dir(where: Path, hw: int = 512) -> Path:
    """A real CNN at a large input: many milliseconds per frame on this machine."""
    where.mkdir(parents=True)
    tiny_cnn(where / "fp32.onnx", batch=1, hw=(hw, hw))
    return write_manifest(where, "slow", where / "fp32.onnx", [1, 3, hw, hw])


PROBATION = """probation_frames = 60
shadow_every = 2
agreement_floor = 0.8
"""


def small_bundle(tmp_path: Path, name: str, version: str, seed: int = 0) -> bytes:
    """A signed bundle file's bytes (about 10 KB)."""
    d = model_dir(tmp_path / f"src-{name}-{version}", name, seed)
    key = tmp_path / "k.pem"
    if not key.exists():
        generate_keypair(key, tmp_path / "k.pub")
    out = tmp_path / f"{name}-{version}.edgerun"
    make(d, load_private_key(key), out, version)
    return out.read_bytes()


def big_bundle(tmp_path: Path, size: int) -> Path:
    """A file the shelf takes for a bundle (its header first) of about `size` bytes: for
    transfer tests, which never verify what they fetched."""
    import io
    import tarfile

    from runtime.ota.bundle import HEADER as BUNDLE_HEADER

    out = tmp_path / "big.edgerun"
    with tarfile.open(out, "w") as tar:
        for name, body in ((BUNDLE_HEADER, json.dumps({"name": "big", "version": "1"})
                            .encode()), ("pad.bin", bytes(range(256)) * (size // 256))):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return out
