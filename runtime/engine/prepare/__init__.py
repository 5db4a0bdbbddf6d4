"""`edgerun models prepare`: turn an fp32 ONNX model into measured precision variants.

Steps, each reported by name when it fails:
1. normalise  — drop initializers listed as inputs, fix dynamic dims (batch -> 1, the rest from
                --input-shape), convert opsets older than 11 to 13, check, fold constants with
                ORT's basic level (standard ONNX ops only), so every later step starts clean;
2. fp16       — weights and math in fp16, inputs/outputs kept fp32 (ORT's converter);
3. int8       — static QDQ, per-channel weights, calibrated on --calib images; ORT's
                pre-processing (symbolic shape inference) is tried and skipped with a warning
                when it fails, as it does on many third-party graphs;
4. reduced    — the fp32 graph at 2/3 input resolution (folded at that size), when the graph
                runs at it (fully convolutional, reshapes from Shape ops or -1) and its output
                keeps its form: the same shape for a classifier; for a detector the same
                per-candidate rows, the candidate count may change. A graph that does not
                run at it (fixed reshape or anchor constants) is skipped, the failing node
                named;
5. measure    — every variant on the --val images against the fp32 outputs: top-1 agreement,
                max/mean absolute output difference, and accuracy against labels when given;
6. floor      — a variant whose accuracy is below --min-accuracy-ratio (default 0.5) x its
                fp32 form's is not written as a rung (listed as skipped, with both figures).
A failed variant is reported and skipped; the others are still written with the manifest.

Detectors (docs/detectors.md): the task and output form are declared (--task detect --format)
or read from the output's shape; variants are measured by mAP@0.5 against YOLO label files
beside the val images (`DIR/labels/x.txt` for `DIR/images/x.png`, or `x.txt` next to it), or,
without label files, by the mAP of each variant's detections against fp32's ("agreement";
fp32's at full resolution, for the reduced form too); boxes are normalised by each variant's
own input size. The manifest gets a `postprocess` section. A model with separate
boxes/scores/classes outputs (NMS inside) is merged to one `[1, K, 6]` output first.

Images are optional (docs/manifest.md "Without labelled images"): with only --val, int8 is
calibrated on the val images and accuracy is top-1 agreement with fp32; with no images at all,
only fp16 is made, measured on generated inputs (`accuracy_basis` "agreement-generated"), and
int8 and reduced are listed in `failed` as skipped, with the reason. A failure before any
variant exists (reading images, normalise, the fp32 reference) raises StepError naming the
step; the CLI prints it as one error line naming the model.

The modules, one job each: `run.py` (`prepare()`), `steps.py` (the steps over one `Run`,
`state.py`), `export.py` (1), `quantise.py` (2, 3), `reduced.py` (4), `measure.py` (5),
`write.py` (the eval set, the manifest, the move into place), `images.py` (images and their
labels), `options.py`, `errors.py`, `session.py`.
"""

from runtime.engine.prepare.errors import Skipped, StepError
from runtime.engine.prepare.export import merge_nms_outputs, normalise
from runtime.engine.prepare.images import (
    IMAGE_EXT,
    detector_truth,
    generated_frames,
    label_file,
    list_images,
    read_image,
)
from runtime.engine.prepare.measure import measure, measure_detector
from runtime.engine.prepare.options import MIN_ACCURACY_RATIO, PrepareOptions, below_floor
from runtime.engine.prepare.quantise import int8_base, make_fp16, make_int8, quantize_to
from runtime.engine.prepare.reduced import (
    DETECTOR_SCALES,
    detector_sizes,
    given_sizes,
    make_reduced,
    reduced_hw,
)
from runtime.engine.prepare.run import prepare
from runtime.engine.prepare.write import EVAL_IMAGES

__all__ = ["DETECTOR_SCALES", "EVAL_IMAGES", "IMAGE_EXT", "MIN_ACCURACY_RATIO", "PrepareOptions",
           "Skipped", "StepError", "below_floor", "detector_sizes", "detector_truth",
           "generated_frames", "given_sizes", "int8_base", "label_file", "list_images",
           "make_fp16", "make_int8", "make_reduced", "measure", "measure_detector",
           "merge_nms_outputs", "normalise", "prepare", "quantize_to", "read_image",
           "reduced_hw"]
