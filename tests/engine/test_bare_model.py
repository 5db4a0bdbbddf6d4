"""A bare .onnx as `[model] path`: one fp32 form, accuracy unknown, documented defaults; `check`
catches what `serve` would fail on; the real `serve` runs it end to end."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, save
from support.daemon_harness import Serve, last_health, results, write_config
from support.modelgen import tiny_cnn
from support.waiting import wait

from power.rungs import RATE_STEPS, budget_levels, select_for_budget
from runtime.choice.ladders import ladder_for
from runtime.choice.selector import Constraints, Profile
from runtime.engine.manifest import load_model, model_files, postprocess
from runtime.engine.onnx_model import ModelError

BOARD = Path(__file__).parents[1] / "fixtures/sysfs/x86-coretemp"


def _nhwc(path: Path) -> Path:
    """A one-op model with an NHWC image input [1, 24, 32, 3] and 3 outputs."""
    x = helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 24, 32, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])
    graph = helper.make_graph([helper.make_node("ReduceMean", ["img"], ["y"], axes=[1, 2],
                                                keepdims=0)], "nhwc", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    save(model, str(path))
    return path


def test_bare_onnx_is_one_fp32_form_of_unknown_accuracy_with_documented_defaults(tmp_path):
    m = load_model(tiny_cnn(tmp_path / "mine.onnx", classes=4))
    assert m.bare and m.root == tmp_path / "mine.onnx" and m.name == "mine"
    assert m.accuracy_basis == "unknown" and m.output == "scores"
    assert m.labels == ("class_0", "class_1", "class_2", "class_3")
    pre = m.preprocess
    assert (pre.layout, pre.colour, pre.resize) == ("NCHW", "RGB", "bilinear")
    assert pre.scale == pytest.approx(1 / 255) and pre.mean == (0, 0, 0) and pre.std == (1, 1, 1)
    (form,) = model_files(m)  # verified: the file's own sha256
    assert (form.precision, form.path, form.input_shape, form.accuracy) == (
        "fp32", tmp_path / "mine.onnx", (1, 3, 32, 32), None)
    # white pixels become 1.0, not ImageNet-normalised values
    x = pre.apply(np.full((50, 70, 3), 255, np.uint8), form.input_shape)
    assert x.shape == (1, 3, 32, 32) and np.allclose(x, 1.0)
    assert postprocess(np.array([[0.1, 0.2, 3.0, 0.4]], np.float32), m) == [("class_2", 3.0)]

    nhwc = load_model(_nhwc(tmp_path / "nhwc.onnx"), labels=("r", "g", "b"))
    assert nhwc.preprocess.layout == "NHWC" and nhwc.labels == ("r", "g", "b")
    assert nhwc.preprocess.apply(np.zeros((10, 10, 3), np.uint8), (1, 24, 32, 3)).shape == (
        1, 24, 32, 3)
    over = load_model(tmp_path / "mine.onnx", preprocess={"mean": [0.5] * 3, "std": [0.25] * 3},
                      output="logits")
    assert over.preprocess.mean == (0.5, 0.5, 0.5) and over.output == "logits"


@pytest.mark.parametrize(("make", "kwargs", "error"), [
    (lambda p: p, {}, "no such model file"),
    (lambda p: tiny_cnn(p, hw=("H", "W")), {}, "dynamic dimensions"),
    (lambda p: tiny_cnn(p, classes=4), {"labels": ("a", "b")}, "2 labels given but the output"),
    (lambda p: tiny_cnn(p), {"output": "boxes"}, "output must be one of"),
    (lambda p: tiny_cnn(p), {"preprocess": {"gamma": 2}}, "unknown key"),
    (lambda p: tiny_cnn(p), {"preprocess": {"layout": "NHWC"}}, "channels second"),
    (lambda p: tiny_cnn(p, hw=(3, 3)), {}, None),  # [N,3,3,3]: NCHW wins, no error
    (lambda p: (p.write_bytes(b"not onnx at all"), p)[1], {}, "not a valid ONNX model"),
])
def test_bare_onnx_problems_name_the_file(tmp_path, make, kwargs, error):
    path = make(tmp_path / "m.onnx")
    if error is None:
        assert load_model(path, **kwargs).preprocess.layout == "NCHW"
        return
    with pytest.raises(ModelError, match=error) as e:
        load_model(path, **kwargs)
    assert str(tmp_path / "m.onnx") in str(e.value)


def _ok(vid: str, energy: float, p95: float, precision: str = "fp32") -> Profile:
    return Profile(vid, "mine", precision, "onnxruntime", "CPU", 1, p50_ms=p95, p95_ms=p95,
                   p99_ms=p95, runs=30, energy_mj=energy, energy_source="rapl")


def test_one_rung_ladder_says_accuracy_unknown_and_the_governor_only_caps_the_rate():
    # Several engines/threads of the one fp32 file: all "1.0", so the ladder has one rung.
    profiles = [_ok("mine/fp32@onnxruntime:CPU/t1", 0.5, 2.0),
                _ok("mine/fp32@onnxruntime:CPU/t2", 0.7, 1.0),
                _ok("mine/fp16@openvino:CPU/t1", 0.2, 1.0, "fp16")]  # a hint: accuracy unknown
    rungs, reason = ladder_for(profiles, Constraints(latency_ms=10))
    assert [r.variant_id for r in rungs] == ["mine/fp32@onnxruntime:CPU/t1"]
    assert rungs[0].accuracy == 1.0
    assert "accuracy unknown" in reason and "only cap the frame rate" in reason
    levels = budget_levels(rungs, rate_hz=40, min_rate_hz=0.2)
    # full, the rate steps down to 1/8, minimum duty
    assert levels[0] == math.inf and len(levels) == 2 + len(RATE_STEPS)
    for budget in levels[1:]:  # every level below the top is a rate cap on the same rung
        rung, rate = select_for_budget(rungs, budget, 40)
        assert rung == 0 and rate < 40
    # a manifest's measured accuracy is not called unknown
    known = [Profile(**{**p.__dict__, "accuracy": 0.9}) for p in profiles[:2]]
    assert "accuracy unknown" not in ladder_for(known, Constraints(latency_ms=10))[1]


def _check(tmp_path: Path, model: str, extra: str = "") -> subprocess.CompletedProcess:
    cfg = tmp_path / "edgerun.toml"
    cfg.write_text(f'[device]\nsysfs_root = "{BOARD}"\n[model]\npath = "{model}"\n{extra}')
    return subprocess.run([sys.executable, "-m", "runtime.cli", "check", str(cfg)],
                          capture_output=True, text=True, check=False, timeout=120)


def test_check_catches_what_serve_would_fail_on(tmp_path):
    dyn = tiny_cnn(tmp_path / "dyn.onnx", hw=("H", "W"))
    r = _check(tmp_path, str(dyn))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"ERROR: model: {dyn}: input 'x' has dynamic dimensions" in r.stderr
    assert "config ok, model NOT ok" in r.stderr
    r = _check(tmp_path, str(dyn), "input_shape = [1, 3, 40, 40]\n")
    assert r.returncode == 0, r.stderr
    assert "a bare .onnx, one fp32 form, input [1, 3, 40, 40], accuracy unknown" in r.stderr
    r = _check(tmp_path, str(tmp_path / "gone.onnx"))
    assert r.returncode == 1 and "no such model file or directory" in r.stderr
    (tmp_path / "labels.txt").write_text("ok\nbad\n")
    r = _check(tmp_path, str(tiny_cnn(tmp_path / "five.onnx")),
               f'labels = "{tmp_path / "labels.txt"}"\n')
    assert r.returncode == 1 and "2 labels given but the output 'y' has 5 classes" in r.stderr


def test_serve_runs_a_bare_onnx_end_to_end(tmp_path):
    model = tiny_cnn(tmp_path / "mine.onnx", classes=3)
    (tmp_path / "labels.txt").write_text("good\nscratch\ndent\n")
    cfg = write_config(tmp_path, tmp_path / "cache",
                       extra=f'[model]\npath = "{model}"\nlabels = "{tmp_path / "labels.txt"}"\n')
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: len(results(d.outbox)) >= 20, 90, "20 results", d)
        wait(lambda: last_health(d.outbox) is not None, 30, "a health message", d)
        h = last_health(d.outbox)
        rs = results(d.outbox)
    finally:
        assert d.stop() == 0
    assert {r["label"] for r in rs} <= {"good", "scratch", "dent"}
    assert all(r["variant"].startswith("mine/fp32@onnxruntime") for r in rs)
    assert h["model"] == "mine" and h["rungs"] == 1
    assert "accuracy unknown" in h["choice_reason"]
    assert "only cap the frame rate" in h["choice_reason"]
    log = d.text()
    assert "is a bare .onnx (no manifest): profiled as one fp32 form" in log
    assert "manifest.json" not in log


@pytest.mark.parametrize("images", ["unlabelled", "none"])
def test_serve_runs_a_ladder_prepared_without_labelled_images(tmp_path, images):
    from models.synthetic import write_folder
    from runtime.engine.manifest import Preprocess
    from runtime.engine.prepare import PrepareOptions, prepare

    val = None
    if images == "unlabelled":
        write_folder(tmp_path / "shots", seed=4, count=12, size=32)  # folder names unused
        val = tmp_path / "shots"
    out = tmp_path / "mine"
    # random weights give one class for every image, a blind reference `prepare` refuses
    # (tests/engine/test_model_sanity.py); serving such a ladder is what this test is about
    doc = prepare(tiny_cnn(tmp_path / "mine.onnx", hw=(32, 32)), None, val, out,
                  PrepareOptions(name="mine", preprocess=Preprocess(), check_reference=False))
    want = {"unlabelled": ["fp32", "fp16", "int8", "fp32-r24"], "none": ["fp32", "fp16"]}
    assert [v["name"] for v in doc["variants"]] == want[images]
    cfg = write_config(tmp_path, tmp_path / "cache", extra=f'[model]\npath = "{out}"\n')
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: len(results(d.outbox)) >= 10, 90, "10 results", d)
        wait(lambda: last_health(d.outbox) is not None, 30, "a health message", d)
        h = last_health(d.outbox)
    finally:
        assert d.stop() == 0
    assert h["model"] == "mine" and "accuracy unknown" not in h["choice_reason"]
    assert all(r["variant"].startswith("mine/") for r in results(d.outbox))


def test_replayed_profiles_take_the_accuracy_of_the_model_now(tmp_path):
    # A recording made when the model had another accuracy (or none) must not carry it.
    import json
    from dataclasses import asdict

    from power.sensors import EstimatedMeter
    from runtime.choice.measure import measure_model
    from runtime.config import from_dict

    model = tiny_cnn(tmp_path / "mine.onnx")
    cfg = from_dict({"backends": {"enabled": ["onnxruntime"], "threads": [1],
                                  "onnxruntime": {"spinning": [False], "include_default": False}},
                     "profiler": {"idle_baseline_s": 0.05, "cache_dir": str(tmp_path / "c")}})
    backends = discover_backends(cfg)
    vid = "mine/fp32@onnxruntime:CPU/t1,opt=all"
    rec = tmp_path / "rec.json"
    rec.write_text(json.dumps({"variants": [asdict(_ok(vid, 0.4, 1.0)) | {"accuracy": 0.5}]}))
    m = measure_model(model, cfg, backends, EstimatedMeter(5.0, 2.0), "generic-x86", 2.0, None,
                      lambda *a: None, lambda *a: None, Constraints(latency_ms=10),
                      recorded=rec)
    assert [(p.variant_id, p.energy_mj, p.accuracy) for p in m.profiles] == [(vid, 0.4, None)]


def discover_backends(cfg):
    from runtime.engine.backends import discover

    return discover(cfg.backends)
