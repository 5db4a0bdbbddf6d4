"""Model swap, probation and rollback: the pure judge with tables, then real daemons against
Mosquitto with bundles downloaded from the coordinator's API, and `kill -9` of a real installer
at every step."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.daemon_harness import Serve, events, last_health, results, write_config
from support.model_dirs import (
    PROBATION,
    constant_dir,
    inspection_dir,
    slow_dir,
)
from support.under_test import child_env
from support.waiting import wait

from models import bundled
from runtime.ota.bundle import make
from runtime.ota.model_store import ModelStore
from runtime.ota.probation import (
    Kpis,
    Limits,
    cannot_reach,
    judge,
    judged_shadow,
    shadow_failed,
    shadow_figures,
    shadow_wait_frames,
)
from runtime.wire.commands import generate_keypair, load_private_key

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.skipif(not (bundled() / "manifest.json").exists(),
                                reason="bundled model not built")

# -- the judge (pure) -------------------------------------------------------------------------

LIM = Limits(latency_ms=10.0, min_frames=100, agreement_floor=0.8,
             max_error_rate_increase=0.01, energy_factor=1.5, min_shadow=20)
OLD = Kpis(frames=1000, errors=0, p95_ms=2.0, energy_mj=1.0)


@pytest.mark.parametrize("new, compared, agreed, state, reason", [
    (Kpis(50, 0, 2.0, 1.0), 10, 10, "pending", ""),  # too few frames yet
    (Kpis(200, 0, 2.5, 1.1), 40, 39, "passed", ""),
    (Kpis(200, 0, 2.5, 1.1), 10, 10, "pending", ""),  # frames enough, shadow sample not
    (Kpis(200, 0, 2.0, 1.0), 40, 2, "failed", "agrees with the old model on 5.0%"),
    (Kpis(200, 0, 2.0, 1.0), 40, 31, "failed", "agrees with the old model on 77.5%"),
    (Kpis(200, 0, 2.0, 1.0), 40, 32, "passed", ""),  # exactly the floor
    (Kpis(200, 0, 12.0, 1.0), 40, 40, "failed", "p95 12.00 ms misses the 10 ms target"),
    (Kpis(200, 0, 9.9, 1.0), 40, 40, "passed", ""),  # slower, within the target
    (Kpis(200, 0, 2.0, 1.6), 40, 40, "failed", "energy 1.600 mJ"),
    (Kpis(200, 0, 2.0, 1.5), 40, 40, "passed", ""),
    (Kpis(200, 5, 2.0, 1.0), 40, 40, "failed", "error rate 2.5%"),
    (Kpis(60, 30, 2.0, 1.0), 0, 0, "failed", "error rate 50.0%"),  # fails early
    (Kpis(200, 0, 12.0, 3.0), 40, 0, "failed", "p95"),  # several reasons at once
    # a short sample that misses the floor at 20 whatever follows: judged at once
    (Kpis(200, 0, 2.0, 1.0), 10, 5, "failed", "agrees with the old model on 5 of the first 10"),
    (Kpis(200, 0, 2.0, 1.0), 10, 6, "pending", ""),  # 6 + 10 to come = 16 of 20: can reach
])
def test_judge_table(new, compared, agreed, state, reason):
    v = judge(OLD, new, compared, agreed, LIM)
    assert v.state == state
    if reason:
        assert any(reason in r for r in v.reasons), v.reasons
    else:
        assert not v.reasons


@pytest.mark.parametrize("like, mixed, frames, judged, is_like", [
    ((10, 10), (40, 20), 499, (10, 10), True),  # like with like short: waited for
    ((10, 10), (40, 20), 500, (40, 20), False),  # the wait over: every form is judged
    ((20, 20), (90, 50), 5000, (20, 20), True),  # like with like full: judged, however long
    ((0, 0), (0, 0), 5000, (0, 0), False),  # nothing compared at all: judge stays pending
    ((10, 2), (90, 85), 100, (10, 2), True),  # like with like damning: judged, not waited
    ((10, 2), (90, 85), 5000, (10, 2), True),  # ... nor dodged by the sample of every form
])
def test_the_shadow_figure_is_like_with_like_until_its_wait_ends(like, mixed, frames, judged,
                                                                 is_like):
    """The shadow sample compares the new model on the old model's form: a governor holding
    the new model on another rung must not keep its probation open for ever, nor let it pass
    unjudged (the sample of every form then counts, as before forms were matched)."""
    wait = shadow_wait_frames(100, 5)
    assert wait == 500  # 5 x max(100 frames, 20 comparisons x every 5th)
    assert shadow_figures(like, mixed, frames, wait, 0.8) == (judged, is_like)
    compared, agreed = judged
    v = judge(OLD, Kpis(frames, 0, 2.0, 1.0), compared, agreed, LIM)
    assert v.state == ("failed" if cannot_reach(compared, agreed, 0.8) else
                       "pending" if compared < 20 or frames < 100 else
                       "failed" if agreed / compared < 0.8 else "passed")


@pytest.mark.parametrize("compared, agreed, hopeless", [
    (0, 0, False), (1, 0, False), (4, 0, False), (5, 0, True),  # 0 + 15 < 16
    (10, 6, False), (10, 5, True), (19, 15, False), (19, 14, True), (20, 0, False),
])
def test_a_short_sample_is_hopeless_when_the_rest_cannot_lift_it(compared, agreed, hopeless):
    assert cannot_reach(compared, agreed, 0.8) is hopeless


@pytest.mark.parametrize("compared, failed, broken", [
    (0, 0, False), (0, 19, False), (0, 20, True),  # the old session never compared
    (5, 20, True), (19, 40, True),  # short of a sample and failing as often
    (20, 20, False), (25, 100, False),  # a sample made: its agreement is judged
])
def test_an_old_session_that_keeps_failing_is_given_up(compared, failed, broken):
    assert shadow_failed(compared, failed) is broken


@pytest.mark.parametrize("like, gave_up, judged", [
    ((8, 8), False, (8, 8)),  # the sample as it stands
    ((8, 8), True, (0, 0)),  # given up: judged without agreement
    ((8, 0), True, (8, 0)),  # given up, but already under the floor whatever follows
    ((0, 0), True, (0, 0)),
])
def test_a_given_up_shadow_still_fails_a_hopeless_sample(like, gave_up, judged):
    assert judged_shadow(like, like, 200, 500, 0.8, gave_up) == (judged, True)
    v = judge(OLD, Kpis(200, 0, 2.0, 1.0), *judged,
              dataclasses.replace(LIM, min_shadow=0 if gave_up else 20))
    assert v.state == ("failed" if judged == (8, 0) else
                       "passed" if gave_up else "pending")


def test_judge_does_not_blame_a_new_model_for_an_old_miss():
    old = Kpis(1000, 0, 15.0, 1.0)
    assert judge(old, Kpis(200, 0, 14.0, 1.0), 40, 40, LIM).state == "passed"
    assert judge(old, Kpis(200, 0, 16.0, 1.0), 40, 40, LIM).state == "failed"


def test_judge_without_baseline_uses_absolute_limits_only():
    assert judge(None, Kpis(200, 0, 5.0, 9.0), 0, 0, LIM).state == "passed"
    assert judge(None, Kpis(200, 0, 50.0, 1.0), 0, 0, LIM).state == "failed"


def test_all_reasons_are_listed():
    v = judge(OLD, Kpis(200, 0, 12.0, 3.0), 40, 0, LIM)
    assert len(v.reasons) == 3


# -- model directories ------------------------------------------------------------------------


@pytest.fixture
def publisher(tmp_path):
    generate_keypair(tmp_path / "publisher.pem", tmp_path / "publisher.pub")
    return load_private_key(tmp_path / "publisher.pem")


MODELS = """
[models]
publisher_keys = ["{pub}"]
probation_frames = 60
shadow_every = 2
agreement_floor = 0.8
"""


# -- kill -9 of the installer at every step ---------------------------------------------------

def _coordinator_api(tmp_path: Path):
    """The coordinator's API alone (no broker needed to serve bundles)."""
    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.api import serve
    from runtime.coordinator.service import Coordinator

    c = Coordinator(CoordinatorConfig(store=str(tmp_path / "coord" / "c.db")))
    server = serve(c, "127.0.0.1", 0, token="t" * 24)
    return c, server


