"""`prepare()`: the images read, the steps run in a scratch folder, the ladder moved into
place only once its manifest is whole.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from runtime.engine import model_meta
from runtime.engine.manifest import MANIFEST, load_manifest
from runtime.engine.onnx_model import ModelError
from runtime.engine.prepare.errors import as_step
from runtime.engine.prepare.images import list_images, read_image
from runtime.engine.prepare.options import PrepareOptions
from runtime.engine.prepare.state import Run
from runtime.engine.prepare.steps import (
    add_variant,
    step_normalise,
    step_preprocess,
    step_reference,
    step_task,
    step_variants,
)
from runtime.engine.prepare.write import manifest_doc, merge_existing, publish

log = logging.getLogger("edgerun.ladder")


def prepare(model: Path, calib: Path | None, val: Path | None, out: Path,
            opts: PrepareOptions, progress: Callable[[str], None] = lambda m: None) -> dict:
    """Run every step; write variants and the manifest into `out`; returns the manifest dict.
    `calib` and `val` are optional (the package doc, __init__.py). Every file is made in a
    scratch folder and moved into `out` only once the manifest is whole: a failure leaves `out`
    as it was.
    Raises StepError when no manifest can be made (its step named), ModelError for a bad
    `--prefix` manifest."""
    existing = None
    if opts.prefix and (out / MANIFEST).exists():
        try:
            existing = json.loads((out / MANIFEST).read_text())
        except (OSError, ValueError) as e:
            raise ModelError(f"{out / MANIFEST}: cannot read the manifest to add to: {e}") from e
    stem = f"{opts.prefix}-" if opts.prefix else ""
    try:
        val_files = list_images(val, opts.max_val) if val else []
        if calib:
            calib_files = list_images(calib, opts.max_calib)
        else:  # calibrating on what is measured flatters int8 a little; better than no int8
            calib_files = val_files[::max(1, len(val_files) // opts.max_calib)][:opts.max_calib]
            if calib_files:
                log.warning("%s: no --calib: int8 is calibrated on the --val images it is then "
                            "measured on", model.name)
        val_images = [read_image(f) for f in val_files]
    except Exception as e:
        raise as_step("images", e) from e
    work = tempfile.TemporaryDirectory(prefix="edgerun-prepare-")
    try:
        stage = Path(work.name) / "out"
        stage.mkdir()
        doc = _prepare(model, calib_files, val_files, val_images, stage, Path(work.name), opts,
                       existing, stem, progress, val, out)
        publish(stage, out)
    finally:
        work.cleanup()
    load_manifest(out)  # what we wrote must load
    return doc


def _prepare(model: Path, calib_files: list[Path], val_files: list[Path],
             val_images: list[np.ndarray], out: Path, scratch: Path, opts: PrepareOptions,
             existing: dict | None, stem: str, progress: Callable[[str], None],
             val: Path | None, dest: Path) -> dict:
    """prepare()'s steps, writing into the scratch folder `out` (`dest`: where it goes)."""
    run = Run(model, opts, out, scratch, stem, calib_files, val_files, val_images,
              fp32=out / f"{stem}fp32.onnx", staged=scratch / "staged.onnx")
    progress("normalise")
    step_normalise(run)
    step_preprocess(run, existing, dest)
    progress(f"preprocess {model_meta.describe(run.pre.to_dict())} (from {run.pre_source})")
    step_task(run)
    step_reference(run, val)
    add_variant(run, f"{stem}fp32", "fp32", "fp32", run.fp32, run.shape, run.full, progress)
    step_variants(run, progress)
    doc = manifest_doc(run)
    if existing:
        doc = merge_existing(doc, existing, run, dest)
    (out / MANIFEST).write_text(json.dumps(doc, indent=2) + "\n")
    return doc
