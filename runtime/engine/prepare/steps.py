"""The steps of one preparation, in order, over a `Run`: normalise, preprocessing and
labels, the task, the fp32 reference, then each form made, measured and kept or skipped.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx

from runtime.engine import detection, model_meta
from runtime.engine.manifest import (
    MANIFEST,
    Preprocess,
    VariantEntry,
    _detector_classes,
    _layout,
    _output_dims,
    model_task,
)
from runtime.engine.onnx_model import ModelError, file_sha256, load_onnx
from runtime.engine.prepare.errors import Skipped, StepError, as_step
from runtime.engine.prepare.export import dynamic_hw, merge_nms_outputs, normalise
from runtime.engine.prepare.images import (
    class_truth,
    detector_truth,
    generated_frames,
    labels_against,
)
from runtime.engine.prepare.measure import judge_reference, measure, measure_detector
from runtime.engine.prepare.options import below_floor
from runtime.engine.prepare.quantise import int8_base, make_fp16, make_int8, quantize_to
from runtime.engine.prepare.reduced import detector_sizes, given_sizes, make_reduced
from runtime.engine.prepare.session import cpu_session
from runtime.engine.prepare.state import Run, metric

log = logging.getLogger("edgerun.ladder")


def step_normalise(run: Run) -> None:
    """Step 1: read the model's metadata and task, merge NMS-inside outputs, fix the input
    shape and write the clean fp32 graph."""
    model = run.model
    try:
        src = model
        proto0 = load_onnx(model)
        run.meta = model_meta.read_meta(proto0, model)
        task = model_meta.task_from_meta(run.meta, model, run.opts.task)
        outputs = _output_dims(proto0)
        if (len(outputs) > 1 and task != "classify"
                and run.opts.format in ("auto", "nms-inside")):
            src = run.scratch / "merged.onnx"
            used = merge_nms_outputs(model, src)
            log.warning("%s: %d outputs taken as a detector with NMS inside (boxes %s, scores "
                        "%s, classes %s): merged into one [1, K, 6] output", model.name,
                        len(outputs), *used)
            run.opts = replace(run.opts, format="nms-inside")
            task = "detect"
        run.opts = replace(run.opts, task=task)
        given_shape, run.shape_from = model_meta.default_input_shape(
            proto0, run.opts.input_shape, run.meta)
        run.input_name, run.shape, warnings = normalise(src, run.fp32, given_shape, run.staged)
        run.dynamic_hw = dynamic_hw(proto0)
    except Exception as e:
        raise as_step("normalise", e) from e
    for w in warnings:
        log.warning("%s: %s", model.name, w)
    if run.shape_from.startswith("metadata"):
        log.info("%s: input fixed at %s from its %s", model.name, list(run.shape),
                 run.shape_from)


def step_preprocess(run: Run, existing: dict | None, dest: Path) -> None:
    """Preprocessing and labels: given, else the model's metadata, else the one default;
    refused when they differ from the manifest added to."""
    model, opts = run.model, run.opts
    try:
        layout = _layout(run.shape, model)
        if opts.preprocess is None:
            chosen = model_meta.choose_preprocess(None, "", run.meta)
            pre = Preprocess.from_dict({**{k: list(v) if isinstance(v, tuple) else v
                                           for k, v in chosen.value.items()},
                                        "layout": layout}, f"{model}: preprocess")
            run.pre_source = chosen.source
        else:
            pre, run.pre_source = opts.preprocess, opts.preprocess_source
        labels_chosen = model_meta.choose_labels(opts.labels, opts.labels_source, run.meta)
        labels, run.labels_source = labels_chosen.value, labels_chosen.source
    except ModelError as e:
        raise as_step("options", e) from e
    run.pre = pre
    run.opts = replace(opts, preprocess=pre, labels=labels)
    log.info("%s: preprocessing %s (from %s); labels: %s", model.name,
             model_meta.describe(pre.to_dict()), run.pre_source,
             f"{len(labels)} from {run.labels_source}" if labels else "none")
    if existing and existing["preprocess"] != pre.to_dict():
        raise ModelError(f"{dest / MANIFEST}: preprocessing differs from this model's "
                         f"({existing['preprocess']} vs {pre.to_dict()}); variants in one "
                         "manifest must share it")


def step_task(run: Run) -> None:
    """Classifier or detector: declared, or read from the output's real shape; the labels and
    the metadata checked against the output; the val images' labels read."""
    model, opts, labels = run.model, run.opts, run.opts.labels
    try:
        probe = cpu_session(run.fp32)
        out_shape = probe.run(None, {run.input_name: np.zeros(run.shape, np.float32)})[0].shape
        dims = [(probe.get_outputs()[0].name, tuple(out_shape))]
        fmt = model_task(model, dims, opts.task, opts.format, labels)
        run.spec = None if fmt is None else detection.DetectSpec.from_dict(
            {"task": "detect", "format": fmt, "score_threshold": opts.score_threshold,
             "iou_threshold": opts.iou_threshold}, f"{model}: options")
        classes = (int(np.prod(out_shape[1:])) if fmt is None else
                   _detector_classes(fmt, tuple(out_shape), labels))
        if run.labels_source.startswith("metadata"):
            model_meta.check_against(run.meta, model, run.hw, classes, run.dynamic_hw)
        else:
            model_meta.check_against(replace(run.meta, names=None), model, run.hw, classes,
                                     run.dynamic_hw)
            labels_against(labels, run.labels_source, classes, model)
    except StepError:
        raise
    except Exception as e:
        raise as_step("task", e) from e
    run.out_shape = tuple(out_shape)
    try:  # labels: folder names for a classifier, YOLO label files for a detector
        run.truth = class_truth(run.val_files, labels) if run.spec is None else None
        run.det_truth = detector_truth(run.val_files, len(labels) or None) if (
            run.spec is not None) else None
    except Exception as e:
        raise as_step("images", e) from e
    if run.spec is not None and run.spec.format != "nms-inside":
        run.n_classes = len(labels) or None
        log.info("%s: a %s detector, output %s; measured by mAP@0.5 %s", model.name,
                 run.spec.format, list(out_shape), "against the label files" if run.det_truth
                 is not None else "against fp32's detections")


