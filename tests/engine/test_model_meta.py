"""What a model says about itself (ONNX metadata, Ultralytics' keys): one default
preprocessing for a bare and a prepared model, labels from the metadata, the choice printed
with where it came from, a blind reference refused, and metadata that lies caught."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
from support.modelgen import blob_frame, tiny_cnn
from support.ultralytics_export import ultralytics_detector

from runtime.engine.manifest import Preprocess, load_manifest, load_model
from runtime.engine.model_meta import (
    DEFAULT_PREPROCESS,
    ModelMeta,
    check_against,
    choose_labels,
    choose_preprocess,
    read_meta,
)
from runtime.engine.onnx_model import ModelError
from runtime.engine.prepare import PrepareOptions, StepError, prepare

IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


def _meta_model(tmp_path: Path, **props: str) -> onnx.ModelProto:
    m = onnx.load(str(tiny_cnn(tmp_path / "m.onnx", hw=(32, 32))))
    for k, v in props.items():
        p = m.metadata_props.add()
        p.key, p.value = k, v
    return m


@pytest.mark.parametrize("props, want", [
    ({}, ModelMeta()),
    ({"names": "{0: 'a', 1: 'b'}"}, ModelMeta()),  # names alone: no known exporter
    ({"names": "{0: 'a', 1: 'b'}", "stride": "32", "imgsz": "[320, 256]", "task": "detect"},
     ModelMeta("ultralytics", ("a", "b"), (320, 256), 32, "detect")),
    ({"names": "{1: 'b', 0: 'a'}", "author": "Ultralytics"},
     ModelMeta("ultralytics", ("a", "b"))),
    ({"names": "['a', 'b']", "imgsz": "640"}, ModelMeta("ultralytics", ("a", "b"), (640, 640))),
])
def test_metadata_is_read_by_ultralytics_convention(tmp_path, props, want):
    assert read_meta(_meta_model(tmp_path, **props), tmp_path / "m.onnx") == want


@pytest.mark.parametrize("props, key", [
    ({"names": "__import__('os').system('true')", "stride": "32"}, "'names' is not a Python "
                                                                   "literal"),
    ({"names": "{0: 'a', 2: 'b'}", "stride": "32"}, "'names' must map the indices 0..1"),
    ({"names": "{0: 1}", "stride": "32"}, "'names' must map"),
    ({"names": "{}", "stride": "32"}, "'names' must be a non-empty dict"),
    ({"names": "{0: 'a'}", "stride": "x"}, "'stride' must be an integer"),
    ({"names": "{0: 'a'}", "stride": "32", "imgsz": "[0, 3]"}, "'imgsz' must be [H, W]"),
    ({"names": "{0: 'a'}", "stride": "32", "imgsz": "[1, 2, 3]"}, "'imgsz' must be [H, W]"),
])
def test_metadata_that_does_not_parse_names_the_file_and_key(tmp_path, props, key):
    with pytest.raises(ModelError, match=r"m\.onnx: metadata " + key.replace("[", r"\[")
                       .replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")
                       .replace(".", r"\.")):
        read_meta(_meta_model(tmp_path, **props), tmp_path / "m.onnx")


def test_choices_say_where_they_came_from():
    yolo = ModelMeta("ultralytics", ("a",))
    assert choose_preprocess(None, "", ModelMeta()).source.startswith("default")
    assert choose_preprocess(None, "", yolo).source.startswith("metadata (ultralytics")
    given = choose_preprocess(IMAGENET, "file pre.json", yolo)
    assert given.source == "file pre.json" and given.value["mean"] == IMAGENET["mean"]
    assert choose_labels((), "x", yolo).value == ("a",)
    assert choose_labels(("z",), "file l.txt", yolo).source == "file l.txt"
    assert choose_labels((), "x", ModelMeta()).value == ()
    # one default: the bare-model default and a Preprocess nobody configured are the same
    assert Preprocess().to_dict() == Preprocess.from_dict(
        {**DEFAULT_PREPROCESS, "mean": [0, 0, 0], "std": [1, 1, 1]}, "x").to_dict()


def test_check_against_the_graph():
    meta = ModelMeta("ultralytics", ("a", "b"), (64, 64), 16, "detect")
    check_against(meta, Path("m.onnx"), (64, 64), 2)
    with pytest.raises(ModelError, match="'names' lists 2 classes but the output scores 3"):
        check_against(meta, Path("m.onnx"), (64, 64), 3)
    with pytest.raises(ModelError, match=r"'imgsz' \[64, 64\] is not the input's 32x32"):
        check_against(meta, Path("m.onnx"), (32, 32), 2)
    check_against(meta, Path("m.onnx"), (32, 32), 2, dynamic_hw=True)  # any size runs


def _shots(root: Path, n: int = 12) -> Path:
    """`n` unlabelled frames with 1-3 colour blobs each (what the detector finds)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    for i in range(n):
        cells = [(int(rng.integers(0, 4)), int(rng.integers(0, 4)), int(rng.integers(0, 3)))
                 for _ in range(int(rng.integers(1, 4)))]
        cv2.imwrite(str(root / f"{i:02d}.png"), blob_frame((64, 64), cells))
    return root


