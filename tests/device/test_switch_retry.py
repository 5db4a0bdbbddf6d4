"""A variant switch that keeps failing backs off (1 s doubling to 5 min) and is said once per
state change, not at every control tick: the pure backoff with tables, then a real `edgerun
serve` whose lower rungs' files are removed after profiling and which is then heated."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest
from support.daemon_harness import ZONE, Serve, events, last_health, write_config
from support.waiting import wait

from models import bundled
from runtime.device import commands
from runtime.device.switch_retry import (
    CAP_S,
    Failing,
    Retries,
    candidates,
    due,
    failed,
    reset,
    succeeded,
)

# -- the pure backoff ------------------------------------------------------------------------


def test_intervals_double_from_one_second_to_five_minutes_and_are_said_twice():
    b, t, said, delays = Failing(), 0.0, [], []
    for _ in range(12):
        b, say = failed(b, "v1", t)
        delays.append(b.delay_s)
        said.append(say)
        t = b.next_at
    assert delays == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]
    # the first failure and reaching the longest interval: 2 lines, not 12 (nor one a tick)
    assert said == ["failing"] + [""] * 8 + ["capped", "", ""]
    assert b.failures == 12 and CAP_S == 300


@pytest.mark.parametrize("b, target, now, want", [
    (Failing(), "v1", 0.0, True),                      # nothing failing: try
    (Failing("v1", 1, 1.0, 11.0), "v1", 10.0, False),  # failing, not yet
    (Failing("v1", 1, 1.0, 11.0), "v1", 11.0, True),   # its time
    (Failing("v1", 5, 16.0, 99.0), "v2", 10.0, True),  # another variant: at once
])
def test_due(b, target, now, want):
    assert due(b, target, now) is want


@pytest.mark.parametrize("b, target, want, say", [
    # another variant failing starts afresh at 1 s (and is said)
    (Failing("v1", 7, 64.0, 0.0), "v2", Failing("v2", 1, 1.0, 101.0), "failing"),
    (Failing("v1", 2, 2.0, 0.0), "v1", Failing("v1", 3, 4.0, 104.0), ""),
    (Failing("v1", 9, 256.0, 0.0), "v1", Failing("v1", 10, 300.0, 400.0), "capped"),
    (Failing("v1", 10, 300.0, 0.0), "v1", Failing("v1", 11, 300.0, 400.0), ""),
])
def test_failed(b, target, want, say):
    assert failed(b, target, 100.0) == (want, say)


def test_success_ends_it_and_is_said_once():
    assert succeeded(Failing("v1", 3, 4.0, 9.0)) == (Failing(), "recovered")
    assert succeeded(Failing()) == (Failing(), "")


def test_a_reset_tries_at_once_starts_afresh_and_remembers_for_the_success():
    b = reset(Failing("v1", 6, 32.0, 500.0))
    assert due(b, "v1", 0.0) and b.attempts == 6
    again, say = failed(b, "v1", 10.0)  # it still fails: 1 s again, said again
    assert (again.delay_s, again.next_at, say, again.attempts) == (1.0, 11.0, "failing", 7)
    assert succeeded(b) == (Failing(), "recovered")
    assert failed(b, "v2", 10.0)[0].attempts == 1  # another variant: its own count
    assert reset(Failing()) == Failing()


def test_retries_are_per_model_and_a_reset_tries_at_once():
    r = Retries()
    r.failed("", "v1", 0.0)
    r.failed("det", "d1", 0.0)
    r.failed("det", "d1", 1.0)  # det: 2 s from 1.0
    assert not r.due("", "v1", 0.5) and r.due("", "v1", 1.0)
    assert not r.due("det", "d1", 2.9) and r.due("det", "d1", 3.0)
    old, say = r.succeeded("")
    assert say == "recovered" and old.target == "v1" and old.failures == 1
    assert r.due("", "v1", 0.0) and not r.due("det", "d1", 2.0)  # det's own goes on
    r.reset()  # a command or a config reload
    assert r.due("det", "d1", 2.0) and r.succeeded("det")[1] == "recovered"


# -- a real daemon ---------------------------------------------------------------------------

def _set_temp(root: Path, celsius: float) -> None:
    tmp = root / ZONE / ".temp.tmp"
    tmp.write_text(f"{round(celsius * 1000)}\n")
    os.replace(tmp, root / ZONE / "temp")


@pytest.mark.skipif(not (bundled() / "manifest.json").exists(), reason="bundled model not built")
def test_a_variant_that_will_not_load_is_retried_with_backoff_and_said_once(tmp_path,
                                                                            profile_cache):
    """The model's files under its top rung are removed after profiling, then the box is
    heated: the governor asks for a lower rung at every 0.2 s tick and its session will not
    load. Old code: an error line and a switch_failed event at every tick (25 in 5 s). Now:
    one line and one event, the top rung keeps serving, and a config reload (SIGHUP) after
    the files are back tries at once and steps down."""
    model = tmp_path / "model"
    shutil.copytree(bundled(), model)
    cfg = write_config(tmp_path, profile_cache, extra=f'[model]\npath = "{model}"\n')
    # no re-profile (for the heat, or a slow machine): it would measure the files away
    cfg.write_text(cfg.read_text().replace("[daemon]\n", "[daemon]\nreprofile_temp_delta_c = "
                                           "1000.0\nslow_factor = 1000.0\n"))
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: "variants of inspection profiled in" in d.text(), 120,
             "the start-up refinement's end", d)

        def refined() -> str:  # the refinement's choice (its ladder's top), once installed
            after = d.text().split("variants of inspection profiled in")[-1]
            got = re.findall(r"edgerun.daemon: choice: (\S+): ", after)
            return got[0] if got else ""

        wait(lambda: refined() and (h := last_health(d.outbox)) and h.get("rungs", 0) >= 2
             and h.get("choice") == refined(), 30, "the refined top rung serving", d)
        h = last_health(d.outbox)
        top = h["choice"]
        assert h["rung"] == h["rungs"], h
        # the top rung's file stays (its session is loaded); the others go
        name = top.split("/")[1].split("@")[0]  # e.g. inspection/fp16@onnxruntime:..
        files = {v["name"]: v["file"] for v in json.loads((model / "manifest.json")
                                                         .read_text())["variants"]}
        aside = tmp_path / "aside"
        aside.mkdir()
        for f in model.glob("*.onnx"):
            if f.name != files[name]:
                shutil.move(f, aside / f.name)
        _set_temp(tmp_path / "sysfs", 95.0)  # past the passive (80) and hot (90) trips
        wait(lambda: "cannot switch to" in d.text(), 30, "the failed switch", d)
        time.sleep(5.0)  # 25 control ticks
        text = d.text()
        # each rung that will not load is said once (a step down falls back to each cheaper
        # rung in turn: every one of them is gone here)
        tried = re.findall(r"cannot switch to (\S+): ", text)
        assert tried and len(tried) == len(set(tried)), text[-3000:]
        assert "retrying in 1 s, then at doubling intervals up to 300 s" in text
        failed_ev = events(d.outbox, "switch_failed")
        assert len(failed_ev) == len(tried), failed_ev
        assert all(e["retry_s"] == 1.0 and e["running"] == top for e in failed_ev), failed_ev
        assert last_health(d.outbox)["choice"] == top  # still serving, on the top rung
        n = len(events(d.outbox, "rung_changed"))
        for f in aside.iterdir():  # the files are back; a reload tries at once
            shutil.move(f, model / f.name)
        d.proc.send_signal(signal.SIGHUP)
        wait(lambda: "the retries stop" in d.text(), 20, "the switch after the reload", d)
        wait(lambda: len(events(d.outbox, "rung_changed")) > n, 10, "a rung change", d)
        assert events(d.outbox, "rung_changed")[-1]["to"] != top
    finally:
        assert d.stop() == 0


# -- a step down whose rung will not load ----------------------------------------------------

@pytest.mark.parametrize("wanted, running, want", [
    (1, 3, [1, 0]),  # a step down: each cheaper rung in turn
    (0, 2, [0]),
    (2, 1, [2]),  # a step up: only the one asked for
    (2, 2, [2]),
])
def test_a_step_down_falls_back_to_each_cheaper_rung(wanted, running, want):
    assert candidates(wanted, running) == want


def test_two_failing_variants_of_one_model_keep_their_own_backoff():
    """A step down that falls back (or a budget see-sawing between two rungs) asks for two
    failing variants in turn. One state per model restarted the other's interval at 1 s each
    time: both were loaded, and said, at every tick."""
    r = Retries()
    for k in range(4):  # both fail, in turn, four times
        r.failed("", "v2", float(k))
        r.failed("", "v1", float(k))
    assert r.state[("", "v2")].delay_s == 8.0 and r.state[("", "v1")].delay_s == 8.0
    assert not r.due("", "v2", 4.0) and not r.due("", "v1", 4.0)
    old, say = r.succeeded("", "v1")  # v1 loads: v2's backoff goes on
    assert say == "recovered" and old.target == "v1"
    assert not r.due("", "v2", 4.0) and r.due("", "v2", 11.0)


def _daemon(tmp_path: Path, *models: Path):
    """What an unstarted daemon serves (runtime/device/serving.py, made with its named
    collaborators) whose [model] is the first of `models` (copies of the bundled inspection
    model), on a three-rung ladder of real ONNX Runtime variants, its pipeline not running
    (a switch is taken at its next frame: `target` shows it); `use(i)` makes the i-th model
    the [model] (as an OTA swap or a rollback installs it). Events are kept."""
    import queue

    from power.rungs import Rung
    from runtime.config import BackendsConfig, ModelConfig, OnnxRuntimeConfig, load
    from runtime.config.source import SourceConfig
    from runtime.device.operator_state import OperatorState
    from runtime.device.profiles import load_profile
    from runtime.device.profiling import Profiler
    from runtime.device.sensing import Sensing
    from runtime.device.serving import Serving
    from runtime.device.systemd import Notifier
    from runtime.engine.backends import discover
    from runtime.engine.manifest import configured_model, model_files
    from runtime.frames.multisource import lanes
    from runtime.frames.pipeline import Pipeline
    from runtime.frames.sources import open_source

    bcfg = BackendsConfig(enabled=("onnxruntime",), threads=(1,),
                          onnxruntime=OnnxRuntimeConfig(spinning=(False,),
                                                        include_default=False))
    (backend,) = discover(bcfg)
    cfg = tmp_path / "c.toml"
    state = tmp_path / "state"
    state.mkdir()
    cfg.write_text(f'[daemon]\nstate_dir = "{state}"\n')
    said: list = []

    def event(type_: str, severity: str = "info", **f) -> None:
        said.append((type_, f))

    installs: queue.Queue = queue.Queue()
    d = Serving(load(cfg), device=load_profile("generic-x86"), sensing=Sensing(None),
                meter=None, gpu_meters=[], box_energy=None,
                profiler=Profiler(event, installs.put), operator=OperatorState(state),
                state_dir=state, installs=installs, event=event, notify=Notifier({}),
                stopping=lambda: False, changed=lambda: None)

    def use(i: int) -> list:
        m = configured_model(models[i], ModelConfig())
        by_file = {f.path.name: v for f in model_files(m)
                   for v in backend.variants(f, bcfg, (1,))}
        chosen = [by_file[n] for n in ("small-int8.onnx", "fp32.onnx", "fp16.onnx")]
        d.box.model.manifest = m
        d.box.model.loaders = {v.id: (backend, v) for v in chosen}
        d.box.model.rungs = [Rung(v.id, 0.9, 0.001 * (k + 1), 0.01) for k, v in enumerate(chosen)]
        return chosen

    chosen = use(0)
    d.pipeline = Pipeline(lanes([SourceConfig(kind="synthetic", size=64)],
                                lambda c, i: open_source(c, state),
                                lambda s: s.model), d.box.model.manifest, lambda rs: [],
                          lambda e: None)
    return d, said, chosen, use


@pytest.mark.skipif(not (bundled() / "manifest.json").exists(), reason="bundled model not built")
def test_a_hot_box_whose_lower_rung_will_not_load_steps_further_down(tmp_path):
    """The governor steps a hot box down from its top rung to the middle one, whose model file
    is gone (corrupted or removed since profiling). Old code: the switch failed and the box
    stayed on the top, hottest rung, retrying the middle one with backoff for up to 5 min.
    Now: the cheapest rung, which loads, runs at once, and the middle one is not retried at
    every tick after."""
    model = tmp_path / "model"
    shutil.copytree(bundled("inspection"), model)
    d, said, chosen, _ = _daemon(tmp_path, model)
    d.box.model.current = 2
    d.pipeline.switch(d.box.model.session(2))  # the top rung runs
    (model / "fp32.onnx").unlink()  # the middle rung's file is gone
    d.move(d.box.model, 1, "hot")
    assert d.pipeline.target.variant_id == chosen[0].id and d.box.model.current == 0, said
    assert [t for t, _ in said] == ["switch_failed", "rung_changed"]
    assert said[1][1]["to"] == chosen[0].id and "will not load" in said[1][1]["reason"]
    # a step up to the broken rung right after: in its backoff
    d.move(d.box.model, 1, "cooler")
    assert d.box.model.current == 0 and len(said) == 2


@pytest.mark.skipif(not (bundled() / "manifest.json").exists(), reason="bundled model not built")
def test_a_variant_failing_in_one_version_does_not_hold_back_another_versions(tmp_path):
    """Two versions of the [model] share variant ids. The new version's top rung will not
    load (its file is broken) and is in backoff; the rollback installs the old version and
    asks for its top rung, whose file is fine. Old code: the backoff (by variant id) skipped
    it, so the failed version's session kept running under the old version's ladder."""
    new, old = tmp_path / "v2", tmp_path / "v1"
    shutil.copytree(bundled("inspection"), new)
    shutil.copytree(bundled("inspection"), old)
    d, said, chosen, use = _daemon(tmp_path, new, old)
    d.box.model.current = 1
    d.pipeline.switch(d.box.model.session(1))  # the new version runs its middle rung
    (new / "fp16.onnx").write_bytes(b"broken")
    d.move(d.box.model, 2, "budget")
    assert d.box.model.current == 1 and [t for t, _ in said] == ["switch_failed"]
    use(1)  # the rollback installs the old version, whose files are intact
    d.move(d.box.model, 2, "rollback of v2")
    a = d.pipeline.target
    assert a.variant_id == chosen[2].id and a.manifest.root == old, said
    assert d.box.model.current == 2, said


@pytest.mark.skipif(not (bundled() / "manifest.json").exists(), reason="bundled model not built")
def test_a_stream_of_settings_commands_does_not_defeat_the_backoff(tmp_path):
    """Any command reset the backoff: a dashboard slider or a script sending `set_rate` every
    second loaded the broken file (a session load and warm-up on the main loop) and said so
    (an error line, a switch_failed event) at each. A reprofile still tries at once."""
    from runtime.wire.commands import Command

    model = tmp_path / "model"
    shutil.copytree(bundled("inspection"), model)
    d, said, _, _ = _daemon(tmp_path, model)
    d.box.model.current = 1
    d.pipeline.switch(d.box.model.session(1))
    (model / "fp16.onnx").write_bytes(b"broken")
    d.move(d.box.model, 2, "budget")
    for k in range(5):
        commands.handle(d, None, Command(f"cmd{k:05d}", "set_rate", {"fps": 5 + k}))
        d.move(d.box.model, 2, "budget")
    assert [t for t, _ in said].count("switch_failed") == 1, said
    d.reprofile = lambda why: None  # (measuring is not what this test is about)
    commands.handle(d, None, Command("cmd-reprofile", "reprofile", {}))
    d.move(d.box.model, 2, "budget")
    assert [t for t, _ in said].count("switch_failed") == 2, said