def step_reference(run: Run, val: Path | None) -> None:
    """The fp32 reference's outputs on the val images (generated inputs without any), and
    its verdict: a blind reference is refused unless the images are labelled or the check
    is off (runtime/engine/sanity.py)."""
    model, pre = run.model, run.pre
    run.generated = not run.val_images
    if run.generated:
        run.val_images = generated_frames(run.hw, run.opts.generated)
        log.warning("%s: no images: only fp16 is made, measured against fp32 on %d generated "
                    "inputs; give --val DIR (unlabelled is fine) for int8 and a measured "
                    "agreement", model.name, len(run.val_images))
    try:
        run.full = run.tensors(run.shape)
        ref_sess = cpu_session(run.fp32)
        raw = [ref_sess.run(None, {run.input_name: t})[0] for t in run.full]
        run.ref = np.concatenate([r.reshape(1, -1) for r in raw]).astype(np.float64)
        run.ref_dets = [] if run.spec is None else [
            detection.detect(r, run.spec, run.hw, run.n_classes) for r in raw]
    except Exception as e:
        raise as_step("measure", e) from e
    verdict = judge_reference(raw, run.ref, run.ref_dets if run.spec is not None else None,
                              run.generated)
    run.verdict = verdict
    where = (f"{len(run.val_images)} "
             f"{'generated inputs' if run.generated else f'images in {val}'}")
    if not verdict.blind:
        log.info("%s: fp32 reference on %s: %s", model.name, where, verdict.seen)
        return
    what = (f"the fp32 reference looks blind on {where}: {verdict.seen} (preprocessing "
            f"{model_meta.describe(pre.to_dict())}, from {run.pre_source})")
    if run.labelled and verdict.kind in ("no-boxes", "one-class"):
        log.warning("%s: %s; the images are labelled, so the accuracy below is the real "
                    "one against the labels", model.name, what)
    elif run.opts.check_reference or verdict.kind == "non-finite":
        # NaN or Inf is never a model to ship: agreement between two NaN outputs read as
        # 1.0, and an outside run signed and deployed such a bundle (2026-12-07)
        raise StepError("reference", f"{what}: agreement with it would mean nothing. Check "
                        "the preprocessing (--preprocess) and the images; with labels the "
                        "real accuracy is measured instead; --no-reference-check writes "
                        "the ladder anyway")
    else:
        log.warning("%s: %s; written anyway (--no-reference-check)", model.name, what)