def _install(cfg: Path, source: str, env: dict | None = None, *extra: str):
    return subprocess.run(
        [sys.executable, "-m", "runtime.cli", "models", "install", source, "--config",
         str(cfg), *extra], capture_output=True, text=True, timeout=300,
        env=child_env(**(env or {})))


STEPS = ["download", "verify", "profile", "swap", "swapped"]


@pytest.mark.parametrize("step", [pytest.param(s, marks=pytest.mark.slow)
                                  if s != "swap" else s for s in STEPS])
def test_kill_9_at_each_install_step_leaves_old_or_new_never_none(tmp_path, publisher,
                                                                   profile_cache, step):
    old = inspection_dir(tmp_path / "models" / "inspection")
    # a file of its own: the installer profiles only what the (module's) cache has not
    # measured, and the kill at "profile" comes while a variant is measured
    new = inspection_dir(tmp_path / "src2", tag=f"version 2, install {step}")
    make(new, publisher, tmp_path / "b.edgerun", "2")
    coord, server = _coordinator_api(tmp_path)
    try:
        held = coord.shelf.receive((tmp_path / "b.edgerun").open("rb"),
                                   (tmp_path / "b.edgerun").stat().st_size)
        args = coord.deploy_args(held.id)
        cfg = write_config(tmp_path, profile_cache, extra=MODELS.format(
            pub=tmp_path / "publisher.pub") + f'[model]\npath = "{old}"\n')
        how = ("--size", str(args["size"]), "--sha256", args["sha256"])
        (tmp_path / "token").write_text(args["token"])
        how += ("--token-file", str(tmp_path / "token"))
        got = _install(cfg, args["url"], {"EDGERUN_CRASH_AT": step}, *how)
        assert got.returncode == -9, got.stderr  # it really was killed there
        store = ModelStore(tmp_path / "state")
        vid, _ = store.serving()
        assert vid == ("inspection@2" if step == "swapped" else None)
        # a killed unpack leaves only staging (never a version directory without all files)
        assert store.ids() == (["inspection@2"] if step in ("profile", "swap", "swapped")
                               else [])
        if step == "download":  # the partial download is kept and resumed
            part = list(store.downloads.glob("*.part"))
            assert part and 0 < part[0].stat().st_size < args["size"]
        d = Serve(tmp_path, cfg)
        try:
            wait(lambda: len(results(d.outbox)) >= 20, 90, "results", d)
            wait(lambda: (h := last_health(d.outbox)) and "model_version" in h, 30, "health",
                 d)
            h = last_health(d.outbox)
            assert h["model_version"] == (vid or "")
            assert {r["variant"].split("/")[0] for r in results(d.outbox)} == {"inspection"}
            assert (f"serving model version {vid}" in d.text()) == (vid is not None)
            assert not list(store.staging.iterdir())  # what a killed unpack left is gone
        finally:
            assert d.stop() == 0
        # the interrupted install completes when run again (the download resumes)
        if step != "swapped":
            again = _install(cfg, args["url"], None, *how)
            assert again.returncode == 0, again.stderr
            assert ModelStore(tmp_path / "state").serving()[0] == "inspection@2"
    finally:
        server.shutdown()
        coord.store.close()
        coord.shelf.close()


