"""Train the bundled defect detector on synthetic plates and export it as a YOLOv8-style ONNX.

Recipe, not runtime: needs torch (`pip install '.[train]'`, the CPU build is enough). Usage:

    python -m models.recipes.defects.train --out build/defects

The network is deliberately tiny (minutes on 2 CPU cores): a stride-8 conv backbone and an
anchor-free head, one prediction per 8x8 cell (FCOS/YOLOv8 style: distances to the box's four
sides and one sigmoid score per class). The box decode is part of the exported graph, so the
ONNX output is what YOLOv8/v11 exports give: `[1, 4 + C, N]`, rows cx, cy, w, h in input
pixels then C class scores, N = (S/8)^2 candidates, no NMS (edgerun's manifest declares
`format: yolov8` and does the NMS). Writes `<out>/defects.onnx` and `<out>/defects.train.json`.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from models.recipes.defects.data import CLASSES, samples

PREPROCESS = {"layout": "NCHW", "colour": "RGB", "resize": "bilinear", "scale": 1 / 255,
              "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}
SEEDS = {"train": 11000, "val": 12000}  # build.py's calib/test seeds differ from both
SIZE, STRIDE, MAX_BOXES = 96, 8, 3


def _chunk(args: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    seed, count = args
    xs, bs = np.empty((count, SIZE, SIZE, 3), np.uint8), np.zeros((count, MAX_BOXES, 5),
                                                                  np.float32)
    bs[..., 0] = -1  # no box
    for i, s in enumerate(samples(seed, count, SIZE)):
        xs[i] = s.image
        bs[i, :len(s.boxes)] = s.boxes
    return xs, bs


def make_split(seed: int, count: int, workers: int) -> tuple[np.ndarray, np.ndarray]:
    """Images (N,S,S,3 uint8 BGR) and boxes (N, MAX_BOXES, 5; class -1 = none)."""
    parts = 8
    jobs = [(seed * 100 + i, count // parts + (i < count % parts)) for i in range(parts)]
    with ProcessPoolExecutor(workers) as pool:
        chunks = list(pool.map(_chunk, jobs))
    return np.concatenate([c[0] for c in chunks]), np.concatenate([c[1] for c in chunks])


def to_tensor(images: np.ndarray) -> np.ndarray:
    """The manifest's preprocessing in numpy (BGR uint8 NHWC -> normalised RGB NCHW)."""
    x = images[..., ::-1].astype(np.float32) * PREPROCESS["scale"]
    x = (x - np.array(PREPROCESS["mean"], np.float32)) / np.array(PREPROCESS["std"], np.float32)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def build():
    """The detector: backbone to stride 8, a shared 3x3 conv, then box (4) and class heads."""
    import torch
    import torch.nn as nn

    def cbr(cin: int, cout: int, stride: int = 1) -> list:
        return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    class Detector(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(*cbr(3, 16, 2), *cbr(16, 32, 2), *cbr(32, 32),
                                      *cbr(32, 64, 2), *cbr(64, 64), *cbr(64, 64), *cbr(64, 64))
            self.box = nn.Conv2d(64, 4, 1)
            self.cls = nn.Conv2d(64, len(CLASSES), 1)
            nn.init.constant_(self.cls.bias, -4.0)  # rare positives: start near "nothing"
            g = SIZE // STRIDE
            yy, xx = torch.meshgrid(torch.arange(g), torch.arange(g), indexing="ij")
            anchors = torch.stack([xx.flatten(), yy.flatten()], 0).float() * STRIDE + STRIDE / 2
            self.register_buffer("anchors", anchors)  # (2, N) cell centres in pixels

        def raw(self, x):
            """(ltrb distances in pixels (B,4,N), class logits (B,C,N))."""
            f = self.body(x)
            ltrb = nn.functional.softplus(self.box(f).flatten(2)) * STRIDE
            return ltrb, self.cls(f).flatten(2)

        def forward(self, x):
            ltrb, logits = self.raw(x)
            a = self.anchors.unsqueeze(0)
            x0y0, x1y1 = a - ltrb[:, :2], a + ltrb[:, 2:]
            return torch.cat([(x0y0 + x1y1) / 2, x1y1 - x0y0, logits.sigmoid()], 1)

    return Detector()


def _targets(boxes, anchors):
    """Per candidate: assigned box (xyxy px) and class (-1: background). A cell is positive
    for a box when its centre lies inside the box and within 1.5 cells of the box's centre, or
    is the cell nearest that centre (so a small defect always has one); the smallest box wins."""
    import torch

    cls = boxes[..., 0]
    cxcy, wh = boxes[..., 1:3] * SIZE, boxes[..., 3:5] * SIZE
    xyxy = torch.cat([cxcy - wh / 2, cxcy + wh / 2], -1)  # (B,M,4)
    ax, ay = anchors[0][None, None], anchors[1][None, None]  # (1,1,N)
    inside = ((ax > xyxy[..., 0:1]) & (ax < xyxy[..., 2:3]) & (ay > xyxy[..., 1:2])
              & (ay < xyxy[..., 3:4]))
    near = ((ax - cxcy[..., 0:1]).abs() < 1.5 * STRIDE) & ((ay - cxcy[..., 1:2]).abs()
                                                           < 1.5 * STRIDE)
    d2 = (ax - cxcy[..., 0:1]) ** 2 + (ay - cxcy[..., 1:2]) ** 2
    nearest = d2 == d2.min(-1, keepdim=True).values
    pos = ((inside & near) | nearest) & (cls >= 0)[..., None]
    area = torch.where(pos, (wh[..., 0] * wh[..., 1])[..., None], torch.full_like(d2, 1e9))
    best = area.argmin(1)  # (B,N)
    ok = area.min(1).values < 1e9
    tbox = torch.gather(xyxy, 1, best[..., None].expand(-1, -1, 4))
    tcls = torch.where(ok, torch.gather(cls, 1, best).long(), torch.full_like(best, -1))
    return tbox, tcls


def loss_fn(model, x, boxes):
    """Focal BCE on every candidate's class scores + GIoU on the positives' boxes."""
    import torch
    import torch.nn.functional as F

    ltrb, logits = model.raw(x)
    tbox, tcls = _targets(boxes, model.anchors)
    onehot = torch.zeros_like(logits)
    pos = tcls >= 0
    onehot.scatter_(1, tcls.clamp(min=0)[:, None], pos[:, None].float())
    p = logits.sigmoid()
    ce = F.binary_cross_entropy_with_logits(logits, onehot, reduction="none")
    w = (onehot - p).abs() ** 2  # focal weighting: easy background counts little
    n = pos.sum().clamp(min=1)
    cls_loss = (ce * w).sum() / n
    a = model.anchors[None]
    pb = torch.cat([a - ltrb[:, :2], a + ltrb[:, 2:]], 1).transpose(1, 2)[pos]  # (P,4)
    tb = tbox[pos]
    if len(tb) == 0:
        return cls_loss
    lt, rb = torch.max(pb[:, :2], tb[:, :2]), torch.min(pb[:, 2:], tb[:, 2:])
    inter = (rb - lt).clamp(min=0).prod(1)
    area = lambda b: (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])  # noqa: E731
    union = area(pb) + area(tb) - inter
    hull = (torch.max(pb[:, 2:], tb[:, 2:]) - torch.min(pb[:, :2], tb[:, :2])).prod(1)
    giou = inter / union - (hull - union) / hull
    return cls_loss + 2.0 * (1 - giou).mean()