def add_variant(run: Run, name: str, step: str, precision: str, path: Path,
                shape: tuple[int, ...], inputs: list[np.ndarray],
                progress: Callable[[str], None]) -> None:
    """Step 5 and 6 for one variant: measure it; keep it as a rung, or list it as skipped
    (and delete its file) when it falls below the accuracy floor."""
    progress(f"measure {name}")
    m = measure(path, run.input_name, inputs, run.ref, run.truth) if run.spec is None else \
        measure_detector(path, run.input_name, inputs, run.ref, run.ref_dets, run.det_truth,
                         run.spec, run.pre.hw(shape), run.n_classes,
                         other_resolution=tuple(shape) != tuple(run.shape))
    diff = "n/a (other resolution)" if m["max_abs_diff"] is None else \
        f"{m['max_abs_diff']:.2e}"
    log.info("%s: accuracy %.4f, agreement %.4f, max |diff| %s", name, m["accuracy"],
             m["agreement"], diff)
    entries, opts = run.entries, run.opts
    floor = None if not entries else below_floor(m["accuracy"], entries[0].accuracy,
                                                 opts.min_accuracy_ratio)
    if floor is not None:  # mostly wrong results: not a rung the governor may step to
        why = (f"skipped: {metric(run)} {m['accuracy']:.4f} is below the floor {floor:.4f} "
               f"({opts.min_accuracy_ratio:g} x fp32's {entries[0].accuracy:.4f}, "
               "--min-accuracy-ratio): not written as a rung")
        log.warning("%s: variant %s %s", run.model.name, name, why)
        run.failed.append({"variant": name, "step": step, "error": why, "skipped": True,
                           "accuracy": m["accuracy"], "floor": floor})
        path.unlink(missing_ok=True)
        return
    entries.append(VariantEntry(name=name, precision=precision, file=path.name,
                                sha256=file_sha256(path), input_name=run.input_name,
                                input_shape=tuple(shape), size_bytes=path.stat().st_size,
                                source=run.model.name, **m))


def _make_int8(run: Run, p: Path) -> tuple[tuple[int, ...], list[str]]:
    """Step 3: a classifier's static QDQ int8; a detector's with its box decoding left in
    float as far as measurement says it must be (runtime/engine/int8_search.py)."""
    if run.spec is None:
        return run.shape, make_int8(run.staged, p, run.calib_batches, run.input_name)
    from runtime.engine import int8_search

    spec = run.spec
    base = run.scratch / "int8-base.onnx"
    warns = int8_base(run.staged, base)
    tail, head = int8_search.decode_tail(onnx.load(str(base)))
    cands = run.scratch / "int8"
    cands.mkdir(exist_ok=True)

    def acc(path: Path) -> float:
        return measure_detector(path, run.input_name, run.full, run.ref, run.ref_dets,
                                run.det_truth, spec, run.hw, run.n_classes)["accuracy"]

    best, tried = int8_search.search(
        lambda dst, nodes, method: quantize_to(base, dst, run.calib_batches, run.input_name,
                                               nodes, method),
        acc, tail, head, run.entries[0].accuracy, cands,
        log=lambda m: log.info("%s: %s", run.model.name, m))
    run.search_log.extend(c.to_dict() for c in tried)
    if best is None:
        raise StepError("int8", "every int8 candidate failed: " + "; ".join(
            f"{c.exclude}/{c.method}: {c.error}" for c in tried))
    shutil.copy(best, p)
    return run.shape, warns


