"""Rebuild the bundled `models/inspection/` from scratch: train, export, prepare the ladder.

    pip install '.[train]'
    python -m models.recipes.inspection.build [--work build/inspection] [--skip-train]

1. trains `base`, `small` and `large` (train.py; torch, CPU) unless --skip-train;
2. writes a calibration folder (training distribution) and a held-out test folder (its own
   seed, never used in training) of synthetic images;
3. runs `edgerun models prepare` for base (fp32, fp16, int8, reduced resolution) and adds the
   small and large models' variants to the same manifest.
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


def main() -> None:
    """Command line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("build/inspection"))
    ap.add_argument("--out", type=Path, default=bundled())
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--test-images", type=int, default=2000)
    a = ap.parse_args()
    py = sys.executable
    if not a.skip_train:
        subprocess.run([py, "-m", "models.recipes.inspection.train", "--out", str(a.work),
                        "--arch", "base", "--arch", "small", "--arch", "large"], check=True)
    data = a.work / "data"
    if data.exists():
        shutil.rmtree(data)
    write_folder(data / "calib", CALIB_SEED, 300)
    write_folder(data / "test", TEST_SEED, a.test_images)
    labels = a.work / "labels.txt"
    labels.write_text("\n".join(CLASSES) + "\n")
    if a.out.exists():
        for f in a.out.glob("*.onnx"):
            f.unlink()
        (a.out / "manifest.json").unlink(missing_ok=True)
    common = ["--calib", str(data / "calib"), "--val", str(data / "test"), "--labels",
              str(labels), "--out", str(a.out), "--name", "inspection"]
    for arch, extra in (("base", []), ("small", ["--prefix", "small", "--no-reduced"]),
                        ("large", ["--prefix", "large", "--no-reduced"])):
        subprocess.run([py, "-m", "runtime.cli", "models", "prepare",
                        str(a.work / f"{arch}.onnx"), "--preprocess",
                        str(a.work / f"{arch}.train.json"), *common, *extra], check=True)
        shutil.copy(a.work / f"{arch}.train.json", a.out / f"{arch}.train.json")


if __name__ == "__main__":
    main()
