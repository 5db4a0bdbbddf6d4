"""Train the bundled inspection CNNs on the synthetic dataset and export fp32 ONNX.

Recipe, not runtime: needs torch (`pip install '.[train]'`, CPU build is enough). Deterministic
by seed up to torch's CPU kernels. Usage:

    python -m models.recipes.inspection.train --out build/inspection [--arch base|mid|large|small]

Writes `<out>/<arch>.onnx` (input `image` [1,3,S,S] float32 RGB normalised per PREPROCESS,
output `scores` [1,5] softmax probabilities) and `<out>/<arch>.train.json` (recipe settings and
held-out accuracy). The data is synthetic (models/synthetic.py); seeds for train/val/test differ.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from models.synthetic import CLASSES, dataset

# Declared preprocessing; copied verbatim into the manifest by `edgerun models prepare`.
PREPROCESS = {
    "layout": "NCHW",
    "colour": "RGB",
    "resize": "bilinear",
    "scale": 1 / 255,
    "mean": [0.5, 0.5, 0.5],
    "std": [0.25, 0.25, 0.25],
}
SEEDS = {"train": 1000, "val": 2000, "test": 3000}
# (stem width, block widths with stride, input size)
ARCHS = {
    "small": ([12], [(24, 2), (32, 2), (48, 2), (64, 1)], 64),
    "base": ([16], [(32, 2), (48, 2), (64, 1), (96, 2)], 96),
    "mid": ([24], [(40, 2), (64, 1), (96, 2), (128, 2), (192, 1)], 96),
    "large": ([32], [(48, 2), (64, 1), (96, 2), (128, 1), (160, 2)], 96),
}
# Multi-scale batches: (share of batches, sizes drawn from). `base` keeps its one reduced
# size (64). `mid` is the bundled ladder's model (issue 24): trained mostly at 96 and sometimes
# at 48-80, so every reduced-resolution rung `models prepare --sizes` makes stays useful and
# accuracy falls gradually with the input size instead of at a cliff (40 px, never seen in
# training, fell to 0.72).
MULTI_SCALE = {"base": (0.3, (64,)), "large": (0.3, (64,)),
               "mid": (0.35, (48, 56, 64, 72, 80))}


def _chunk(args: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    seed, count, size = args
    return dataset(seed, count, size)


def make_split(seed: int, count: int, size: int, workers: int, cache: Path) -> tuple:
    """Generate (or load from `cache`) a split: uint8 BGR images and labels."""
    path = cache / f"split-{seed}-{count}-{size}.npz"
    if path.exists():
        z = np.load(path)
        return z["x"], z["y"]
    parts = 16
    jobs = [(seed * 1000 + i, count // parts + (i < count % parts), size) for i in range(parts)]
    with ProcessPoolExecutor(workers) as pool:
        chunks = list(pool.map(_chunk, jobs))
    x = np.concatenate([c[0] for c in chunks])
    y = np.concatenate([c[1] for c in chunks])
    cache.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=x, y=y)
    return x, y


def to_tensor(images: np.ndarray, size: int) -> np.ndarray:
    """The manifest's preprocessing in numpy (BGR uint8 NHWC -> normalised RGB NCHW float32)."""
    import cv2

    if images.shape[1] != size:
        images = np.stack([cv2.resize(im, (size, size), interpolation=cv2.INTER_LINEAR)
                           for im in images])
    x = images[..., ::-1].astype(np.float32) * PREPROCESS["scale"]
    x = (x - np.array(PREPROCESS["mean"], np.float32)) / np.array(PREPROCESS["std"], np.float32)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def build(arch: str):
    """The torch module for `arch`: conv stem, depthwise-separable blocks, GAP, linear."""
    import torch.nn as nn

    stem, blocks, _ = ARCHS[arch]
    layers: list = [nn.Conv2d(3, stem[0], 3, 2, 1, bias=False), nn.BatchNorm2d(stem[0]),
                    nn.ReLU()]
    cin = stem[0]
    for cout, stride in blocks:
        layers += [
            nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin),
            nn.ReLU(),
            nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
        ]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.1), nn.Linear(cin, len(CLASSES))]
    return nn.Sequential(*layers)


def evaluate(model, x: np.ndarray, y: np.ndarray) -> float:
    """Top-1 accuracy of `model` on preprocessed `x`."""
    import torch

    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), 256):
            correct += int((model(torch.from_numpy(x[i:i + 256])).argmax(1).numpy()
                            == y[i:i + 256]).sum())
    return correct / len(x)


