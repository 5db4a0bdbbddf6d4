"""`edgerun serve` with a Basler camera (pylon's emulator, PYLON_CAMEMU) triggered by the PLC
over Modbus: pymodbus's client as the PLC writes each part's number into PartSeq, the
daemon fires the camera's software trigger, inspects that frame with the bundled model and
writes the verdict back with the part's number. 100 parts, each one's verdict checked to be
its own frame's: the emulator plays 100 different part images in order, one per frame, and
each result's snapshot (every label kept) is compared with the image of its part."""

from __future__ import annotations

import asyncio
import json
import time

import cv2
import numpy as np
import pytest
from support.daemon_harness import Serve, results, write_config
from support.waiting import wait

from models import bundled
from models.synthetic import CLASSES, samples
from runtime.wire.broker import free_port

pypylon = pytest.importorskip("pypylon", reason="pypylon is not installed "
                              "(pip install 'edgerun[camera]')")
from pymodbus.client import AsyncModbusTcpClient  # noqa: E402  # the `modbus` extra, in test

pytestmark = pytest.mark.skipif(not (bundled() / "manifest.json").exists(),
                                reason="bundled model not built")
UNIT = 1
PARTS = 100
PFS = "# {05D8C294-F295-4dfb-9D01-096BD04049F4}\n"  # a GenApi feature file's first line
OK = ("ok", "none")


@pytest.mark.timeout(420)
def test_a_plc_triggered_basler_camera_gives_each_part_its_own_frames_verdict(
        tmp_path, profile_cache):
    parts = list(samples(seed=41, count=PARTS))  # balanced classes, shuffled
    imgs = [s.image for s in parts]
    folder = tmp_path / "parts"
    folder.mkdir()
    for i, img in enumerate(imgs):  # the emulator plays the folder in name order
        cv2.imwrite(str(folder / f"part-{i:04d}.png"), img)
    features = tmp_path / "camera.pfs"
    # the emulator's frame rate bounds how soon it is ready for the next trigger
    features.write_text(PFS + f"TestImageSelector\tOff\nImageFilename\t{folder}\n"
                        "ImageFileMode\tOn\nAcquisitionFrameRate\t1000.00\n")
    snaps = tmp_path / "snapshots"
    port = free_port()
    cfg = write_config(
        tmp_path, profile_cache,
        source=(f'kind = "pylon"\ntrigger = "modbus"\npixel_format = "BGR8Packed"\n'
                f'exposure_us = 100\nfeatures_file = "{features}"'),
        extra=(f"[modbus]\nenabled = true\nport = {port}\n\n"
               f"[results.snapshots]\ndir = \"{snaps}\"\nquality = 100\nkeep = 1000\n"
               f"labels = {json.dumps(list(CLASSES))}\n"))
    d = Serve(tmp_path, cfg, env={"PYLON_CAMEMU": "1"})

    async def plc() -> tuple[dict[int, list[int]], list[float]]:
        c = AsyncModbusTcpClient("127.0.0.1", port=port, timeout=5, retries=0)
        assert await c.connect()
        seen: dict[int, list[int]] = {}
        took: list[float] = []
        for seq in range(1, PARTS + 1):  # one part at a time, as a line does
            t0 = time.perf_counter()
            assert not (await c.write_register(0, seq, device_id=UNIT)).isError()
            for _ in range(20_000):  # the PLC's scan: registers 0..9 every 1 ms
                r = await c.read_holding_registers(0, count=10, device_id=UNIT)
                assert not r.isError(), r
                if r.registers[1] == seq:
                    break
                await asyncio.sleep(0.001)
            else:
                raise AssertionError(f"no verdict for part {seq} within 20 s")
            took.append((time.perf_counter() - t0) * 1e3)
            seen[seq] = r.registers
        c.close()
        return seen, took

    try:
        wait(d.ready, 240, "serve ready", d)
        seen, took = asyncio.run(asyncio.wait_for(plc(), 240))
        wait(lambda: len(list(snaps.glob("*.json"))) >= PARTS, 30, "snapshots written", d)
    finally:
        assert d.stop() == 0
    log = d.text()
    assert "pylon camera Emulation 0815-0000 open: triggered by software" in log
    assert "without a PLC edge" not in log  # no stray frame discarded

    stored = {r["ref"]: r for r in results(tmp_path / "state" / "outbox.db")}
    assert sorted(stored) == sorted(f"plc-{k}" for k in range(1, PARTS + 1))  # 0 lost, 0 twice
    snap = {}
    for p in snaps.glob("*.json"):
        meta = json.loads(p.read_text())
        snap[meta["ref"]] = cv2.imread(str(p.with_suffix(".jpg")))
    matched = 0
    for k in range(1, PARTS + 1):
        r, regs = stored[f"plc-{k}"], seen[k]
        # the camera's k-th frame (block ids from 0), i.e. the k-th part image, is part k's
        assert r["camera_frame"] == k - 1, (k, r["camera_frame"])
        diffs = [np.abs(snap[f"plc-{k}"].astype(int) - img).mean() for img in imgs]
        assert int(np.argmin(diffs)) == k - 1 and diffs[k - 1] < 8, (k, diffs[k - 1])  # JPEG
        # the verdict the PLC read for part k is that result's
        assert regs[0] == regs[1] == k
        assert regs[2] == (1 if r["label"] in OK else 2), (k, r["label"], regs)
        assert regs[3] == list(CLASSES).index(r["label"]) + 1
        assert regs[4] == round(r["score"] * 10_000)
        matched += 1
    assert matched == PARTS
    p50, p99 = np.percentile(took, [50, 99])
    e2e = [r["e2e_ms"] for r in stored.values()]
    truth = sum(stored[f"plc-{k}"]["label"] == CLASSES[s.label] for k, s in enumerate(parts, 1))
    print(f"\npylon emulator + Modbus, {PARTS} parts one at a time: {matched}/{PARTS} verdicts "
          f"matched to their parts; trigger (PartSeq write) to verdict (VerdictSeq read) "
          f"p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {max(took):.2f} ms; the daemon's edge to "
          f"stored result p50 {np.percentile(e2e, 50):.2f} ms, p99 "
          f"{np.percentile(e2e, 99):.2f} ms; labels equal to the rendered truth "
          f"{truth}/{PARTS}")
