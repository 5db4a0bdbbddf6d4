"""`edgerun models`: make a model's precision ladder (the bundle actions come from
runtime/cli_bundles.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runtime import cli_types
from runtime.cli_types import Subparsers


def cmd_models(args: argparse.Namespace) -> int:
    """Make a model's precision ladder (fp16, int8, reduced resolution) with measured accuracy.
    Every failure is one error line naming the model and the step (exit 2)."""
    if getattr(args, "ota", None):  # bundle / verify / install / ls (runtime/cli_bundles.py)
        return args.ota(args)
    from runtime.engine.manifest import Preprocess, read_labels, read_preprocess
    from runtime.engine.model_meta import describe
    from runtime.engine.onnx_model import ModelError
    from runtime.engine.prepare import PrepareOptions, StepError, prepare

    def error(step: str, message: str) -> int:
        print(f"edgerun models prepare: ERROR: {args.model}: step {step}: {message}",
              file=sys.stderr)
        return 2

    try:  # without --preprocess: the model's metadata, else the one default (prepare says)
        preprocess = Preprocess.from_dict(read_preprocess(args.preprocess), str(
            args.preprocess)) if args.preprocess else None
        labels = read_labels(args.labels) if args.labels else ()
    except (ModelError, TypeError) as e:
        return error("options", str(e))
    opts = PrepareOptions(name=args.name or args.out.name, preprocess=preprocess,
                          preprocess_source=f"file {args.preprocess}",
                          labels_source=f"file {args.labels}",
                          check_reference=not args.no_reference_check,
                          labels=labels, input_shape=args.input_shape or (), prefix=args.prefix,
                          output=args.output, reduced=not args.no_reduced,
                          sizes=tuple(args.sizes or ()), task=args.task,
                          format=args.format, score_threshold=args.score_threshold,
                          iou_threshold=args.iou_threshold,
                          **({} if args.min_accuracy_ratio is None else
                             {"min_accuracy_ratio": args.min_accuracy_ratio}))
    try:
        doc = prepare(args.model, args.calib, args.val, args.out, opts,
                      progress=lambda m: print(f"[{m}]", file=sys.stderr, flush=True))
    except StepError as e:
        return error(e.step, e.message)
    except (ValueError, OSError) as e:  # ModelError, or an unreadable --prefix manifest
        return error("manifest", str(e))
    print(f"{'VARIANT':<18} {'ACCURACY':>8} {'AGREE':>7} {'MAX|DIFF|':>10} {'KB':>7}")
    for v in doc["variants"]:
        diff = "-" if v["max_abs_diff"] is None else f"{v['max_abs_diff']:.2e}"
        print(f"{v['name']:<18} {v['accuracy']:>8.4f} {v['agreement']:>7.4f} "
              f"{diff:>10} {v['size_bytes'] / 1024:>7.1f}")
    for f in doc["failed"]:
        what = "SKIPPED" if f.get("skipped") else "FAILED"
        print(f"{what} {args.model.name} {f['variant']} (step {f['step']}): {f['error']}")
    basis = {"labels": "top-1 against the val images' folder names",
             "agreement": "top-1 agreement with fp32 on the val images",
             "agreement-generated": "top-1 agreement with fp32 on generated inputs, not images"}
    if "postprocess" in doc:  # a detector: accuracy is mAP@0.5 (docs/detectors.md)
        basis = {"labels": "mAP@0.5 against the label files",
                 "agreement": "mAP@0.5 against fp32's detections on the val images",
                 "agreement-generated": "mAP@0.5 against fp32's detections on generated "
                                        "inputs, not images"}
    made = doc.get("made_with", {})
    print(f"preprocess: {describe(doc['preprocess'])} (from {made.get('preprocess', '?')}); "
          f"labels: {len(doc['labels'])} (from {made.get('labels', '?')}); fp32 reference: "
          f"{made.get('reference', {}).get('seen', '?')}")
    print(f"manifest: {args.out / 'manifest.json'} (accuracy basis: {doc['accuracy_basis']}: "
          f"{basis.get(doc['accuracy_basis'], '')}, {doc['eval_images']} inputs)")
    return 0


def add_models(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    """`edgerun models prepare` here, the bundle actions from runtime/cli_bundles.py."""
    mo = sub.add_parser("models", help="model ladders", description=cmd_models.__doc__,
                        parents=[common])
    msub = mo.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    mp = msub.add_parser("prepare", help="make fp16/int8/reduced variants and a manifest",
                         parents=[common])
    mp.add_argument("model", type=Path, help="the fp32 .onnx model")
    mp.add_argument("--calib", type=Path, help="images for int8 calibration (default: the "
                    "--val images; without either, no int8)")
    mp.add_argument("--val", type=Path,
                    help="images to measure on: labelled (parent folder = label, with --labels) "
                    "or not (accuracy = agreement with fp32); none: fp16 only, on generated "
                    "inputs")
    mp.add_argument("--labels", type=Path, help="class names, one per line, in output order")
    mp.add_argument("--out", type=Path, required=True, help="output directory")
    mp.add_argument("--name", help="model name (default: the output directory's name)")
    mp.add_argument("--prefix", default="",
                    help="add this model's variants to the manifest in --out as PREFIX-...")
    mp.add_argument("--input-shape", type=cli_types.shape,
                    help="fix dynamic dims, e.g. 1,3,224,224")
    mp.add_argument("--preprocess", type=Path,
                    help="JSON with layout/colour/resize/scale/mean/std (default: what the "
                    "model's metadata says, else RGB pixels / 255, as for a bare .onnx)")
    mp.add_argument("--output", choices=("probabilities", "logits"), default="probabilities")
    mp.add_argument("--no-reduced", action="store_true", help="skip the reduced-resolution form")
    mp.add_argument("--sizes", type=cli_types.sizes, help="reduced-resolution forms at these "
                    "input heights, e.g. 80,64,48 (default: one at 2/3 for a classifier, "
                    "0.8/0.7/0.5 of the input for a detector)")
    mp.add_argument("--task", choices=("auto", "classify", "detect"), default="auto",
                    help="auto: from the output's shape (docs/detectors.md)")
    mp.add_argument("--format", choices=("auto", "yolov8", "yolov5", "nms-inside"),
                    default="auto", help="a detector's output form")
    mp.add_argument("--score-threshold", type=float, default=0.25, help="detector boxes kept")
    mp.add_argument("--iou-threshold", type=float, default=0.45, help="detector NMS overlap")
    mp.add_argument("--no-reference-check", action="store_true",
                    help="write the ladder even when the fp32 reference looks blind on the "
                    "val images (no boxes, one class, constant or NaN outputs)")
    mp.add_argument("--min-accuracy-ratio", type=cli_types.ratio, default=None,
                    help="a form measured below this x fp32's accuracy is not written as a "
                    "rung (default 0.5; 0 keeps every form)")
    from runtime.cli_bundles import add_parsers as ota_parsers

    ota_parsers(msub, common)
    mo.set_defaults(func=cmd_models)
