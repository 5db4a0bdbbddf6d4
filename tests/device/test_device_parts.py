"""The daemon's parts taken out of it (runtime/device/): operator state files written by the
modules it replaced still load, the command table covers the wire's commands, and the pure
decisions (re-profile triggers, live energy folding, sensor warnings) keep their rules."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from types import SimpleNamespace

import pytest

from power.energy import EnergyState
from runtime.choice.selector import Profile
from runtime.config import Constraints
from runtime.device import commands, live_energy, operator_state
from runtime.device.profiling import cpu_ratio, reprofile_reason
from runtime.device.sensing import SensorWatch
from runtime.wire.commands import COMMANDS


def test_state_files_of_the_old_modules_load(tmp_path):
    """The bytes control_store.py and operator_settings.py wrote (formats unchanged)."""
    (tmp_path / "settings.json").write_text('{"latency_ms": 25.0, "accuracy_floor": 0.9}')
    (tmp_path / "control.json").write_text(json.dumps({
        "v": 1, "operator_rate_hz": 2.5,
        "energy": {"forecast_wh": [0.0, 1.5], "seen": [False, True]}}))
    st = operator_state.OperatorState(tmp_path)
    energy = st.load()
    assert st.settings == {"latency_ms": 25.0, "accuracy_floor": 0.9}
    assert st.rate_hz == 2.5 and energy.forecast_wh == (0.0, 1.5) and energy.seen == (False, True)
    c = st.constraints(Constraints())
    assert (c.latency_ms, c.accuracy_floor) == (25.0, 0.9)


def test_one_writer_keeps_both_files_in_their_formats(tmp_path):
    st = operator_state.OperatorState(tmp_path)
    st.record("set_latency_target", {"ms": 40})
    st.record("set_rate", {"fps": 3})  # not a settings command: the rate is set_rate's
    energy = EnergyState((1.0,), (True,), slot_index=7, slot_wh=0.5)
    st.set_rate(0.0, energy)  # 0: no cap
    assert json.loads((tmp_path / "settings.json").read_text()) == {"latency_ms": 40.0}
    doc = json.loads((tmp_path / "control.json").read_text())
    assert doc["v"] == 1 and doc["operator_rate_hz"] is None
    assert doc["energy"]["forecast_wh"] == [1.0] and doc["energy"]["slot_index"] == 7
    again = operator_state.OperatorState(tmp_path)
    assert again.load() == energy and again.rate_hz == math.inf
    assert again.settings == {"latency_ms": 40.0}
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically: no temp file left


def test_every_wire_command_the_daemon_acts_on_has_a_handler():
    """ping and rebirth are the publisher's own answers; every other command is applied
    by a handler of the table."""
    assert set(commands.HANDLERS) == set(COMMANDS) - {"ping", "rebirth"}
    assert set(commands.HANDLERS) >= commands.RETRY_COMMANDS


@pytest.mark.parametrize("temp, profiled, p95, prof95, n, want, slow", [
    (None, 40.0, None, None, 0, None, False),
    (60.0, 40.0, None, None, 0, "temperature 60.0 °C, profiled at 40.0 °C", False),
    (45.0, 40.0, None, None, 0, None, False),  # within the delta (10 °C)
    (40.0, 40.0, 9.0, 3.0, 100, "p95 9.00 ms vs 3.00 ms profiled", True),
    (40.0, 40.0, 9.0, 3.0, 49, None, False),  # too few inferences to judge
    (40.0, 40.0, 0.9, 0.3, 100, None, False),  # 3x, but under 1 ms more: not throttling
    (60.0, 40.0, 9.0, 3.0, 100, "p95 9.00 ms vs 3.00 ms profiled", True),  # slow says why
    (25.0, 40.0, None, None, 0, "temperature 25.0 °C, profiled at 40.0 °C", False),  # cooled
    (60.0, None, None, None, 0, None, False),  # profiled with no sensor: nothing to compare
    (40.0, 40.0, 9.0, 3.0, 50, "p95 9.00 ms", True),  # 50 inferences are enough
    (40.0, 40.0, 4.5, 3.0, 100, None, False),  # 1.5 ms more, but 1.5x: under slow_factor
])
def test_reprofile_reason(temp, profiled, p95, prof95, n, want, slow):
    why, is_slow = reprofile_reason(temp, profiled, 10.0, p95, prof95, n, 2.0)
    assert is_slow is slow
    assert (why is None) if want is None else why.startswith(want)


@pytest.mark.parametrize("cpu, want, slow", [
    (None, "p95 9.00 ms", True),  # no CPU figure to tell: latency alone judges
    (2.5, "p95 9.00 ms", True),  # the same work costs 2.5x the CPU time: throttled
    (1.0, None, False),  # 3x late in wall time, the CPU time as profiled: it waited for a core
    (0.0, None, False),  # no live figure learnt yet: wait for one
])
def test_reprofile_reason_tells_throttling_from_waiting_for_the_cpu(cpu, want, slow):
    why, is_slow = reprofile_reason(40.0, 40.0, 10.0, 9.0, 3.0, 100, 2.0, cpu)
    assert is_slow is slow
    assert (why is None) if want is None else why.startswith(want)


@pytest.mark.parametrize("cpu_ms, energy_mj, live_j, want", [
    (1.0, 6.0, 0.012, 2.0),  # 12 mJ live against 6 mJ profiled: twice the CPU time
    (1.0, 6.0, None, 0.0),  # nothing learnt yet
    (math.nan, 6.0, 0.012, None),  # no CPU time in the profile: cannot tell
    (1.0, math.nan, 0.012, None),
])
def test_cpu_ratio_from_live_and_profiled_energy(cpu_ms, energy_mj, live_j, want):
    got = cpu_ratio(_profile("v", energy_mj=energy_mj, cpu_ms=cpu_ms), live_j)
    assert got == pytest.approx(want) if want is not None else got is None


def test_cpu_ratio_cannot_tell_for_a_variant_on_an_accelerator():
    """An OpenCL GPU or CUDA variant's host CPU time stays flat while the GPU throttles:
    latency alone judges it."""
    gpu = replace(_profile("v"), actual_device="opencl:0 (NVIDIA CUDA: NVIDIA H200)")
    assert cpu_ratio(gpu, 0.012) is None
    assert cpu_ratio(replace(_profile("v"), actual_device="CPU"), 0.012) == pytest.approx(2.0)


def test_nothing_is_due_while_a_profiling_job_runs():
    """The start's refinement (minutes) holds the profiler: a re-profile asked every tick
    meanwhile was a 'reprofile_skipped' event a tick; nothing is judged until it ends."""
    from runtime.device.profiling import Profiler

    p = Profiler(lambda *a, **k: None, lambda i: None)
    with p.lock:  # the pipeline and model are not even looked at
        assert p.due(95.0, None, None, None) == (None, None)


def test_a_chosen_model_waits_for_the_profiling_under_way(caplog):
    """`choose_model` while a re-profile runs: its profiling waits and then runs (`wait`),
    where a re-profile is skipped; skipping it lost the operator's command."""
    import queue
    import threading

    from runtime.device.profiling import Profiler

    events, installs = [], queue.Queue()
    p = Profiler(lambda kind, *a, **k: events.append(kind), installs.put)
    ran = threading.Event()

    def measure():
        ran.set()
        return "measured"

    p.lock.acquire()  # a re-profile under way
    p.load(lambda: "reprofiled", "temperature", gen=1)
    assert events == ["reprofile_skipped"]
    p.load(measure, "chosen", gen=2, wait=True)
    assert events[-1] == "reprofile" and not ran.is_set()
    p.lock.release()  # the one under way ends
    p.thread.join(10)
    got = installs.get_nowait()
    assert (got.measured, got.why, got.gen) == ("measured", "chosen", 2)


