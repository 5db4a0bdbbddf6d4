"""Rebuild the bundled `models/inspection/` from scratch: train, export, prepare the ladder.

    pip install '.[train]'
    python -m models.recipes.inspection.build [--work build/inspection] [--skip-train]

1. trains `mid` and `small` (train.py; torch, CPU) unless --skip-train;
2. writes a calibration folder (training distribution) and a held-out test folder (its own
   seed, never used in training) of synthetic images;
3. runs `edgerun models prepare` for mid (fp32, fp16, int8 and the reduced resolutions of
   --sizes: the rungs the governor steps down) and adds the small model's variants to the
   same manifest (the cheapest rung). `large` (train.py) is left out of the bundle: it is
   more accurate than mid by 0.004 for more energy, so no ladder used it, and it kept the
   bundle over 1.5 MB.
The data is synthetic (models/synthetic.py).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from models import bundled
from models.synthetic import CLASSES, write_folder

CALIB_SEED, TEST_SEED = 4000, 5000  # disjoint from train.py's SEEDS
# mid's reduced-resolution rungs. Multi-scale training keeps mid within 0.02 of its 96 px
# accuracy down to 64 px (train.json's test_accuracy_by_size: 0.994 at 80, 0.978 at 64): such
# a rung would be the selector's choice under its automatic floor (the best accuracy - 0.02)
# and the ladder below it would span under 2x. From 60 px down accuracy falls ~4 points per
# 4 px (0.967, 0.930, 0.874), and at 48 px it drops to 0.70 (worse and dearer than small).
SIZES = "60,56,52"


def main() -> None:
    """Command line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("build/inspection"))
    ap.add_argument("--out", type=Path, default=bundled())
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--test-images", type=int, default=2000)
    ap.add_argument("--sizes", default=SIZES, help="mid's reduced-resolution rungs")
    a = ap.parse_args()
    py = sys.executable
    if not a.skip_train:
        subprocess.run([py, "-m", "models.recipes.inspection.train", "--out", str(a.work),
                        "--arch", "mid", "--arch", "small"], check=True)
    data = a.work / "data"
    if data.exists():
        shutil.rmtree(data)
    write_folder(data / "calib", CALIB_SEED, 300)
    write_folder(data / "test", TEST_SEED, a.test_images)
    labels = a.work / "labels.txt"
    labels.write_text("\n".join(CLASSES) + "\n")
    if a.out.exists():
        for f in [*a.out.glob("*.onnx"), *a.out.glob("*.train.json"), *a.out.glob("*eval.npz")]:
            f.unlink()
        (a.out / "manifest.json").unlink(missing_ok=True)
    common = ["--calib", str(data / "calib"), "--val", str(data / "test"), "--labels",
              str(labels), "--out", str(a.out), "--name", "inspection"]
    for arch, extra in (("mid", ["--sizes", a.sizes]),
                        ("small", ["--prefix", "small", "--no-reduced"])):
        subprocess.run([py, "-m", "runtime.cli", "models", "prepare",
                        str(a.work / f"{arch}.onnx"), "--preprocess",
                        str(a.work / f"{arch}.train.json"), *common, *extra], check=True)
        shutil.copy(a.work / f"{arch}.train.json", a.out / f"{arch}.train.json")


if __name__ == "__main__":
    main()