# -- deploy, probation and rollback in a real daemon -------------------------------------------


def _deploy(fleet, device: str, bundle_id: str) -> dict:
    return fleet.coord.send_command(device, "deploy", fleet.coord.deploy_args(bundle_id),
                                    wait_s=20)


def test_good_model_passes_constant_model_is_rolled_back_by_agreement(tmp_path, fleet):
    key = load_private_key(tmp_path / "publisher.pem")
    v1 = inspection_dir(tmp_path / "models" / "inspection")
    make(inspection_dir(tmp_path / "src2"), key, tmp_path / "i2.edgerun", "2")
    make(constant_dir(tmp_path / "src-c"), key, tmp_path / "c1.edgerun", "1")
    cfg = fleet.config("box1", v1, PROBATION)
    d = fleet.device("box1", cfg)
    wait(lambda: fleet.health("box1").get("model_version") == "", 60, "first health", d)

    # a name that is not on the device: rejected at once, with the reason (was: accepted)
    reply = fleet.coord.send_command("box1", "choose_model", {"name": "nope"})
    assert reply["status"] == "rejected" and not reply["ok"]
    assert "no model 'nope' on this device" in reply["reason"]

    reply = _deploy(fleet, "box1", fleet.upload(tmp_path / "i2.edgerun"))
    assert reply["status"] == "accepted", reply
    swapped = fleet.wait_event("box1", "model_swapped")
    assert (swapped["from"], swapped["to"]) == ("configured", "inspection@2")
    passed = fleet.wait_event("box1", "model_probation_passed")
    assert passed["version"] == "inspection@2" and passed["agreement"] >= 0.99
    assert passed["shadow_compared"] >= 20

    # signed by the coordinator's command key, which the device trusts for commands only:
    # refused at verify, the device keeps serving inspection@2 (bundles not kept on disk)
    make(inspection_dir(tmp_path / "src3"), load_private_key(tmp_path / "command.pem"),
         tmp_path / "i3.edgerun", "3")
    assert _deploy(fleet, "box1", fleet.upload(tmp_path / "i3.edgerun"))["ok"]
    failed = fleet.wait_event("box1", "model_deploy_failed")
    assert failed["step"] == "verify" and "not one of the publisher keys" in failed["error"]
    store = ModelStore(tmp_path / "box1" / "state")
    assert store.serving()[0] == "inspection@2" and not list(store.downloads.iterdir())

    reply = _deploy(fleet, "box1", fleet.upload(tmp_path / "c1.edgerun"))
    assert reply["status"] == "accepted", reply
    rolled = fleet.wait_event("box1", "model_rolled_back")
    assert rolled["version"] == "constant@1" and rolled["to"] == "inspection@2"
    assert "agrees with the old model on" in rolled["reason"], rolled
    wait(lambda: fleet.health("box1").get("model_version") == "inspection@2", 30,
         "health back on inspection@2", d)
    assert ModelStore(tmp_path / "box1" / "state").serving()[0] == "inspection@2"
    # after the rollback the frames are labelled by the old model again
    n = fleet.coord.store.counts().get("box1", 0)
    wait(lambda: fleet.coord.store.counts().get("box1", 0) > n + 20, 30, "more results", d)
    last = fleet.coord.store.results("box1", 0, 1_000_000)[-1]
    assert last["variant"].startswith("inspection/"), last
    # and the same version is refused from now on, saying why
    again = _deploy(fleet, "box1", "constant@1")
    assert again["status"] == "rejected" and "rolled back on this device" in again["reason"]
    chosen = fleet.coord.send_command("box1", "choose_model", {"name": "constant@1"})
    assert chosen["status"] == "rejected" and "rolled back on this device" in chosen["reason"]
    # no frame was lost: result seqs have no gap across both swaps
    seqs = [r["seq"] for r in fleet.coord.store.results("box1", 0, 1_000_000)]
    assert seqs and seqs == list(range(seqs[0], seqs[0] + len(seqs)))