def test_a_stop_asked_while_profiling_ends_the_profiling():
    """The progress callback raises Stopping at the next variant once a stop is asked: a
    cold first start profiles for minutes, longer than systemd waits for a stop."""
    from runtime.device.profiling import Stopping, progress_reporter
    from runtime.device.systemd import Notifier

    stop = [False]
    progress = progress_reporter(Notifier({}), lambda: stop[0])  # no NOTIFY_SOCKET
    progress(1, 4, "m")
    stop[0] = True
    with pytest.raises(Stopping, match="2/4"):
        progress(2, 4, "m")


def _profile(vid, engine="onnxruntime", threads=1, energy_mj=6.0, cpu_ms=1.0):
    return Profile(vid, "m", "fp32", engine, "CPU", threads, energy_mj=energy_mj,
                   cpu_ms=cpu_ms)


def test_live_energy_folds_after_enough_inferences():
    acc, live = {}, {}
    profiles = {"v": _profile("v")}
    live_energy.fold(acc, live, {"v": (30, 0.03)}, profiles, "v", 0.0, lambda: 1.0)
    assert live == {} and acc == {"v": (30, 0.03)}  # under LIVE_MIN_INFERENCES: kept
    live_energy.fold(acc, live, {"v": (20, 0.02)}, profiles, "v", 0.0, lambda: 1.0)
    assert live["v"] == pytest.approx(0.006) and acc == {}  # 1 ms CPU x 6 J per CPU-s
    live_energy.fold(acc, live, {"v": (50, 0.1)}, profiles, "v", 0.0, lambda: 1.0)
    assert live["v"] == pytest.approx(0.3 * 0.012 + 0.7 * 0.006)  # the EWMA
    live_energy.fold(acc, live, {"w": (50, 0.1)}, profiles, "v", 0.0, lambda: 1.0)
    assert "w" not in live  # a variant without a profile is not learnt


