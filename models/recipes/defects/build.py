"""Rebuild the bundled `models/defects/` from scratch: train, export, prepare the ladder.

    pip install '.[train]'
    python -m models.recipes.defects.build [--work build/defects] [--skip-train]

1. trains the detector (train.py; torch, CPU, a few minutes on 2 cores) unless --skip-train;
2. writes a calibration folder (training distribution) and a held-out test folder (its own
   seed) of synthetic plates with YOLO label files (models/recipes/defects/data.py);
3. runs `edgerun models prepare --task detect --format yolov8`: fp32, fp16 and int8 rungs,
   each measured by mAP@0.5 against the test folder's label files.
The data is synthetic.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from models import bundled
from models.recipes.defects.data import CLASSES, write_folder
from models.recipes.defects.train import PREPROCESS

CALIB_SEED, TEST_SEED = 14000, 15000  # disjoint from train.py's SEEDS


def main() -> None:
    """Command line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("build/defects"))
    ap.add_argument("--out", type=Path, default=bundled("defects"))
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--test-images", type=int, default=1000)
    ap.add_argument("--reuse-data", action="store_true",
                    help="keep an existing WORK/data (same seeds: same images)")
    a = ap.parse_args()
    py = sys.executable
    if not a.skip_train:
        subprocess.run([py, "-m", "models.recipes.defects.train", "--out", str(a.work)],
                       check=True)
    data = a.work / "data"
    if not (a.reuse_data and data.exists()):
        if data.exists():
            shutil.rmtree(data)
        write_folder(data / "calib", CALIB_SEED, 300)
        write_folder(data / "test", TEST_SEED, a.test_images)
    labels = a.work / "labels.txt"
    labels.write_text("\n".join(CLASSES) + "\n")
    pre = a.work / "preprocess.json"
    pre.write_text(json.dumps(PREPROCESS) + "\n")
    if a.out.exists():
        for f in a.out.glob("*.onnx"):
            f.unlink()
        (a.out / "manifest.json").unlink(missing_ok=True)
    subprocess.run([py, "-m", "runtime.cli", "models", "prepare", str(a.work / "defects.onnx"),
                    "--preprocess", str(pre), "--calib", str(data / "calib"), "--val",
                    str(data / "test"), "--labels", str(labels), "--out",
                    str(a.out), "--name", "defects", "--task", "detect", "--format", "yolov8"],
                   check=True)
    shutil.copy(a.work / "defects.train.json", a.out / "defects.train.json")


if __name__ == "__main__":
    main()
