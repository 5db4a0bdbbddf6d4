"""`models prepare` on a real third-party trained model: PP-OCR's text-direction classifier.

The model ships inside the `rapidocr_onnxruntime` wheel on PyPI
(rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx, 0.6 MB, MobileNetV3-style,
exported from PaddlePaddle: opset 11, input [-1,3,?,?] with symbolic H and W, output [-1,2]:
text upright (0) or upside down (180)). This script downloads the wheel (pip), extracts the
model, draws labelled text-line images with OpenCV (random words, fonts, sizes, noise;
label 180 = the same line rotated by 180 degrees), and runs the ladder builder with the
preprocessing PaddleOCR documents for it (BGR, /255, mean 0.5, std 0.5, 48x192).

Usage: python bench/third_party_ladder.py [--work build/ppocr-cls]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from pathlib import Path

import cv2
import numpy as np

MEMBER = "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"
WORDS = ("invoice", "total", "amount", "serial", "batch", "lot", "expiry", "date", "part",
         "number", "inspection", "passed", "failed", "line", "station", "operator", "shift",
         "torque", "pressure", "2026", "0417", "A7-33", "QC", "OK")


def fetch_model(work: Path) -> Path:
    """The classifier from the rapidocr wheel (downloaded once with pip)."""
    out = work / "ppocr_cls.onnx"
    if out.exists():
        return out
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                    "rapidocr_onnxruntime==1.4.4", "-d", str(work)], check=True)
    wheel = next(work.glob("rapidocr_onnxruntime-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        out.write_bytes(z.read(MEMBER))
    return out


def text_lines(root: Path, count: int, seed: int) -> None:
    """Labelled text-line crops: root/0/*.png upright, root/180/*.png upside down."""
    rng = np.random.default_rng(seed)
    fonts = [cv2.FONT_HERSHEY_SIMPLEX, cv2.FONT_HERSHEY_DUPLEX, cv2.FONT_HERSHEY_COMPLEX,
             cv2.FONT_HERSHEY_TRIPLEX, cv2.FONT_HERSHEY_PLAIN]
    for i in range(count):
        text = " ".join(rng.choice(WORDS, int(rng.integers(2, 5))))
        font = fonts[int(rng.integers(len(fonts)))]
        scale = float(rng.uniform(0.8, 1.3))
        thick = int(rng.integers(1, 3))
        (w, h), base = cv2.getTextSize(text, font, scale, thick)
        bg = int(rng.integers(170, 256))
        img = np.full((h + base + 12, w + 16, 3), bg, np.uint8)
        ink = int(rng.integers(0, 80))
        cv2.putText(img, text, (8, h + 6), font, scale, (ink, ink, ink), thick, cv2.LINE_AA)
        img = np.clip(img + rng.normal(0, 6, img.shape), 0, 255).astype(np.uint8)
        label = "180" if i % 2 else "0"
        if label == "180":
            img = cv2.rotate(img, cv2.ROTATE_180)
        d = root / label
        d.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(d / f"{i:04d}.png"), img)


def main() -> None:
    """Fetch, make data, prepare; the ladder table is printed by `models prepare`."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("build/ppocr-cls"))
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    model = fetch_model(a.work)
    for name, n, seed in (("calib", 100, 1), ("val", 400, 2)):
        if not (a.work / name).exists():
            text_lines(a.work / name, n, seed)
    (a.work / "labels.txt").write_text("0\n180\n")
    (a.work / "preprocess.json").write_text(
        '{"layout": "NCHW", "colour": "BGR", "resize": "bilinear", "scale": 0.00392156862745098,'
        ' "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}')
    subprocess.run([sys.executable, "-m", "runtime.cli", "models", "prepare", str(model),
                    "--calib", str(a.work / "calib"), "--val", str(a.work / "val"),
                    "--labels", str(a.work / "labels.txt"), "--input-shape", "1,3,48,192",
                    "--preprocess", str(a.work / "preprocess.json"), "--name", "ppocr-cls",
                    "--out", str(a.work / "ladder")], check=True)


if __name__ == "__main__":
    main()