def export(model, path: Path) -> None:
    """The model as ONNX (input `image` [1,3,S,S], output `detections` [1,4+C,N])."""
    import torch

    was = model.training
    model.eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(model, torch.zeros(1, 3, SIZE, SIZE), str(path), input_names=["image"],
                      output_names=["detections"], opset_version=17, dynamo=False)
    model.train(was)


def train(out: Path, n_train: int, epochs: int, seed: int, workers: int) -> dict:
    """Train, export ONNX, write the recipe record."""
    import torch

    torch.manual_seed(seed)
    torch.set_num_threads(workers)
    t0 = time.time()
    xtr, btr = make_split(SEEDS["train"], n_train, workers)
    xva, bva = make_split(SEEDS["val"], max(200, n_train // 10), workers)
    gen_s = time.time() - t0
    xtr_t, xva_t = to_tensor(xtr), to_tensor(xva)
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=4e-3, weight_decay=1e-4)
    bs = 32
    steps = epochs * (len(xtr_t) // bs)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=4e-3, total_steps=steps)
    rng = np.random.default_rng(seed)
    best, best_state = np.inf, None
    for epoch in range(epochs):
        model.train()
        order = rng.permutation(len(xtr_t))
        for i in range(0, len(order) - bs + 1, bs):
            idx = order[i:i + bs]
            xb, bb = torch.from_numpy(xtr_t[idx]), torch.from_numpy(btr[idx].copy())
            if rng.random() < 0.5:  # horizontal flip: mirror the boxes' centres
                xb = xb.flip(3)
                bb[..., 1] = torch.where(bb[..., 0] >= 0, 1 - bb[..., 1], bb[..., 1])
            if rng.random() < 0.5:
                xb = xb.flip(2)
                bb[..., 2] = torch.where(bb[..., 0] >= 0, 1 - bb[..., 2], bb[..., 2])
            opt.zero_grad()
            loss = loss_fn(model, xb, bb)
            loss.backward()
            opt.step()
            sched.step()
        model.eval()
        with torch.no_grad():
            val = float(np.mean([loss_fn(model, torch.from_numpy(xva_t[j:j + 128]),
                                         torch.from_numpy(bva[j:j + 128])).item()
                                 for j in range(0, len(xva_t), 128)]))
        print(f"epoch {epoch + 1}/{epochs} train loss {loss.item():.3f} val loss {val:.3f} "
              f"({time.time() - t0:.0f} s)", flush=True)
        if val <= best:
            best, best_state = val, {k: v.clone() for k, v in model.state_dict().items()}
            export(model, out / "defects.onnx")  # the best so far survives an interruption
    model.load_state_dict(best_state)
    model.eval()
    path = out / "defects.onnx"
    export(model, path)
    record = {
        "arch": "defects", "input_size": SIZE, "stride": STRIDE, "train_images": n_train,
        "epochs": epochs, "seed": seed, "seeds": SEEDS, "val_loss": round(best, 4),
        "params": sum(p.numel() for p in model.parameters()),
        "data_generation_s": round(gen_s, 1), "train_s": round(time.time() - t0 - gen_s, 1),
        "torch": torch.__version__, "preprocess": PREPROCESS, "classes": list(CLASSES),
        "output": f"[1, {4 + len(CLASSES)}, {(SIZE // STRIDE) ** 2}] yolov8",
    }
    (out / "defects.train.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record), flush=True)
    return record


def main() -> None:
    """Command line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--train-images", type=int, default=2400)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    train(a.out, a.train_images, a.epochs, a.seed, a.workers)


if __name__ == "__main__":
    main()