@pytest.mark.slow
def test_model_missing_the_latency_target_is_rolled_back(tmp_path, fleet):
    key = load_private_key(tmp_path / "publisher.pem")
    v1 = inspection_dir(tmp_path / "models" / "inspection")
    make(slow_dir(tmp_path / "src-s", 1024), key, tmp_path / "s1.edgerun", "1")
    # 5 ms: the new model (a CNN at 1024x1024: 30-50 ms here, <50 ms on a faster CI box, where
    # a 50 ms target failed it on energy and agreement alone) misses it on any machine we run
    # on; the old one (0.2 ms profiled) meets it, and where a loaded box holds it past the
    # target too, the new one still fails on latency for being slower (probation.judge)
    cfg = fleet.config("box1", v1, PROBATION, latency_ms=5.0)
    d = fleet.device("box1", cfg)
    wait(lambda: fleet.coord.store.counts().get("box1", 0) >= 20, 60, "results", d)
    assert _deploy(fleet, "box1", fleet.upload(tmp_path / "s1.edgerun"))["ok"]
    rolled = fleet.wait_event("box1", "model_rolled_back", 180)
    assert rolled["version"] == "slow@1" and "misses the 5 ms target" in rolled["reason"], \
        rolled
    wait(lambda: fleet.health("box1").get("model_version") == "", 30, "back on configured",
         d)