def test_only_the_running_variant_is_billed_other_native_threads():
    acc, live = {}, {}
    profiles = {"v": _profile("v"), "w": _profile("w")}
    live_energy.fold(acc, live, {"v": (50, 0.05), "w": (50, 0.05)}, profiles, "v", 0.05,
                     lambda: 1.0)
    assert live["v"] == pytest.approx(2 * live["w"])
    assert live_energy.has_native_pool(_profile("x", threads=2))
    assert not live_energy.has_native_pool(_profile("x", threads=1))
    assert live_energy.has_native_pool(_profile("x", engine="openvino", threads=1))
    assert live_energy.has_native_pool(None)


def test_sensor_problems_are_said_once_a_minute_with_a_count(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr("runtime.device.sensing.time.monotonic", lambda: now[0])
    w, bad, good = SensorWatch(), SimpleNamespace(problems=("stale",)), SimpleNamespace(
        problems=())
    assert w.read(bad, 5.0) == 1  # the first bad read after good ones: said
    assert w.read(bad, 5.0) is None  # still bad: not a new episode
    assert w.read(good, 5.0) is None
    now[0] += 10
    assert w.read(bad, 5.0) is None and w.bad == 2  # a new episode within the minute
    w.read(good, 5.0)
    now[0] += 60
    assert w.read(bad, 5.0) == 3


def test_the_daemon_offers_what_its_snapshot_and_its_stop_read(tmp_path):
    """The snapshot and the stop read the daemon's parts through Protocols (state.Parts,
    shutdown.StopHost): a member one of them names that the daemon lacks would fail at run
    time, on a device."""
    from runtime.config import from_dict
    from runtime.device.daemon import Daemon
    from runtime.device.shutdown import StopHost
    from runtime.device.state import Parts

    d = Daemon(from_dict({"daemon": {"state_dir": str(tmp_path / "state")}}))
    for proto in (Parts, StopHost):
        names = {n for n in vars(proto) if not n.startswith("_")} | set(
            proto.__annotations__)
        missing = sorted(n for n in names if not hasattr(d, n))
        assert not missing, (proto.__name__, missing)


def test_the_temperature_judged_and_recorded_is_the_governor_s(tmp_path):
    """A re-profile is judged on, and a profile records, the temperature the governor acts on
    (its last step's, held through a bad reading), the sensor's own reading only before the
    first step: a profile made while the sensor held recorded None from the raw reading, and
    no temperature re-profile came again (found in review)."""
    import queue

    from power import control
    from power.sensors import SensorSet
    from runtime.config import from_dict
    from runtime.device.operator_state import OperatorState
    from runtime.device.profiles import load_profile
    from runtime.device.profiling import Profiler
    from runtime.device.sensing import Sensing
    from runtime.device.serving import Serving
    from runtime.device.systemd import Notifier

    state = tmp_path / "state"
    state.mkdir()
    temp = tmp_path / "temp"
    temp.write_text("48000\n")
    installs: queue.Queue = queue.Queue()
    d = Serving(from_dict({"daemon": {"state_dir": str(state)}}),
                device=load_profile("generic-x86"), sensing=Sensing(SensorSet(tmp_path, "temp")),
                meter=None, gpu_meters=[], box_energy=None,
                profiler=Profiler(lambda *a, **k: None, installs.put),
                operator=OperatorState(state), state_dir=state, installs=installs,
                event=lambda *a, **k: None, notify=Notifier({}), stopping=lambda: False,
                changed=lambda: None)
    assert d.temperature() == 48.0  # before the first step: the sensor's reading
    temp.write_text("garbage\n")  # the sensor fails; the governor holds its last value
    d.out = control.Output(rung=0, rate_cap_hz=math.inf, budget_w=1.0, level=0, reason="",
                           temp_c=47.5, slope_c_per_min=0.0)
    assert d.sensors.read().temp_c is None
    assert d.temperature() == 47.5
    temp.write_text("95000\n")  # one jump the governor has not followed yet
    assert d.temperature() == 47.5
    d.out = replace(d.out, temp_c=None)  # the hold ran out: the reading, whatever it is
    assert d.temperature() == 95.0


def test_no_part_of_the_device_is_handed_the_daemon():
    """Only the entry point imports runtime/device/daemon.py: every part is given the
    collaborators it needs (what is served, the links), never the daemon itself."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    importers = []
    for p in sorted((root / "runtime" / "device").glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "runtime.device.daemon":
                importers.append(f"{p.relative_to(root)}:{node.lineno}")
    assert all(i.startswith("runtime/device/cli.py:") for i in importers), importers


@pytest.mark.parametrize("configured, want", [
    (Constraints(latency_ms=20.0), Constraints(latency_ms=7.5)),
    # judged end to end: the command changes that target (changing the inference bound
    # under it would change nothing the operator sees)
    (Constraints(latency_ms=20.0, end_to_end_ms=40.0),
     Constraints(latency_ms=20.0, end_to_end_ms=7.5)),
])
def test_set_latency_target_sets_the_target_in_force(configured, want):
    got: list[Constraints] = []
    host = SimpleNamespace(cfg=SimpleNamespace(constraints=configured),
                           set_constraints=got.append)
    cmd = SimpleNamespace(name="set_latency_target", args={"ms": 7.5})
    assert commands.HANDLERS["set_latency_target"](host, None, cmd) is True
    assert got == [want]
    assert want.in_force() == (7.5, configured.end_to_end_ms is not None)


def _due_on(latencies: list[tuple[float, bool]], live_ratio: float) -> tuple:
    """Profiler.due on a pipeline whose [model] ran `latencies` (ms, alone) in the last 30 s,
    its variant profiled at p95 0.3 ms and 0.3 ms of CPU, living at `live_ratio` x that."""
    import time

    from runtime.device.profiling import Profiler
    from runtime.frames.model_counts import ModelCounts, model_id

    manifest = SimpleNamespace(root="/m")
    counts = ModelCounts()
    now = time.monotonic()
    for ms, alone in latencies:
        counts.result(model_id("", manifest), now, ms, alone)
    prof = Profile("v", "m", "fp32", "onnxruntime", "CPU", 1, p50_ms=0.25, p95_ms=0.3,
                   p99_ms=0.35, energy_mj=1.0, cpu_ms=0.3)
    pipeline = SimpleNamespace(active=SimpleNamespace(variant_id="v"), models=counts)
    model = SimpleNamespace(manifest=manifest, by_id={"v": prof}, temp_c=None)
    cfg = SimpleNamespace(reprofile_temp_delta_c=10.0, slow_factor=1.5)
    return Profiler(lambda *a, **k: None, lambda i: None).due(None, pipeline, model, cfg,
                                                              live_ratio * 1e-3)


def test_only_inferences_that_ran_alone_can_read_as_throttling():
    """A backlog's inferences share the cores with capture and preprocessing: slower in wall
    time and in CPU time (1.61 ms and 1.7x in bench/overhead.py's first round), and a
    re-profile measured the same figures again on the cores the frames needed (0.3x the hand
    loop's throughput). Only frames on the inline path, nothing beside them, are judged."""
    why, slow = _due_on([(2.0, False)] * 200, 1.7)
    assert (why, slow) == (None, None)
    why, slow = _due_on([(2.0, True)] * 200, 1.7)  # alone, and still slow: throttling
    assert why is not None and "throttling" in why and slow == {"variant": "v", "p95_ms": 2.0}
    # too few alone among many shared ones: not judged on 49 inferences
    assert _due_on([(2.0, True)] * 49 + [(2.0, False)] * 500, 1.7) == (None, None)


def test_a_tally_keeps_which_inferences_ran_alone():
    from runtime.frames.model_counts import ModelCounts

    c = ModelCounts()
    for k, alone in enumerate([True, False, True]):
        c.result(("", "m"), 100.0 + k, float(k), alone)
    t = c.tally(("", "m"), 100.5)
    assert (t.results, t.latencies_ms, t.alone_ms) == (3, (1.0, 2.0), (2.0,))


@pytest.mark.parametrize("config, want", [
    (Constraints(latency_ms=20.0), Constraints(latency_ms=7.5, accuracy_floor=0.9)),
    # judged end to end: the saved target is restored onto end_to_end_ms, as the command set it
    (Constraints(latency_ms=20.0, end_to_end_ms=40.0),
     Constraints(latency_ms=20.0, end_to_end_ms=7.5, accuracy_floor=0.9)),
])
def test_a_saved_latency_target_is_restored_onto_the_target_in_force(tmp_path, config, want):
    """set_latency_target, then a restart: the operator's target outlives it on the field the
    command changed (it was saved as latency_ms and restored there, so an end-to-end
    device's target silently went back to the config's)."""
    st = operator_state.OperatorState(tmp_path)
    st.record("set_latency_target", {"ms": 7.5})
    st.record("set_accuracy_floor", {"value": 0.9})
    again = operator_state.OperatorState(tmp_path)
    again.load()
    assert again.constraints(config) == want


def test_the_governor_section_s_band_reaches_the_governor():
    """[governor] band_c is the band step_wise acts in (power/governor.py), on the trips the
    sensor found; its dwell_s/max_dwell_s are the core's timers (power/timers.py)."""
    from power.control_settings import control_config
    from power.device import TripPoint
    from power.thermal_source import ThermalSource
    from runtime.config import GovernorSection
    from runtime.device.profiles import load_profile

    trips = (TripPoint(70.0, "passive", 2.0), TripPoint(80.0, "hot"),
             TripPoint(90.0, "critical"))
    thermal = ThermalSource("t", "zone", trips, "sysfs")
    dev = load_profile("rpi5")
    assert control_config(dev, GovernorSection(), thermal, 10.0).governor.band_c == 0.3
    g = control_config(dev, GovernorSection(band_c=0.05), thermal, 10.0).governor
    assert (g.band_c, g.control_c, g.hyst_c) == (0.05, 70.0, 2.0)
    c = control_config(dev, GovernorSection(dwell_s=45.0, max_dwell_s=600.0), thermal, 10.0)
    assert (c.dwell_s, c.max_dwell_s) == (45.0, 600.0)  # the core's timers, from [governor]


def test_what_is_served_is_written_by_its_owner_only():
    """The constraints in force, the control state and output, the reading, the ladders, the
    plan, the switch, live energy and the watches have one writer, runtime/device/serving.py:
    no other module of runtime/device assigns them on another object (`x.cstate = ...`; the
    control state had three writers and the config in force two)."""
    import ast
    from pathlib import Path

    from runtime.device.serving import Serving

    owned = {"cfg", "cstate", "out", "reading", "ccfg", "pipeline", "backends", "devices",
             "model_gen", "box", "plan", "switch", "energy", "drift", "refusals",
             "sensor_watch", "thermal", "trips", "thermal_disabled"}
    source = Path(__file__).resolve().parents[2] / "runtime" / "device"
    assert owned <= set(Serving.__init__.__code__.co_names)  # each one a field of Serving
    writes = []
    for p in sorted(source.glob("*.py")):
        if p.name == "serving.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else [])
            for t in targets:
                for a in (t.elts if isinstance(t, ast.Tuple) else [t]):  # what is assigned
                    if (isinstance(a, ast.Attribute) and a.attr in owned
                            and not (isinstance(a.value, ast.Name) and a.value.id == "self")):
                        writes.append(f"{p.name}:{a.lineno}: {ast.unparse(a)}")
    assert writes == []
