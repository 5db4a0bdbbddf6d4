"""A precision an engine applies itself (OpenVINO bf16/f16) is measured through that engine on
the ladder's eval images before the choice may use it; without images it is left out, saying
why (runtime/choice/hint_accuracy.py). Real OpenVINO and ONNX Runtime, real files."""

from __future__ import annotations

import logging
import weakref
from itertools import pairwise

import cv2
import numpy as np
import onnxruntime as ort
import openvino as ov
import pytest
from support.modelgen import tiny_cnn

from models.synthetic import write_folder
from runtime.choice import hint_accuracy
from runtime.choice.profiler import plan
from runtime.config import from_dict
from runtime.engine.backends import discover
from runtime.engine.manifest import Preprocess, load_manifest, load_model, model_files
from runtime.engine.prepare import PrepareOptions, prepare

PRE = Preprocess(mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))


def _cfg(tmp_path):
    return from_dict({"backends": {"enabled": ["onnxruntime", "openvino"], "threads": [1],
                                   "onnxruntime": {"spinning": [False],
                                                   "include_default": False},
                                   "openvino": {"precision_hints": ["f32", "bf16", "f16"]}},
                      "profiler": {"cache_dir": str(tmp_path / "cache")}})


def _caps() -> set[str]:
    return set(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def _lower_hints() -> list[str]:
    """The lower precision hints this CPU's OpenVINO plugin offers (bf16 first)."""
    caps = _caps()
    return [h for h, cap in (("bf16", "BF16"), ("f16", "FP16")) if cap in caps]


def _skip_without_a_lower_precision() -> None:
    """Skip, saying exactly why, where the path cannot run: OpenVINO's CPU plugin lists BF16
    only on x86 CPUs with AVX512_BF16 or AMX, FP16 only with AVX512_FP16/AMX-FP16 (x86) or
    ARMv8.2 half-precision arithmetic (a Pi 5's Cortex-A76 has it). Without either, the
    backend offers no lowered variant (backends/openvino.py keeps a hint only where the
    plugin lists its capability), so there is no engine-lowered precision to measure, and
    forcing a hint would measure one the plugin says it does not have."""
    if not _lower_hints():
        pytest.skip(f"this CPU's OpenVINO plugin offers neither BF16 nor FP16 "
                    f"(capabilities {sorted(_caps())}): no engine-lowered variant exists here "
                    "to measure (bf16 needs AVX512_BF16/AMX, f16 AVX512_FP16/AMX-FP16 or ARM "
                    "FP16)")


def _offset_logits(path, offset: float = 250.0):
    """tiny_cnn (seed 0) with `offset` added to every logit: the same softmax in fp32, but at
    250 bf16 keeps steps of 1-2, so the small differences between classes are rounded away
    (OpenVINO's bf16 agrees with fp32 on about a quarter of the images; f16, steps of 0.125,
    on more)."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(tiny_cnn(path, hw=(32, 32), seed=0)))
    for init in m.graph.initializer:
        if init.name == "fcb":
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) + offset, "fcb"))
    onnx.save(m, str(path))
    return path


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    """Unlabelled images (accuracy = agreement with fp32); the reference sees 3 classes."""
    root = tmp_path_factory.mktemp("hint")
    write_folder(root / "val", seed=2, count=24, size=32)
    prepare(_offset_logits(root / "m.onnx"), None, root / "val", root / "out",
            PrepareOptions(name="m", preprocess=PRE, reduced=False))
    return root / "out"


def _by_hand(m, entry, hint: str) -> float:
    """The variant's accuracy computed here: OpenVINO at `hint` on the eval images, against
    the labels or ORT's top-1, applied to the file's manifest accuracy."""
    with np.load(m.root / m.eval_sets["m.onnx"]["file"]) as z:
        data, off, truth = z["jpeg"], z["jpeg_offsets"], z.get("truth")
        images = [cv2.imdecode(data[a:b], cv2.IMREAD_COLOR) for a, b in pairwise(off)]
    x = [m.preprocess.apply(i, entry.input_shape) for i in images]
    compiled = ov.Core().compile_model(str(m.path(entry)), "CPU",
                                       {"INFERENCE_PRECISION_HINT": hint})
    hinted = np.array([int(np.argmax(compiled([t])[0])) for t in x])
    sess = ort.InferenceSession(str(m.path(entry)), providers=["CPUExecutionProvider"])
    ref = np.array([int(np.argmax(sess.run(None, {entry.input_name: t})[0])) for t in x])
    if truth is None:
        return entry.accuracy * float((hinted == ref).mean())
    return entry.accuracy * float((hinted == truth).mean()) / float((ref == truth).mean())


def test_engine_precisions_are_measured_through_the_engine_and_cached(tmp_path, ladder, caplog):
    _skip_without_a_lower_precision()
    cfg = _cfg(tmp_path)
    m = load_manifest(ladder)
    backends = discover(cfg.backends)
    work = plan(backends, model_files(m), (1,), cfg.backends)
    lowered = [v for _, _, v in work if hint_accuracy.lowering(v)]
    assert lowered, [v.id for _, _, v in work]
    with caplog.at_level(logging.INFO, "edgerun.measure"):
        kept = hint_accuracy.apply(work, m, cfg.profiler.cache_dir)
    assert len(kept) == len(work)  # every lowered variant was measured
    for _, _, v in kept:
        how = hint_accuracy.lowering(v)
        entry = m.variant(v.model.precision)
        if how is None:
            assert v.model.accuracy == entry.accuracy  # the file's own, untouched
        else:
            hint = v.option("precision")
            assert v.model.accuracy == pytest.approx(_by_hand(m, entry, hint)), v.id
    assert "measured through openvino on 24 eval images" in caplog.text
    if "BF16" in _caps():  # the measured figure is bf16's own, not fp32's copied
        (bf16,) = [v for _, _, v in kept if v.option("precision") == "bf16"]
        assert bf16.model.accuracy < 0.5 < m.variant("fp32").accuracy == 1.0
    assert list((tmp_path / "cache").glob("hint-*.json"))
    caplog.clear()
    with caplog.at_level(logging.INFO, "edgerun.measure"):  # the second time: from the cache
        again = hint_accuracy.apply(work, m, cfg.profiler.cache_dir)
    assert [v.model.accuracy for _, _, v in again] == [v.model.accuracy for _, _, v in kept]
    assert "measured through" not in caplog.text


def test_without_eval_images_engine_precisions_are_left_out_saying_why(tmp_path, caplog):
    _skip_without_a_lower_precision()
    cfg = _cfg(tmp_path)
    m = load_model(tiny_cnn(tmp_path / "bare.onnx", hw=(32, 32)))
    work = plan(discover(cfg.backends), model_files(m), (1,), cfg.backends)
    with caplog.at_level(logging.INFO, "edgerun.measure"):
        kept = hint_accuracy.apply(work, m, cfg.profiler.cache_dir)
    assert kept and all(hint_accuracy.lowering(v) is None for _, _, v in kept)
    assert len(kept) < len(work)
    lines = [r.getMessage() for r in caplog.records if "excluded from the choice" in
             r.getMessage()]
    assert lines and all("a bare .onnx has no validation images" in x for x in lines)
    assert len(lines) == len({hint_accuracy.lowering(v) for _, _, v in work} - {None})


@pytest.mark.parametrize("hint", ["bf16", "f16"])
def test_the_profile_command_uses_the_measured_accuracy(tmp_path, ladder, hint):
    """Through `edgerun profile`, with each lower precision the plugin offers (an ARM
    device's OpenVINO offers f16 alone)."""
    import json
    import subprocess
    import sys

    _skip_without_a_lower_precision()
    if hint not in _lower_hints():
        pytest.skip(f"this CPU's OpenVINO plugin offers {_lower_hints()}, not {hint} "
                    "(bf16 needs AVX512_BF16/AMX, f16 AVX512_FP16/AMX-FP16 or ARM FP16)")
    cfg = tmp_path / "e.toml"
    cfg.write_text(f'[profiler]\ncache_dir = "{tmp_path / "cache"}"\nmin_runs = 3\n'
                   'max_runs = 5\ntime_budget_s = 0.01\nwarmup_runs = 1\n'
                   'idle_baseline_s = 0.05\n[backends.openvino]\n'
                   f'precision_hints = ["f32", "{hint}"]\n')
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "profile", str(ladder), "--config",
                        str(cfg), "--engine", "openvino", "--threads", "1", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode in (0, 1), r.stderr
    rows = json.loads(r.stdout)["variants"]
    m = load_manifest(ladder)
    lowered = [p for p in rows if p["options"].get("precision") == hint]
    assert lowered
    for p in lowered:
        entry = m.variant("fp32")  # hints lower only the fp32 file
        assert p["accuracy"] == pytest.approx(_by_hand(m, entry, hint))
        # the hint's own figure, not fp32's 1.0 copied (on these images: bf16 0.25, f16 0.83)
        assert p["accuracy"] < (0.5 if hint == "bf16" else 1.0)


def test_a_signed_bundle_carries_the_eval_images(tmp_path, ladder):
    """A ladder shipped over the air keeps what its engines' own precisions are measured on."""
    from runtime.ota.bundle import make, unpack
    from runtime.wire.commands import generate_keypair, load_private_key, load_public_keys

    generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub")
    info = make(ladder, load_private_key(tmp_path / "k.pem"), tmp_path / "b.edgerun", "1")
    assert "eval.npz" in [f["name"] for f in info.files]
    unpack(tmp_path / "b.edgerun", tmp_path / "got", load_public_keys([str(tmp_path / "k.pub")]))
    got = load_manifest(tmp_path / "got")
    ev = hint_accuracy.load_eval(got, "m.onnx")
    assert not isinstance(ev, str) and len(ev.images) == 24


def test_the_eval_images_go_through_one_at_a_time(ladder, monkeypatch):
    """Each eval image is preprocessed, run and reduced to what its score needs (a top-1, or
    detections) before the next: the measurement's memory is one tensor and one output, not
    the whole set's (64 images of a 640 px detector are 300 MB of float32 inputs and as much
    again of outputs, held at once on a cold start's peak). Counted by weak references to
    every tensor preprocessing makes and every output an engine returns, through the real
    engines (the lowered variant's and ONNX Runtime's reference)."""
    _skip_without_a_lower_precision()
    m = load_manifest(ladder)
    cfg = _cfg(ladder)
    backends = discover(cfg.backends)
    b, v = next((b, v) for b, _, v in plan(backends, model_files(m), (1,), cfg.backends)
                if hint_accuracy.lowering(v))
    ev = hint_accuracy.load_eval(m, m.variants[0].source)
    tensors, outputs, most = [], [], {"tensors": 0, "outputs": 0, "runs": 0}

    def alive(refs):
        return sum(1 for r in refs if r() is not None)

    def ran(out):
        # at each run: the tensor it was given alive, and how many earlier outputs are
        most["tensors"] = max(most["tensors"], alive(tensors))
        most["outputs"] = max(most["outputs"], alive(outputs))
        most["runs"] += 1
        outputs.append(weakref.ref(out))
        return out

    apply = Preprocess.apply

    def preprocess(self, frames, shape):
        t = apply(self, frames, shape)
        tensors.append(weakref.ref(t))
        return t

    monkeypatch.setattr(Preprocess, "apply", preprocess)
    load = b.load

    def loaded(variant):
        s = load(variant)
        infer = s.infer
        s.infer = lambda x: ran(infer(x))
        return s

    monkeypatch.setattr(b, "load", loaded)

    class Reference(ort.InferenceSession):
        def run(self, names, feed, *args):
            outs = super().run(names, feed, *args)
            ran(outs[0])
            return outs

    monkeypatch.setattr(ort, "InferenceSession", Reference)
    got = hint_accuracy.measure(b, v, m, ev)
    assert got.accuracy is not None and got.images == len(ev.images) == 24
    assert most["runs"] == 2 * 24  # the variant's pass and the reference's
    assert most["tensors"] == 1, most
    assert most["outputs"] <= 1, most  # the one before, until the next takes its name
