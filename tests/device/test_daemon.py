"""`edgerun serve` as a real process against Mosquitto and a fake sysfs tree."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import cv2
import pytest
from support.daemon_harness import Serve, set_temp, write_broker_config
from support.waiting import wait

from models import bundled
from models.synthetic import samples
from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.service import Coordinator

pytestmark = pytest.mark.skipif(not (bundled() / "manifest.json").exists(),
                                reason="bundled model not built")


def test_results_flow_and_rising_temperature_steps_down(tmp_path, broker, coordinator,
                                                        profile_cache):
    cfg = write_broker_config(tmp_path, broker, profile_cache)
    # No re-profile at 95 °C here: re-measured on a loaded machine the ladder may come back
    # with one rung, and then there is no lower rung to step to (re-profiling while hot is
    # tested in test_daemon_inputs.py).
    cfg.write_text(cfg.read_text().replace("[daemon]\n",
                                           "[daemon]\nreprofile_temp_delta_c = 1000.0\n"))
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: coordinator.store.counts().get("box1", 0) >= 20, 120, "results", d)
        first = coordinator.store.results("box1", 0, 5)
        top = first[0]["variant"]
        assert all(r["variant"] == top and r["label"] for r in first)
        # results can outrun the first health message on a loaded box: wait for it
        wait(lambda: "rungs" in coordinator.views["box1"].health, 30, "health", d)
        health = coordinator.views["box1"].health
        assert health["rungs"] >= 2, f"the bundled ladder needs >= 2 rungs here: {health}"
        set_temp(tmp_path / "sysfs", 95.0)  # past the passive (80) and hot (90) trips
        wait(lambda: coordinator.views["box1"].health.get("rung", 99) <
             health["rungs"], 20, "a lower rung", d)
        n = coordinator.store.counts()["box1"]
        wait(lambda: coordinator.store.counts()["box1"] > n + 10, 20, "more results", d)
        later = coordinator.store.results("box1", n + 5, 10)
        assert later and all(r["variant"] != top for r in later)
        assert any(e["type"] == "rung_changed" for e in coordinator.store.events("box1"))

        # SIGHUP with a broken config: still serving, and says why
        cfg.write_text(cfg.read_text() + "\n[constraints2]\nbogus = 1\n")
        d.proc.send_signal(signal.SIGHUP)
        wait(lambda: "config reload refused" in d.text(), 30, "reload refusal", d)
        n = coordinator.store.counts()["box1"]
        wait(lambda: coordinator.store.counts()["box1"] > n + 10, 20, "results after HUP", d)
        assert d.proc.poll() is None
    finally:
        assert d.stop() == 0


def test_health_power_is_what_runs_not_what_is_planned(tmp_path, broker, coordinator,
                                                      profile_cache):
    """A real device's health power is idle + the rung at the rate achieved: an empty watched
    folder inspects nothing, so it draws idle only, not the planned 40 Hz (the old figure)."""
    from runtime.device.profiles import load_profile

    folder = tmp_path / "inbox"
    folder.mkdir()
    cfg = write_broker_config(tmp_path, broker, profile_cache,
                       source=f'kind = "folder"\npath = "{folder}"\nwatch = true')
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: coordinator.views.get("box1") is not None
             and coordinator.views["box1"].health.get("rung_energy_mj"), 120, "health", d)
        h = coordinator.views["box1"].health
        planned_w = h["rung_energy_mj"] / 1e3 * 40
        assert planned_w >= 0.001, f"the planned load must show at 3 decimals: {h}"
        assert h["power_w"] == pytest.approx(load_profile("generic-x86").power.idle_w), h
    finally:
        assert d.stop() == 0


def test_folder_source_sigterm_and_restart_inspect_each_file_once(tmp_path, broker,
                                                                  coordinator, profile_cache):
    folder = tmp_path / "inbox"
    folder.mkdir()
    files = []
    for i, s in enumerate(samples(seed=9, count=60)):
        p = folder / f"img{i:03d}.png"
        cv2.imwrite(str(p), s.image)
        files.append(p.name)
    (folder / "broken.png").write_bytes(b"not an image")
    cfg = write_broker_config(tmp_path, broker, profile_cache,
                       source=f'kind = "folder"\npath = "{folder}"\nwatch = true')
    d = Serve(tmp_path, cfg)
    wait(lambda: coordinator.store.counts().get("box1", 0) >= 10, 120, "first results", d)
    assert d.stop() == 0  # SIGTERM mid-folder: in-flight frames drained, results kept
    assert "stopped" in d.text()
    d = Serve(tmp_path, cfg)
    try:
        late = folder / "late.png"
        cv2.imwrite(str(late), next(samples(seed=10, count=1)).image)  # watch mode picks it up
        wait(lambda: coordinator.store.counts().get("box1", 0) >= 61, 120, "every file", d)
        time.sleep(1.0)
        refs = [r["ref"] for r in coordinator.store.results("box1", 0, 1000)]
        assert sorted(refs) == sorted([*files, "late.png"])  # each exactly once, none lost
        seqs = [s for _, s in coordinator.store.result_seqs("box1")]
        assert seqs == list(range(1, len(seqs) + 1))
    finally:
        assert d.stop() == 0


def _notify_socket(tmp_path: Path) -> tuple[socket.socket, str]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.2)
    return sock, path


def _messages(sock: socket.socket, seconds: float) -> list[str]:
    out, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            out += sock.recv(4096).decode().splitlines()
        except TimeoutError:
            continue
    return out


def test_notify_ready_watchdog_and_hung_backend_stops_beats(tmp_path, broker, profile_cache):
    sock, path = _notify_socket(tmp_path)
    flag = tmp_path / "hang-now"
    cfg = write_broker_config(tmp_path, broker, profile_cache,
                       backends='enabled = []\nplugins = ["support.hang_backend:HangBackend"]')
    d = Serve(tmp_path, cfg, env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000",
                                  "EDGERUN_TEST_HANG": str(flag)})
    try:
        msgs: list[str] = []
        wait(lambda: msgs.extend(_messages(sock, 0.5)) or "READY=1" in msgs, 120, "READY=1", d)
        assert any(m.startswith("STATUS=") for m in msgs)
        beats = _messages(sock, 2.0).count("WATCHDOG=1")
        assert beats >= 4, f"expected periodic WATCHDOG=1 every <= 0.5 s, got {beats} in 2 s"
        flag.touch()  # the backend now blocks inside infer
        _messages(sock, 1.0)  # beats already in flight
        after = _messages(sock, 2.0).count("WATCHDOG=1")
        assert after == 0, "the watchdog kept beating while inference hung"
        assert d.proc.poll() is None  # systemd, not the daemon, decides to restart it
    finally:
        d.proc.kill()
        d.proc.wait()
        sock.close()


def test_corrupt_variant_is_refused_and_the_daemon_runs_on_the_rest(tmp_path, broker,
                                                                    coordinator, profile_cache):
    import shutil

    model = tmp_path / "inspection"
    shutil.copytree(bundled(), model)
    target = model / "small-fp32.onnx"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    cfg = write_broker_config(tmp_path, broker, profile_cache,
                       extra=f'[model]\npath = "{model}"\n')
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: coordinator.store.counts().get("box1", 0) >= 10, 120, "results", d)
        wait(lambda: any(e["type"] == "variant_refused"
                         for e in coordinator.store.events("box1")), 30, "event", d)
        refused = [e for e in coordinator.store.events("box1") if e["type"] == "variant_refused"]
        assert refused[0]["variant"] == "small-fp32" and "sha256" in refused[0]["error"]
        assert all("small-fp32" not in r["variant"]
                   for r in coordinator.store.results("box1", 0, 50))
    finally:
        assert d.stop() == 0


def test_choose_model_command_switches_in_the_background(tmp_path, broker, profile_cache):
    import json
    import shutil

    from runtime.wire.commands import generate_keypair

    root = tmp_path / "models"
    shutil.copytree(bundled(), root / "inspection")
    shutil.copytree(bundled(), root / "other")
    man = root / "other" / "manifest.json"
    man.write_text(json.dumps({**json.loads(man.read_text()), "name": "other"}))
    generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub")
    coord = Coordinator(CoordinatorConfig(fleet="sys", broker=broker.coordinator("sys"),
        store=str(tmp_path / "coord.db"),
        signing_key=str(tmp_path / "k.pem"), device_keys=str(tmp_path / "keys")))
    coord.start()
    cfg = write_broker_config(tmp_path, broker, profile_cache,
                       extra=f'[model]\npath = "{root / "inspection"}"\n')
    cfg.write_text(cfg.read_text().replace(
        '[telemetry]\n', f'[telemetry]\ntrusted_keys = ["{tmp_path / "k.pub"}"]\n'))
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: coord.store.counts().get("box1", 0) >= 10, 120, "results", d)
        # the daemon made its reply-signing key at first start; enrol its public half
        (tmp_path / "keys").mkdir()
        shutil.copy(tmp_path / "state" / "device.pub", tmp_path / "keys" / "box1.pub")
        assert coord.send_command("box1", "set_rate", {"fps": 5})["ok"]
        time.sleep(2.0)  # several governor ticks: the operator's cap must survive them
        wait(lambda: coord.views["box1"].health.get("rate_cap_hz") == 5.0, 30, "rate cap", d)
        # a missing model is rejected in the reply itself, with the reason (it used to be
        # `accepted`, the failure showing only as a later event)
        nope = coord.send_command("box1", "choose_model", {"name": "nope"})
        assert nope["status"] == "rejected" and "no model 'nope'" in nope["reason"], nope
        reply = coord.send_command("box1", "choose_model", {"name": "other"})
        assert reply["status"] == "accepted"
        wait(lambda: any(r["variant"].startswith("other/")
                         for r in coord.store.results("box1", 0, 100_000)), 60, "new model", d)
        assert d.proc.poll() is None
    finally:
        assert d.stop() == 0
        coord.stop()