def test_operator_settings_survive_restart_and_reload(tmp_path, fleet):
    import signal

    v1 = inspection_dir(tmp_path / "models" / "inspection")
    cfg = fleet.config("box1", v1, latency_ms=100.0)
    d = fleet.device("box1", cfg)

    def target() -> float | None:
        return fleet.health("box1").get("slo", {}).get("target_ms")

    assert fleet.coord.send_command("box1", "set_latency_target", {"ms": 33})["ok"]
    assert fleet.coord.send_command("box1", "set_accuracy_floor", {"value": 0.5})["ok"]
    wait(lambda: target() == 33, 20, "target applied", d)
    boot = fleet.health("box1")["boot"]
    assert d.stop() == 0
    d = fleet.devices["box1"] = Serve(tmp_path / "box1", cfg)
    wait(lambda: fleet.health("box1").get("boot") not in (None, boot), 60, "restart", d)
    assert target() == 33  # was the config's 100 after a restart
    assert "operator settings from" in d.text()
    d.proc.send_signal(signal.SIGHUP)  # the file still says 100 ms
    wait(lambda: "config reloaded" in d.text(), 20, "reload", d)
    t = time.time()
    wait(lambda: fleet.health("box1").get("t", 0) > t, 20, "health after the reload", d)
    assert target() == 33
    saved = json.loads((tmp_path / "box1" / "state" / "settings.json").read_text())
    assert saved == {"latency_ms": 33.0, "accuracy_floor": 0.5}


@pytest.mark.parametrize("step", [pytest.param(s, marks=pytest.mark.slow)
                                  if s != "swapped" else s for s in STEPS])
def test_kill_9_of_the_daemon_at_each_deploy_step(tmp_path, fleet, step):
    """The daemon itself is killed at `step` of a deploy; restarted, it serves the old or the
    new model (whole), and the coordinator's desired state brings it to the new one."""
    key = load_private_key(tmp_path / "publisher.pem")
    v1 = inspection_dir(tmp_path / "models" / "inspection")
    # a file of its own: the daemon profiles only what its cache has not measured, and the
    # kill at "profile" comes while a variant is measured
    make(inspection_dir(tmp_path / "src2", tag=f"version 2, {step}"), key,
         tmp_path / "i2.edgerun", "2")
    bundle = fleet.upload(tmp_path / "i2.edgerun")
    # the same model twice: the energy rule is not this test's subject (tests/device/
    # test_probation_energy.py). Live energy is CPU time a inference, and beside the slow
    # tier's 10-minute camera test the same model read 6.8 against 3.9 mJ (CI, 2026-12-07):
    # rolled back, never passed
    cfg = fleet.config("box1", v1, PROBATION + "energy_factor = 10.0\n")
    d = fleet.device("box1", cfg, env={"EDGERUN_CRASH_AT": step})
    wait(lambda: fleet.coord.store.counts().get("box1", 0) >= 10, 60, "results", d)
    fleet.coord.rollouts.set_group("g", ["box1"])
    fleet.coord.rollouts.start(bundle, "g", 100)
    wait(lambda: d.proc.poll() is not None, 60, f"the kill at {step}")
    assert d.proc.returncode == -9
    store = ModelStore(tmp_path / "box1" / "state")
    vid, path = store.serving()
    assert vid == ("inspection@2" if step == "swapped" else None)
    assert path is None or (path / "fp32.onnx").stat().st_size > 0
    d = fleet.devices["box1"] = Serve(tmp_path / "box1", cfg)
    # back serving a whole model at once, then the desired state (re-sent on its return)
    # brings it to inspection@2
    wait(lambda: fleet.health("box1").get("model_version") in ("", "inspection@2"), 60,
         "health after the restart", d)
    wait(lambda: store.serving()[0] == "inspection@2", 90, "the desired model re-sent", d)
    fleet.wait_event("box1", "model_probation_passed", 90)