def test_a_bare_and_a_prepared_yolo_export_share_preprocessing_and_labels(tmp_path):
    model = ultralytics_detector(tmp_path / "y.onnx",
                                 names={0: "red", 1: "green", 2: "blue"})
    bare = load_model(model)  # dynamic H/W fixed from imgsz, task and names from metadata
    assert bare.detect is not None and bare.labels == ("red", "green", "blue")
    assert bare.variants[0].input_shape == (1, 3, 64, 64)
    assert bare.preprocess_source.startswith("metadata (ultralytics")
    assert bare.labels_source.startswith("metadata")
    doc = prepare(model, None, _shots(tmp_path / "shots"), tmp_path / "out",
                  PrepareOptions(name="y", reduced=False))
    m = load_manifest(tmp_path / "out")
    assert m.preprocess == bare.preprocess and m.labels == bare.labels
    assert doc["output"] == "detections" and m.detect is not None
    assert doc["made_with"]["preprocess"].startswith("metadata (ultralytics")
    assert doc["made_with"]["input_shape"] == "metadata imgsz [64, 64]"
    assert doc["made_with"]["reference"]["blind"] is False
    fp32 = m.variant("fp32")
    assert fp32.accuracy == 1.0 and m.accuracy_basis == "agreement"
    # the eval set engines measure their own precisions on
    assert m.eval_sets["y.onnx"]["images"] == 12 and (tmp_path / "out" / "eval.npz").exists()


def test_a_mis_normalised_detector_is_refused_naming_what_it_saw(tmp_path):
    model = ultralytics_detector(tmp_path / "y.onnx")
    shots = _shots(tmp_path / "shots")
    pre = tmp_path / "imagenet.json"
    pre.write_text(json.dumps(IMAGENET))
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "models", "prepare", str(model),
                        "--val", str(shots), "--out", str(out), "--preprocess", str(pre)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip().splitlines()[-1]
    assert f"ERROR: {model}: step reference" in err
    assert f"12 images in {shots}" in err and "boxes in 0 of 12 inputs" in err
    assert "mean [0.485, 0.456, 0.406]" in err and f"from file {pre}" in err
    assert not out.exists()  # nothing half-written
    ok = subprocess.run([sys.executable, "-m", "runtime.cli", "models", "prepare", str(model),
                         "--val", str(shots), "--out", str(out), "--no-reduced"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "preprocess: NCHW RGB, x/255, mean 0 std 1, bilinear (from metadata (ultralytics" \
        in ok.stdout
    assert "labels: 3 (from metadata" in ok.stdout and "boxes in 12 of 12" in ok.stdout


def test_check_prints_the_preprocessing_and_where_it_came_from(tmp_path):
    from support.daemon_harness import write_config

    model = ultralytics_detector(tmp_path / "y.onnx")
    cfg = write_config(tmp_path, tmp_path / "cache", extra=f'[model]\npath = "{model}"\n')
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "check", str(cfg)],
                       capture_output=True, text=True, timeout=60)
    assert "preprocess: NCHW RGB, x/255, mean 0 std 1, bilinear (from metadata (ultralytics" \
        in r.stderr
    assert "labels: 3 (from metadata (ultralytics 'names'))" in r.stderr


@pytest.mark.parametrize("kw, match", [
    ({"names": {0: "a", 1: "b"}}, "metadata 'names' lists 2 classes but the output scores 3"),
    ({"imgsz": "[32, 32]", "dynamic": False},
     r"metadata 'imgsz' \[32, 32\] is not the input's 64x64"),
    ({"task": "segment"}, "metadata 'task' is 'segment'"),
])
def test_metadata_that_lies_is_an_error_naming_file_and_key(tmp_path, kw, match):
    model = ultralytics_detector(tmp_path / "y.onnx", **kw)
    with pytest.raises(ModelError, match=match):
        load_model(model)
    with pytest.raises(ModelError, match=match):
        prepare(model, None, _shots(tmp_path / "shots"), tmp_path / "out",
                PrepareOptions(name="y", reduced=False))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("lines, word", [(["a", "b"], "too few"),
                                         (["a", "b", "c", "d"], "too many")])
def test_a_labels_file_of_the_wrong_length_names_the_file(tmp_path, lines, word):
    model = ultralytics_detector(tmp_path / "y.onnx")
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "models", "prepare", str(model),
                        "--val", str(_shots(tmp_path / "shots")), "--out", str(out),
                        "--labels", str(labels)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert (f"step options: file {labels}: {len(lines)} labels ({word}) but the output of "
            f"{model} scores 3 classes") in r.stderr
    assert not out.exists()


def test_unreadable_val_images_name_the_file_and_leave_out_alone(tmp_path):
    model = ultralytics_detector(tmp_path / "y.onnx")
    shots = _shots(tmp_path / "shots")
    (shots / "05.png").write_bytes(b"\x89PNG not really")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine\n")
    with pytest.raises(StepError, match=r"images: .*05\.png: not a readable image"):
        prepare(model, None, shots, out, PrepareOptions(name="y"))
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


def test_int8_runs_symbolic_shape_inference(tmp_path, caplog):
    """sympy is a dependency (issue 24: every int8 attempt warned that it was missing)."""
    import logging

    from models.synthetic import CLASSES, write_folder

    write_folder(tmp_path / "val", seed=2, count=10, size=32)
    with caplog.at_level(logging.WARNING):
        doc = prepare(tiny_cnn(tmp_path / "m.onnx", hw=(32, 32)), None, tmp_path / "val",
                      tmp_path / "out", PrepareOptions(name="m", labels=CLASSES,
                                                       reduced=False))
    assert "int8" in [v["name"] for v in doc["variants"]] + [f["variant"] for f in
                                                              doc["failed"]]
    assert "sympy" not in caplog.text and "symbolic shape inference" not in caplog.text
