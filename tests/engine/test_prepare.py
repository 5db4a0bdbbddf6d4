"""`models prepare` and manifest loading on small models built in the test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from support.modelgen import tiny_cnn

from models.synthetic import CLASSES, write_folder
from runtime.engine.manifest import Preprocess, load_manifest, postprocess, verify
from runtime.engine.onnx_model import ModelError
from runtime.engine.prepare import PrepareOptions, list_images, prepare, read_image

PRE = Preprocess(mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    write_folder(root / "calib", seed=1, count=20, size=32)
    write_folder(root / "val", seed=2, count=40, size=32)
    return root


def _opts(**kw):
    return PrepareOptions(**{"name": "tiny", "preprocess": PRE, "labels": CLASSES, **kw})


def test_prepare_makes_every_variant_and_its_numbers_are_true(tmp_path, images):
    model = tiny_cnn(tmp_path / "m.onnx", hw=(32, 32))
    doc = prepare(model, images / "calib", images / "val", tmp_path / "out", _opts())
    names = [v["name"] for v in doc["variants"]]
    assert names == ["fp32", "fp16", "int8", "fp32-r24"] and doc["failed"] == []
    man = load_manifest(tmp_path / "out")
    assert man.accuracy_basis == "labels" and man.eval_images == 40
    files = list_images(images / "val", 10_000)
    truth = np.array([CLASSES.index(f.parent.name) for f in files])
    frames = [read_image(f) for f in files]
    ref = None
    for v in man.variants:
        sess = ort.InferenceSession(str(verify(man, v)), providers=["CPUExecutionProvider"])
        out = np.concatenate([sess.run(None, {v.input_name: man.preprocess.apply(f, v.input_shape)})
                              [0] for f in frames])
        ref = out if v.name == "fp32" else ref
        assert v.accuracy == pytest.approx(float((out.argmax(1) == truth).mean()))
        assert v.agreement == pytest.approx(float((out.argmax(1) == ref.argmax(1)).mean()))
        assert v.max_abs_diff == pytest.approx(float(np.abs(out - ref).max()), abs=1e-6)
    assert man.variant("fp16").max_abs_diff < 1e-2
    assert man.variant("fp32-r24").input_shape == (1, 3, 24, 24)
    label, score = postprocess(out[:1], man)[0]
    assert label in CLASSES and 0 <= score <= 1


def test_corrupted_variant_is_refused_by_sha256(tmp_path, images):
    from runtime.choice.profiler import model_files
    from runtime.config import ModelConfig

    model = tiny_cnn(tmp_path / "m.onnx", hw=(32, 32))
    prepare(model, images / "calib", images / "val", tmp_path / "out", _opts(reduced=False))
    target = tmp_path / "out" / "int8.onnx"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    man = load_manifest(tmp_path / "out")
    verify(man, man.variant("fp32"))
    with pytest.raises(ModelError, match=r"int8.onnx: sha256 .* refusing to load"):
        verify(man, man.variant("int8"))
    with pytest.raises(ModelError, match="sha256"):
        model_files(ModelConfig(path=str(tmp_path / "out")))


def test_dynamic_height_width_needs_input_shape(tmp_path, images):
    model = tiny_cnn(tmp_path / "dyn.onnx", hw=("H", "W"))
    with pytest.raises(ModelError, match="input_shape"):
        prepare(model, images / "calib", images / "val", tmp_path / "a", _opts())
    doc = prepare(model, images / "calib", images / "val", tmp_path / "b",
                  _opts(input_shape=(1, 3, 32, 32), reduced=False))
    assert {v["name"] for v in doc["variants"]} == {"fp32", "fp16", "int8"}
    assert all(v["input_shape"] == [1, 3, 32, 32] for v in doc["variants"])


def test_failing_quantization_keeps_the_other_variants(tmp_path, images):
    calib = tmp_path / "calib"
    write_folder(calib, seed=3, count=5, size=32)
    (calib / "ok" / "broken.png").write_bytes(b"not a png at all")
    model = tiny_cnn(tmp_path / "m.onnx", hw=(32, 32))
    doc = prepare(model, calib, images / "val", tmp_path / "out", _opts(reduced=False))
    assert [v["name"] for v in doc["variants"]] == ["fp32", "fp16"]
    assert doc["failed"][0]["variant"] == "int8"
    assert "broken.png" in doc["failed"][0]["error"]
    assert not (tmp_path / "out" / "int8.onnx").exists()
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["failed"]


def test_prefix_adds_a_second_model_to_the_manifest(tmp_path, images):
    out = tmp_path / "out"
    prepare(tiny_cnn(tmp_path / "a.onnx", hw=(32, 32)), images / "calib", images / "val", out,
            _opts(reduced=False))
    doc = prepare(tiny_cnn(tmp_path / "b.onnx", hw=(32, 32), seed=5), images / "calib",
                  images / "val", out, _opts(reduced=False, prefix="small"))
    assert [v["name"] for v in doc["variants"]] == ["fp32", "fp16", "int8", "small-fp32",
                                                   "small-fp16", "small-int8"]
    other = PrepareOptions(name="x", preprocess=Preprocess(), labels=CLASSES, prefix="big")
    with pytest.raises(ModelError, match="preprocessing differs"):
        prepare(tmp_path / "a.onnx", images / "calib", images / "val", out, other)


@pytest.mark.parametrize("text, match", [
    ("{", "line 1: not valid JSON"),
    ('{"schema": "other/1"}', "schema is 'other/1'"),
    ('{"schema": "edgerun.manifest/1"}', "missing or invalid field"),
])
def test_bad_manifest_says_what_and_where(tmp_path, text, match):
    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(ModelError, match=match):
        load_manifest(tmp_path)


def test_preprocess_matches_numpy_reference():
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)
    pre = Preprocess(mean=(0.4, 0.5, 0.6), std=(0.2, 0.25, 0.3))
    import cv2

    want = cv2.resize(frame, (32, 24), interpolation=cv2.INTER_LINEAR)[..., ::-1] / 255.0
    want = ((want - np.array([0.4, 0.5, 0.6])) / np.array([0.2, 0.25, 0.3])).transpose(2, 0, 1)
    got = pre.apply(frame, (1, 3, 24, 32))
    assert got.shape == (1, 3, 24, 32) and got.dtype == np.float32
    np.testing.assert_allclose(got[0], want, atol=1e-5)


# -- without labelled images (issue 13) ------------------------------------------------------

def _flat_copy(src, dst):
    """The val images in one folder whose name is no label: unlabelled images."""
    dst.mkdir(parents=True)
    for i, f in enumerate(sorted(src.rglob("*.png"))):
        (dst / f"img{i:03d}.png").write_bytes(f.read_bytes())
    return dst


def test_prepare_with_only_unlabelled_val_images_measures_agreement(tmp_path, images):
    model = tiny_cnn(tmp_path / "m.onnx", hw=(32, 32))
    flat = _flat_copy(images / "val", tmp_path / "unlabelled")
    for labels in (CLASSES, ()):  # with class names for results, or none
        out = tmp_path / f"out{len(labels)}"
        doc = prepare(model, None, flat, out, _opts(labels=labels))
        assert [v["name"] for v in doc["variants"]] == ["fp32", "fp16", "int8", "fp32-r24"]
        assert doc["failed"] == [] and doc["accuracy_basis"] == "agreement"
        man = load_manifest(out)
        assert man.eval_images == 40 and man.labels == labels
        assert man.variant("fp32").accuracy == 1.0
        files = list_images(flat, 100)
        frames = [read_image(f) for f in files]
        outs = {}
        for v in man.variants:
            sess = ort.InferenceSession(str(verify(man, v)), providers=["CPUExecutionProvider"])
            outs[v.name] = np.concatenate([sess.run(None, {v.input_name: man.preprocess.apply(
                f, v.input_shape)})[0] for f in frames]).argmax(1)
            assert v.accuracy == v.agreement == pytest.approx(
                float((outs[v.name] == outs["fp32"]).mean()))


def test_prepare_with_no_images_makes_fp16_on_generated_inputs_and_says_why_not_int8(tmp_path):
    from runtime.engine.prepare import generated_frames

    model = tiny_cnn(tmp_path / "m.onnx", hw=(32, 32))
    doc = prepare(model, None, None, tmp_path / "out", _opts(labels=()))
    assert [v["name"] for v in doc["variants"]] == ["fp32", "fp16"]
    assert doc["accuracy_basis"] == "agreement-generated" and doc["eval_images"] == 64
    failed = {f["variant"]: f for f in doc["failed"]}
    assert set(failed) == {"int8", "reduced"} and all(f["skipped"] for f in failed.values())
    assert "no images to calibrate on" in failed["int8"]["error"]
    assert not (tmp_path / "out" / "int8.onnx").exists()
    man = load_manifest(tmp_path / "out")
    frames = generated_frames((32, 32), 64)
    x = [man.preprocess.apply(f, (1, 3, 32, 32)) for f in frames]
    tops = {}
    for v in man.variants:
        sess = ort.InferenceSession(str(verify(man, v)), providers=["CPUExecutionProvider"])
        tops[v.name] = np.array([sess.run(None, {"x": t})[0].argmax() for t in x])
    assert len(set(tops["fp32"])) > 1  # the inputs move the model: agreement means something
    assert man.variant("fp16").agreement == pytest.approx(
        float((tops["fp16"] == tops["fp32"]).mean()))


SHUFFLENET = Path(onnx.__file__).parent / "backend/test/data/light/light_shufflenet.onnx"


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "runtime.cli", "models", "prepare",
                           *map(str, args)], capture_output=True, text=True, check=False,
                          timeout=300)


@pytest.mark.skipif(not SHUFFLENET.exists(), reason="onnx package without its test models")
def test_prepare_failure_on_a_real_opset9_model_is_one_error_line(tmp_path):
    r = _cli(SHUFFLENET, "--out", tmp_path / "out")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if "ERROR" in ln]
    assert len(errors) == 1
    assert errors[0].startswith(f"edgerun models prepare: ERROR: {SHUFFLENET}: step normalise: "
                                "opset 9 is too old")


def test_prepare_cli_errors_name_the_model_and_the_step(tmp_path, images):
    dyn = tiny_cnn(tmp_path / "dyn.onnx", hw=("H", "W"))
    r = _cli(dyn, "--out", tmp_path / "a")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"ERROR: {dyn}: step normalise: {dyn}: input 'x' has dynamic dimensions" in r.stderr
    r = _cli(dyn, "--val", tmp_path / "nowhere", "--out", tmp_path / "b")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"ERROR: {dyn}: step images: {tmp_path / 'nowhere'}: not a directory" in r.stderr
    r = _cli(dyn, "--input-shape", "1,3,32,32", "--out", tmp_path / "c")
    assert r.returncode == 0, r.stderr
    assert "SKIPPED dyn.onnx int8 (step int8): skipped: no images to calibrate on" in r.stdout
    assert "accuracy basis: agreement-generated" in r.stdout


@pytest.mark.parametrize("hw, sizes, want", [
    ((96, 96), (48, 80, 64), [(80, 80), (64, 64), (48, 48)]),  # largest first
    ((96, 96), (64, 64), [(64, 64)]),  # a repeated size once
    ((96, 128), (48,), [(48, 64)]),  # the width keeps the aspect ratio, to a multiple of 8
    ((32, 32), (24,), [(24, 24)]),
])
def test_sizes_become_reduced_inputs(hw, sizes, want):
    from runtime.engine.prepare import given_sizes

    assert given_sizes(hw, sizes) == want


@pytest.mark.parametrize("size", [96, 120, 8])
def test_a_size_that_reduces_nothing_is_refused(size):
    from runtime.engine.prepare import StepError, given_sizes

    with pytest.raises(StepError, match=f"--sizes {size}: a reduced input must be"):
        given_sizes((96, 96), (size,))


def test_sizes_make_one_classifier_rung_per_resolution(tmp_path, images):
    model = tiny_cnn(tmp_path / "m.onnx", hw=(32, 32))
    doc = prepare(model, images / "calib", images / "val", tmp_path / "out",
                  _opts(sizes=(16, 24), min_accuracy_ratio=0.0))
    names = [v["name"] for v in doc["variants"]]
    assert names == ["fp32", "fp16", "int8", "fp32-r24", "fp32-r16"], doc["failed"]
    man = load_manifest(tmp_path / "out")
    assert man.variant("fp32-r16").input_shape == (1, 3, 16, 16)
    assert all(v.accuracy is not None for v in man.variants)


def test_cli_sizes_refuses_a_size_below_16(tmp_path):
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "models", "prepare",
                        str(tmp_path / "m.onnx"), "--out", str(tmp_path / "o"), "--sizes",
                        "64,8"], capture_output=True, text=True)
    assert r.returncode == 2 and "every size must be at least 16" in r.stderr, r.stderr