@pytest.mark.slow
def test_a_version_corrupted_on_disk_falls_back_at_start(tmp_path, publisher, profile_cache):
    """A file of the current version changed after it was verified: the daemon still comes
    back serving a model (the configured one), says why, and remembers the version as bad."""
    old = inspection_dir(tmp_path / "models" / "inspection")
    make(inspection_dir(tmp_path / "src2"), publisher, tmp_path / "b.edgerun", "2")
    cfg = write_config(tmp_path, profile_cache, extra=MODELS.format(
        pub=tmp_path / "publisher.pub") + f'[model]\npath = "{old}"\n')
    got = _install(cfg, str(tmp_path / "b.edgerun"))
    assert got.returncode == 0, got.stderr
    store = ModelStore(tmp_path / "state")
    onnx_file = store.path("inspection@2") / "fp32.onnx"
    data = bytearray(onnx_file.read_bytes())
    data[-100] ^= 0xFF
    onnx_file.write_bytes(bytes(data))
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: len(results(d.outbox)) >= 10, 90, "results", d)
        ev = events(d.outbox, "model_rolled_back")
        assert ev and ev[0]["version"] == "inspection@2" and ev[0]["to"] == "configured"
        assert "no variant passed verification" in ev[0]["reason"]
        assert any("sha256" in e["error"] for e in events(d.outbox, "variant_refused"))
        assert store.serving()[0] is None and store.rejected("inspection@2")
    finally:
        assert d.stop() == 0


def test_crash_loop_in_probation_rolls_back_by_itself(tmp_path, publisher, profile_cache):
    """A daemon that dies at every start while a new version is in probation: at the third
    start it rolls back before loading it, and the next start serves the old model."""
    old = inspection_dir(tmp_path / "models" / "inspection")
    make(inspection_dir(tmp_path / "src2"), publisher, tmp_path / "b.edgerun", "2")
    cfg = write_config(tmp_path, profile_cache, extra=MODELS.format(
        pub=tmp_path / "publisher.pub") + f'[model]\npath = "{old}"\n')
    assert _install(cfg, str(tmp_path / "b.edgerun")).returncode == 0
    store = ModelStore(tmp_path / "state")
    for start in (1, 2, 3):
        d = Serve(tmp_path, cfg, env={"EDGERUN_CRASH_AT": "serving"})
        assert d.proc.wait(60) == -9
        assert store.serving()[0] == ("inspection@2" if start < 3 else None), start
    assert "crash loop: 3 starts" in store.rejected("inspection@2")
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: len(results(d.outbox)) >= 10, 90, "results", d)
        ev = events(d.outbox, "model_rolled_back")
        assert ev and "crash loop: 3 starts while inspection@2 was in probation" in \
            ev[0]["reason"]
        # health waits a moment in memory for a broker before the outbox keeps it
        wait(lambda: last_health(d.outbox) is not None, 30, "a health", d)
        assert last_health(d.outbox)["model_version"] == ""
    finally:
        assert d.stop() == 0