def _variant_steps(run: Run) -> list[tuple[str, str, Callable]]:
    """(step, precision, make) for every form after fp32: fp16, int8, then the reduced
    resolutions (several for a detector, or where --sizes asks; else one at 2/3)."""
    spec, pre, shape = run.spec, run.pre, run.shape

    def fp16(p: Path) -> tuple[tuple[int, ...], list[str]]:
        make_fp16(run.fp32, p)
        return shape, []

    # a detector: the candidate count may change, the form may not; YOLO-style graphs need a
    # multiple of their largest stride (32) to run at all
    hw = run.hw
    multiple = run.meta.stride or (32 if all(d % 32 == 0 for d in hw) and min(hw) >= 64
                                   else 8)

    def reduced(p: Path, size: tuple[int, int] | None = None
                ) -> tuple[tuple[int, ...], list[str]]:
        if spec is None:
            return make_reduced(run.staged, p, run.input_name, shape, pre, size=size), []
        return make_reduced(run.staged, p, run.input_name, shape, pre,
                            lambda a, b: detection.form_change(a, b, spec.format,
                                                               run.n_classes),
                            multiple, size), []

    steps: list[tuple[str, str, Callable]] = [
        ("fp16", "fp16", fp16), ("int8", "int8", lambda p: _make_int8(run, p))]
    sizes = (given_sizes(hw, run.opts.sizes, multiple) if run.opts.sizes else
             detector_sizes(hw, multiple) if spec is not None else [])
    if run.opts.reduced and sizes:
        # several resolutions, each a rung the governor can step to
        steps += [("reduced", "fp32-reduced", lambda p, sz=sz: reduced(p, sz))
                  for sz in sizes]
    elif run.opts.reduced:
        steps.append(("reduced", "fp32-reduced", reduced))
    return steps


def step_variants(run: Run, progress: Callable[[str], None]) -> None:
    """Steps 2-4 with 5-6 for each form: make it, measure it, keep it or list why not. One
    form failing never loses the others."""
    model, stem, out = run.model, run.stem, run.out
    blocked = False  # a graph that does not run at one reduced size runs at none
    skip = {}
    if not run.calib_files:
        skip["int8"] = "skipped: no images to calibrate on (give --calib DIR or --val DIR)"
    if not run.val_files:
        skip["reduced"] = ("skipped: no images to measure a lower resolution on (generated "
                           "inputs say nothing about detail lost; give --val DIR)")
    for step, precision, make in _variant_steps(run):
        if step == "reduced" and blocked:
            continue
        if step in skip:
            blocked = blocked or step == "reduced"  # said once for every size
            log.warning("%s: variant %s%s %s", model.name, stem, step, skip[step])
            run.failed.append({"variant": f"{stem}{step}", "step": step, "error": skip[step],
                               "skipped": True})
            continue
        progress(step)
        path = out / f"{stem}{step}.onnx"
        try:
            new_shape, warns = make(path)
            for w in warns:
                log.warning("%s: %s", model.name, w)
            name = f"{stem}{step}"
            if step == "reduced":
                name = f"{stem}fp32-r{run.pre.hw(new_shape)[0]}"
                path = path.rename(out / f"{name}.onnx")
            add_variant(run, name, step, precision, path, new_shape,
                        run.tensors(new_shape) if new_shape != run.shape else run.full,
                        progress)
        except Skipped as e:  # not possible for this graph: said why, not an error
            blocked = blocked or "does not run at" in e.message or "already the smallest" \
                in e.message
            log.warning("%s: variant %s%s %s", model.name, stem, step, e.message)
            run.failed.append({"variant": f"{stem}{step}", "step": e.step, "error": e.message,
                               "skipped": True})
            path.unlink(missing_ok=True)
        except Exception as e:  # one variant failing must not lose the others
            err = e if isinstance(e, StepError) else StepError(
                step, str(e).splitlines()[0][:300] if str(e) else type(e).__name__)
            log.error("%s: variant %s%s failed at step %s: %s; the other variants are kept",
                      model.name, stem, step, err.step, err.message)
            run.failed.append({"variant": f"{stem}{step}", "step": err.step,
                               "error": str(err)})
            path.unlink(missing_ok=True)