def train(arch: str, out: Path, n_train: int, epochs: int, seed: int, workers: int,
          cache: Path) -> dict:
    """Train one architecture, export ONNX, return the recipe record."""
    import torch
    import torch.nn as nn

    torch.manual_seed(seed)
    size = ARCHS[arch][2]
    t0 = time.time()
    xtr, ytr = make_split(SEEDS["train"], n_train, 96, workers, cache)
    xva, yva = make_split(SEEDS["val"], n_train // 6, 96, workers, cache)
    xte, yte = make_split(SEEDS["test"], n_train // 6, 96, workers, cache)
    gen_s = time.time() - t0
    xtr_t, xva_t, xte_t = (to_tensor(a, size) for a in (xtr, xva, xte))

    model = build(arch)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    steps = epochs * (len(xtr_t) // 64)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.05)
    rng = np.random.default_rng(seed)
    best, best_state, start, before_s = -1.0, None, 0, 0.0
    share, scales = MULTI_SCALE.get(arch, (0.0, ()))
    ckpt = cache / f"ckpt-{arch}-{seed}-{n_train}-{epochs}.pt"
    if ckpt.exists():  # resume: a long run on a busy machine survives being stopped
        c = torch.load(ckpt, weights_only=False)
        model.load_state_dict(c["model"])
        opt.load_state_dict(c["opt"])
        sched.load_state_dict(c["sched"])
        rng.bit_generator.state = c["rng"]
        torch.set_rng_state(c["torch_rng"])
        best, best_state, start = c["best"], c["best_state"], c["epoch"]
        before_s = c.get("train_s", 0.0)
        print(f"{arch}: resumed after epoch {start} (val {best:.4f})", flush=True)
    for epoch in range(start, epochs):
        model.train()
        order = rng.permutation(len(xtr_t))
        for i in range(0, len(order) - 63, 64):
            idx = order[i:i + 64]
            xb = torch.from_numpy(xtr_t[idx])
            if rng.random() < 0.5:  # flips are label-preserving for every class here
                xb = xb.flip(3)
            if scales and rng.random() < share:
                # Multi-scale: the reduced-resolution rungs made by `models prepare` then
                # keep most of the accuracy instead of being a different model.
                s = int(scales[rng.integers(len(scales))]) if len(scales) > 1 else scales[0]
                xb = torch.nn.functional.interpolate(xb, size=(s, s), mode="bilinear",
                                                     align_corners=False)
            opt.zero_grad()
            loss = loss_fn(model(xb), torch.from_numpy(ytr[idx]))
            loss.backward()
            opt.step()
            sched.step()
        acc = evaluate(model, xva_t, yva)
        print(f"{arch} epoch {epoch + 1}/{epochs} loss {loss.item():.3f} val {acc:.4f}", flush=True)
        if acc >= best:
            best, best_state = acc, {k: v.clone() for k, v in model.state_dict().items()}
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                    "sched": sched.state_dict(), "rng": rng.bit_generator.state,
                    "torch_rng": torch.get_rng_state(), "best": best,
                    "best_state": best_state, "epoch": epoch + 1,
                    "train_s": before_s + time.time() - t0 - gen_s}, ckpt)
    model.load_state_dict(best_state)
    test_acc = evaluate(model, xte_t, yte)
    # held-out accuracy at reduced sizes, every 4 px from 40 (the split resized as the
    # manifest's preprocessing would): which `--sizes` make a gradual ladder (build.py)
    by_size = {str(s): round(evaluate(model, to_tensor(xte, s), yte), 4)
               for s in range(size - 4, 39, -4)} if scales else {}

    out.mkdir(parents=True, exist_ok=True)
    onnx_path = out / f"{arch}.onnx"
    export = nn.Sequential(model, nn.Softmax(dim=1)).eval()
    torch.onnx.export(export, torch.zeros(1, 3, size, size), str(onnx_path),
                      input_names=["image"], output_names=["scores"], opset_version=17,
                      dynamo=False)
    record = {
        "arch": arch, "input_size": size, "train_images": n_train, "epochs": epochs,
        "seed": seed, "seeds": SEEDS, "val_accuracy": best, "test_accuracy": test_acc,
        "multi_scale": {"share": share, "sizes": list(scales)} if scales else None,
        "test_accuracy_by_size": by_size,
        "test_images": len(yte), "params": sum(p.numel() for p in model.parameters()),
        "data_generation_s": round(gen_s, 1),
        "train_s": round(before_s + time.time() - t0 - gen_s, 1),
        "torch": torch.__version__, "preprocess": PREPROCESS, "classes": list(CLASSES),
    }
    (out / f"{arch}.train.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record), flush=True)
    return record


def main() -> None:
    """Command line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--arch", choices=sorted(ARCHS), action="append")
    ap.add_argument("--train-images", type=int, default=12000)
    ap.add_argument("--epochs", type=int, default=14)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cache", type=Path, default=Path("build/dataset-cache"))
    a = ap.parse_args()
    for arch in a.arch or ["base"]:
        train(arch, a.out, a.train_images, a.epochs, a.seed, a.workers, a.cache)


if __name__ == "__main__":
    main()