@pytest.mark.timeout(300)  # 43 s on a loaded 2-core box (docs/testing-timing.md)
def test_a_model_deployed_while_the_first_choice_is_refined_stays_served(tmp_path, fleet):
    """A cold start serves on the quick round and refines the configured model in the
    background; a model deployed meanwhile is swapped in first. When the refinement of the
    old model finishes afterwards it must not be installed over the new one (was: the ladder
    went back to the old model's variants while health said the new version served)."""
    key = load_private_key(tmp_path / "publisher.pem")
    v1 = slow_dir(tmp_path / "models" / "slow", 640)
    make(inspection_dir(tmp_path / "src2"), key, tmp_path / "i2.edgerun", "2")
    # another model than the old one by design: agreement is not what this test is about
    cfg = fleet.config("box1", v1, PROBATION.replace("floor = 0.8", "floor = 0.0"))
    # many runs at full length: the slow model's refinement lasts seconds, the deployed
    # (0.2 ms) model's profile a fraction of one. 640 px (was 320): at 320 a quiet machine
    # refined the old model in 4.5 s while the deployed one, profiled in turns with it, took
    # 5.3 s, so the swap came after the refinement (failed 3/3 at nice -19, 1 in a full run);
    # at 640: 9.4 s against 1.7 s
    cfg.write_text(cfg.read_text().replace("min_runs = 10", "min_runs = 600").replace(
        "max_runs = 100", "max_runs = 600").replace("time_budget_s = 0.05",
                                                    "time_budget_s = 60"))
    d = fleet.device("box1", cfg)
    wait(lambda: d.ready(), 60, "ready", d)
    assert _deploy(fleet, "box1", fleet.upload(tmp_path / "i2.edgerun"))["ok"]
    swapped = fleet.wait_event("box1", "model_swapped")
    assert swapped["to"] == "inspection@2"
    assert "refinement of slow finished" not in d.text(), "refinement ended before the swap"
    # 600 runs of the 640-px model: ~10 s quiet, a minute or more on a loaded box
    wait(lambda: "refinement of slow finished" in d.text(), 240, "the refinement's end", d)
    n = fleet.coord.store.counts().get("box1", 0)
    wait(lambda: fleet.coord.store.counts().get("box1", 0) > n + 20, 30, "more results", d)
    last = fleet.coord.store.results("box1", 0, 1_000_000)[-1]
    assert last["variant"].startswith("inspection/"), last
    assert fleet.health("box1").get("model_version") == "inspection@2"
    assert not fleet.events("box1", "model_rolled_back")


def test_a_detector_deployed_over_a_classifier_serves_boxes_tiled(tmp_path, fleet):
    """The bundled classifier serves; the bundled defect detector is deployed over it with
    [model] tiling on: after the swap the results carry boxes and counts of the detector's
    labels, and no frame is refused on the way (the shadow sample runs the old classifier
    on its own preprocessing)."""
    if not (bundled("defects") / "manifest.json").exists():
        pytest.skip("models/defects not built")
    key = load_private_key(tmp_path / "publisher.pem")
    v1 = inspection_dir(tmp_path / "models" / "inspection")
    shutil.copytree(bundled("defects"), tmp_path / "src-d")
    make(tmp_path / "src-d", key, tmp_path / "d1.edgerun", "1")
    cfg = fleet.config("box1", v1, PROBATION.replace("floor = 0.8", "floor = 0.0"))
    cfg.write_text(cfg.read_text().replace('kind = "synthetic"\nrate_hz = 40',
                                           'kind = "synthetic"\nrate_hz = 20\nsize = 192')
                   .replace("[model]\n", "[model]\ntiling = true\n"))
    d = fleet.device("box1", cfg)
    wait(lambda: fleet.coord.store.counts().get("box1", 0) >= 10, 60, "results", d)
    assert _deploy(fleet, "box1", fleet.upload(tmp_path / "d1.edgerun"))["ok"]
    swapped = fleet.wait_event("box1", "model_swapped")
    assert swapped["to"] == "defects@1"
    n = fleet.coord.store.counts().get("box1", 0)
    wait(lambda: fleet.coord.store.counts().get("box1", 0) > n + 40, 60, "more results", d)
    rs = fleet.coord.store.results("box1", 0, 1_000_000)
    new = [r for r in rs if r["variant"].startswith("defects/")]
    assert len(new) >= 30
    assert all("boxes" in r and r["label"] in ("scratch", "dent", "stain", "none")
               for r in new), new[-1]
    h = fleet.health("box1")
    assert h["pipeline"]["frames_bad"]["total"] == 0, h["pipeline"]["frames_bad"]
    assert h["model_version"] == "defects@1"
    assert not fleet.events("box1", "inference_failed")
    assert "Traceback" not in d.text()


def test_a_model_chosen_while_the_first_choice_is_refined_is_loaded_after_it(tmp_path, fleet):
    """`choose_model` of a sibling model directory while the cold start's refinement runs
    in the background: the chosen model is loaded once the refinement is done (was: skipped
    as 'already profiling' while the command was reported applied, and never loaded)."""
    # 480 px (was 320): the 320 one refined in 3.1 s on a quiet machine here, 2 s after the
    # command arrived; a faster CI box would have halved that margin
    v1 = slow_dir(tmp_path / "models" / "slow", 480)
    inspection_dir(tmp_path / "models" / "inspection")
    cfg = fleet.config("box1", v1, PROBATION)
    cfg.write_text(cfg.read_text().replace("min_runs = 10", "min_runs = 600").replace(
        "max_runs = 100", "max_runs = 600").replace("time_budget_s = 0.05",
                                                    "time_budget_s = 60"))
    d = fleet.device("box1", cfg)
    wait(lambda: d.ready(), 60, "ready", d)
    reply = fleet.coord.send_command("box1", "choose_model", {"name": "inspection"})
    assert reply["status"] == "accepted", reply
    assert "refinement of slow finished" not in d.text(), "refinement ended before the choice"
    wait(lambda: "rung" in d.text() and "-> inspection/" in d.text(), 240,
         "the chosen model running", d)  # after the refinement: a minute on a loaded box

    def last() -> dict:
        return fleet.coord.store.results("box1", 0, 1_000_000)[-1]
    # results reach the coordinator in order: those made before the switch may still be on
    # their way (a loaded box falls behind while the refinement runs), so wait for the first
    # of the chosen model's, then for more: none of the old model's may follow it
    wait(lambda: last()["variant"].startswith("inspection/"), 60, "the chosen model's results", d)
    first = last()["seq"]
    wait(lambda: last()["seq"] > first + 10, 30, "more results", d)
    later = [r for r in fleet.coord.store.results("box1", first, 1_000_000)
             if not r["variant"].startswith("inspection/")]
    assert not later, later[:3]
    assert "-> slow/" not in d.text().split("-> inspection/", 1)[1], "switched back to slow"
    assert not fleet.events("box1", "reprofile_skipped")


@pytest.mark.timeout(420)  # 69 s on a loaded 2-core box (docs/testing-timing.md)
def test_a_rollback_while_the_first_choice_is_refined_loads_the_old_model(tmp_path, publisher):
    """A restart during the probation of a slow version (cold profile cache): the daemon
    serves it after the quick round and refines it in the background; probation fails on
    latency meanwhile. The old model is loaded once the refinement is done (was: its load
    was skipped as 'already profiling', and the failed version went on serving while health
    said the configured model did)."""
    old = inspection_dir(tmp_path / "models" / "inspection")
    make(slow_dir(tmp_path / "src2", 640), publisher, tmp_path / "b.edgerun", "2")
    cfg = write_config(tmp_path, tmp_path / "cache", latency_ms=3.0, extra=MODELS.format(
        pub=tmp_path / "publisher.pub").replace("probation_frames = 60",
                                                "probation_frames = 20")
        + f'[model]\npath = "{old}"\n')
    assert _install(cfg, str(tmp_path / "b.edgerun")).returncode == 0  # probation begins
    # a cold cache for the daemon, and a refinement of seconds at full length
    cfg.write_text(cfg.read_text().replace(str(tmp_path / "cache"), str(tmp_path / "cold"))
                   .replace("min_runs = 10", "min_runs = 500")
                   .replace("max_runs = 100", "max_runs = 500")  # ~5 s of a ~10 ms model:
                   .replace("time_budget_s = 0.05", "time_budget_s = 60"))  # the probation
    # of 20 frames fails first (at 100 runs a quiet machine refined in 1.8 s, before it)
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: events(d.outbox, "model_rolled_back"), 60, "the rollback", d)
        assert "refinement of slow finished" not in d.text(), "refined before the rollback"
        # after the refinement: 625 runs of the slow model, 6 s quiet, 33-39 s at load 9
        # (the whole test took 79 s in a loaded full run): a deadline for a heavier box
        # (results reach the outbox a moment after the events: none may be there yet)
        wait(lambda: any(r["variant"].startswith("inspection/") for r in results(d.outbox)[-1:]),
             240, "the old model serving again", d)
        # health waits a moment in memory for a broker before the outbox keeps it
        wait(lambda: (last_health(d.outbox) or {}).get("model_version") == "", 30,
             "a health saying the old model", d)
    finally:
        assert d.stop() == 0
