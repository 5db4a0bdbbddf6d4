"""The profiler on real engines: percentiles, energy with its source, cache, failures."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from support import opencl_devices
from support.modelgen import tiny_cnn

from power.sensors import EstimatedMeter
from runtime.choice.profiler import (
    Profiler,
    model_files,
    plan,
    profile_all,
    quick_order,
    quick_pass,
    refine,
    to_refine,
)
from runtime.choice.selector import Profile
from runtime.config import BackendsConfig, ModelConfig
from runtime.engine.backends import discover

CFG = BackendsConfig(threads=(1,))


IDLE_W, W_PER_CORE = 5.0, 2.0  # the estimate's model of the box


def run(model_path, prof_cfg, fresh=False):
    meter = EstimatedMeter(IDLE_W, W_PER_CORE)
    profiler = Profiler(prof_cfg, meter, "test-device")
    backends = discover(CFG)
    models = model_files(ModelConfig(path=str(model_path)))
    return profile_all(backends, models, (1,), CFG, profiler, fresh=fresh)


def test_profiles_every_variant_with_numbers(tiny_model, fast_profiler_cfg):
    profiles = run(tiny_model, fast_profiler_cfg)
    assert {p.engine for p in profiles} >= {"onnxruntime", "openvino", "opencv"}
    # an OpenCL device whose driver cannot build kernels here is recorded as refused, named
    assert {p.device for p in profiles if not p.ok} == set(opencl_devices.broken())
    for p in profiles:
        if opencl_devices.refused_here(p):
            continue
        assert p.ok, p.error
        assert 0 < p.p50_ms <= p.p95_ms <= p.p99_ms
        # min_runs, or 3 where the round ran 4x its time budget first (a loaded host; the
        # profiler's stop rule): 3 runs were seen here beside other work
        assert p.runs >= 3
        # The estimate it is labelled as (inference CPU time x W per core), and never 0 mJ:
        # work that ran is not free. A variant whose energy cannot be billed is a refused
        # profile with its reason (p.ok False above), never one with 0 or NaN mJ.
        assert p.energy_source == "estimated", p
        assert math.isfinite(p.energy_mj) and p.energy_mj > 0, p
        assert p.cpu_ms > 0, p
        assert p.energy_mj == pytest.approx(p.cpu_ms * W_PER_CORE), p
        assert p.actual_device


def test_cache_hit_and_fresh(tiny_model, fast_profiler_cfg):
    first = run(tiny_model, fast_profiler_cfg)
    cached = run(tiny_model, fast_profiler_cfg)
    # read back, not re-measured
    assert opencl_devices.measured(first) == opencl_devices.measured(cached)
    files = list(Path(fast_profiler_cfg.cache_dir).glob("*.json"))
    assert len(files) == len(first)
    again = run(tiny_model, fast_profiler_cfg, fresh=True)
    assert [p.p95_ms for p in again if p.ok] != [p.p95_ms for p in first if p.ok]


def test_corrupt_cache_entry_is_remeasured(tiny_model, fast_profiler_cfg):
    run(tiny_model, fast_profiler_cfg)
    for f in Path(fast_profiler_cfg.cache_dir).glob("*.json"):
        f.write_text("{not json")
    again = run(tiny_model, fast_profiler_cfg)
    assert all(p.ok or opencl_devices.refused_here(p) for p in again)


# A cache entry that parses as JSON but is not a profile this code wrote: a bit flipped on the
# card, a hand edit. Each crashed `serve` (TypeError / KeyError traceback, exit 1: systemd
# restarted it into the same crash for ever) or, with an unknown status, skipped every variant
# as "known to fail" (exit 2, never measured again).
DAMAGED_ENTRIES = [
    ("p95_ms", "fast"),  # TypeError in the selector: '<=' between str and float
    ("energy_mj", None),  # TypeError: must be real number, not NoneType
    ("variant_id", "other/x@y"),  # KeyError: the ladder looks the variant up by this id
    ("status", "weird"),  # neither ok nor a failure this code records
    ("threads", "1"),
    ("options", [1, 2]),
    ("accuracy", "high"),
]


@pytest.mark.parametrize(("key", "bad"), DAMAGED_ENTRIES, ids=[k for k, _ in DAMAGED_ENTRIES])
def test_a_cache_entry_of_the_wrong_shape_is_measured_again(tiny_model, fast_profiler_cfg,
                                                            caplog, key, bad):
    import logging

    bcfg = BackendsConfig(enabled=("onnxruntime",), threads=(1,))
    (backend,) = discover(bcfg)
    models = model_files(ModelConfig(path=str(tiny_model)))

    def run():
        profiler = Profiler(fast_profiler_cfg, EstimatedMeter(5.0, 2.0), "test-device")
        return profile_all([backend], models, (1,), bcfg, profiler)

    first = run()
    files = sorted(Path(fast_profiler_cfg.cache_dir).glob("*.json"))
    assert len(files) == len(first)
    for f in files:
        entry = json.loads(f.read_text())
        entry[key] = bad
        f.write_text(json.dumps(entry))
    with caplog.at_level(logging.WARNING, logger="runtime.choice.profiler"):
        again = run()
    assert [p.variant_id for p in again] == [p.variant_id for p in first]
    for p, was in zip(again, first, strict=True):
        assert p.ok and p.stage == "full", p
        assert isinstance(p.p95_ms, float) and isinstance(p.energy_mj, float), p
        assert isinstance(p.threads, int) and p.options == was.options, p
    said = [r.getMessage() for r in caplog.records if "is unreadable" in r.getMessage()]
    assert len(said) == len(files) and all(key in m for m in said), said
    assert sorted(f.name for f in files) == sorted(Path(m.split()[3]).name for m in said)


def test_a_cache_dir_that_is_a_file_is_one_warning(tmp_path, fast_profiler_cfg, caplog):
    """A file where the cache directory belongs: every variant's lookup warned "unreadable
    (Not a directory)" (9 lines each start for the bundled ladder), beside the one line the
    write side already gave."""
    import logging
    from dataclasses import replace

    (tmp_path / "not-a-dir").write_text("x\n")
    cfg = replace(fast_profiler_cfg, cache_dir=str(tmp_path / "not-a-dir" / "cache"))
    path = tiny_cnn(tmp_path / "m.onnx")
    bcfg = BackendsConfig(enabled=("onnxruntime",), threads=(1, 2))
    profiler = Profiler(cfg, EstimatedMeter(5.0, 2.0), "test-device")
    with caplog.at_level(logging.WARNING, logger="runtime.choice.profiler"):
        profiles = profile_all(discover(bcfg), model_files(ModelConfig(path=str(path))), (1, 2),
                               bcfg, profiler)
    assert len(profiles) >= 2 and all(p.ok for p in profiles)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and "cannot write profile cache" in said[0], said


def test_unsupported_op_fails_one_backend_others_profile(tmp_path, fast_profiler_cfg):
    path = tiny_cnn(tmp_path / "odd.onnx", extra_op="RandomUniformLike")
    profiles = run(path, fast_profiler_cfg)
    failed = [p for p in profiles if not p.ok and not opencl_devices.refused_here(p)]
    assert failed and all(p.engine == "opencv" for p in failed)
    assert all("odd.onnx" in p.error for p in failed)
    assert any(p.ok and p.engine == "onnxruntime" for p in profiles)
    assert any(p.ok and p.engine == "openvino" for p in profiles)


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "runtime.cli", *args], capture_output=True,
                          text=True, check=False, cwd=cwd, timeout=300)


@pytest.fixture
def fast_config(tmp_path):
    p = tmp_path / "fast.toml"
    p.write_text(f"""
[profiler]
warmup_runs = 2
min_runs = 5
time_budget_s = 0.05
idle_baseline_s = 0.05
cache_dir = "{tmp_path / 'cache'}"
[backends]
threads = [1]
""")
    return p


def test_cli_profile_json(tiny_model, fast_config):
    r = cli("profile", str(tiny_model), "--config", str(fast_config), "--json",
            "--latency-ms", "1000")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "edgerun.profile/1"
    assert doc["choice"]["met"] is True
    ids = [v["variant_id"] for v in doc["variants"]]
    assert doc["choice"]["variant"] in ids and set(doc["frontier"]) <= set(ids)
    assert "[1/" in r.stderr  # progress is shown


def test_cli_profile_names_a_refusing_device_and_what_to_do(tiny_model, tmp_path):
    # tests/support/refusing_opencl.py: the real driver refuses a kernel source with an error
    if not opencl_devices.working():
        pytest.skip(f"no OpenCL device builds kernels here: {opencl_devices.broken()}")
    import os

    cfg = tmp_path / "refusing.toml"
    cfg.write_text(f"""
[profiler]
warmup_runs = 2
min_runs = 5
time_budget_s = 0.05
idle_baseline_s = 0.05
cache_dir = "{tmp_path / 'cache'}"
[backends]
enabled = ["onnxruntime"]
plugins = ["support.refusing_opencl:RefusingOpenCl"]
threads = [1]
[backends.onnxruntime]
include_default = false
spinning = [false]
""")
    tests = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "profile", str(tiny_model),
                        "--config", str(cfg), "--latency-ms", "1000"], capture_output=True,
                       text=True, timeout=300, cwd=tests.parent,
                       env={**os.environ, "PYTHONPATH": str(tests)})
    assert r.returncode == 0, r.stderr  # ONNX Runtime ran: the choice is made without them
    for dev in opencl_devices.working():  # (a broken one refuses for its own reason)
        line = next(x for x in r.stdout.splitlines()
                    if x.startswith(f"refused: opencl device {dev} ("))
        assert line.count("error:") == 1 and "undeclared_thing" in line
    assert r.stdout.count("  what to do: its variants are left out") == len(
        opencl_devices.found())
    assert "pocl-opencl-icd" in r.stdout
    assert "BUILD_PROGRAM_FAILURE" not in r.stdout + r.stderr


def test_cli_profile_table_and_unmet_target(tiny_model, fast_config):
    r = cli("profile", str(tiny_model), "--config", str(fast_config), "--latency-ms", "0.00001")
    assert r.returncode == 0, r.stderr
    assert "no variant meets p95 <= 1e-05 ms" in r.stdout
    assert "* = choice" in r.stdout


def test_cli_corrupt_model_is_a_clear_error(tmp_path, fast_config):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\x08\x07garbage")
    r = cli("profile", str(bad), "--config", str(fast_config))
    assert r.returncode == 2
    assert "broken.onnx" in r.stderr and "not a valid ONNX model" in r.stderr
    assert "Traceback" not in r.stderr


def test_cli_dynamic_model_needs_and_takes_input_shape(tmp_path, fast_config):
    dyn = tiny_cnn(tmp_path / "dyn.onnx", hw=("H", "W"))
    r = cli("profile", str(dyn), "--config", str(fast_config))
    assert r.returncode == 2 and "--input-shape" in r.stderr
    r = cli("profile", str(dyn), "--config", str(fast_config), "--input-shape", "1,3,48,48",
            "--latency-ms", "1000")
    assert r.returncode == 0, r.stderr


def test_help_lists_commands():
    r = cli("--help")
    assert r.returncode == 0
    for c in ("profile", "check"):
        assert c in r.stdout


def test_a_cached_profile_takes_the_accuracy_of_the_manifest_now(tiny_model, fast_profiler_cfg):
    # The same file profiled bare (accuracy unknown) and then listed in a manifest with a
    # measured accuracy: the cache hit must carry the manifest's accuracy, not None (seen:
    # a prepared ladder's health said "accuracy unknown" after a bare run had filled the cache).
    from dataclasses import replace

    from runtime.engine.backends import ModelFile

    bcfg = BackendsConfig(enabled=("onnxruntime",), threads=(1,))
    (backend,) = discover(bcfg)
    profiler = Profiler(fast_profiler_cfg, EstimatedMeter(5.0, 2.0), "test-device")
    (bare,) = model_files(ModelConfig(path=str(tiny_model)))
    known = replace(bare, accuracy=0.93)
    first = profile_all([backend], [bare], (1,), bcfg, profiler)
    second = profile_all([backend], [known], (1,), bcfg, profiler)
    assert isinstance(known, ModelFile)
    assert [p.p95_ms for p in first] == [p.p95_ms for p in second]  # a cache hit
    assert all(p.accuracy is None for p in first)
    assert all(p.accuracy == 0.93 for p in second)


# -- the failure record ------------------------------------------------------------------------

def _odd_model(tmp_path):
    # RandomUniformLike: ONNX Runtime and OpenVINO run it, OpenCV DNN cannot
    return tiny_cnn(tmp_path / "odd.onnx", extra_op="RandomUniformLike")


def test_failures_are_recorded_and_skipped_with_one_line_per_kind(tmp_path, fast_profiler_cfg,
                                                                  caplog):
    import logging

    from runtime.choice.report import failure_kinds

    path = _odd_model(tmp_path)
    bcfg = BackendsConfig(enabled=("onnxruntime", "opencv"), threads=(1, 2))
    backends = discover(bcfg)
    models = model_files(ModelConfig(path=str(path)))

    def run(path, cfg, fresh=False):  # two thread counts: two variants of each failure kind
        profiler = Profiler(cfg, EstimatedMeter(5.0, 2.0), "test-device")
        return profile_all(backends, models, (1, 2), bcfg, profiler, fresh=fresh)

    caplog.set_level(logging.DEBUG, logger="runtime.choice.profiler")
    first = run(path, fast_profiler_cfg)
    failed = [p for p in first if not p.ok]
    assert len(failed) > 1 and all(p.stage != "known-failure" for p in failed)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    # one WARNING per kind of failure, not one per variant (24 on the bundled model before)
    assert len(warnings) == len(failure_kinds(failed)) < len(failed)
    assert all("recorded, skipped on later starts" in r.getMessage() for r in warnings)
    caplog.clear()
    second = run(path, fast_profiler_cfg)
    again = [p for p in second if not p.ok]
    assert [p.variant_id for p in again] == [p.variant_id for p in failed]
    assert all(p.stage == "known-failure" and p.error for p in again)  # skipped, cause kept
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    infos = [r.getMessage() for r in caplog.records if "known to fail" in r.getMessage()]
    assert len(infos) == len(failure_kinds(again))
    # --fresh tries them again
    fresh = run(path, fast_profiler_cfg, fresh=True)
    assert all(p.stage != "known-failure" for p in fresh if not p.ok)


def test_a_failure_record_is_invalidated_by_a_new_engine_version_or_model(tmp_path,
                                                                          fast_profiler_cfg):
    from dataclasses import replace

    path = _odd_model(tmp_path)
    bcfg = BackendsConfig(enabled=("opencv",), threads=(1,))
    (backend,) = discover(bcfg)
    profiler = Profiler(fast_profiler_cfg, EstimatedMeter(5.0, 2.0), "test-device")
    (form,) = model_files(ModelConfig(path=str(path)))
    (b, d, v), *_ = plan([backend], [form], (1,), bcfg)
    p = profiler.profile(b, d, v)
    assert not p.ok
    assert profiler.lookup(v, d).stage == "known-failure"
    newer = replace(d, details={**d.details, "version": d.details["version"] + ".1"})
    assert profiler.lookup(v, newer) is None  # an upgraded engine is tried again
    tiny_cnn(path, extra_op="RandomUniformLike", seed=1)  # same path, other weights
    assert Profiler(fast_profiler_cfg, EstimatedMeter(5.0, 2.0),
                    "test-device").lookup(v, d) is None


# -- the fast schedule on real engines -----------------------------------------------------------

def _work(model_path, bcfg=CFG):
    backends = discover(bcfg)
    return plan(backends, model_files(ModelConfig(path=str(model_path))), (1,), bcfg)


def test_quick_round_then_refinement_measures_the_choice_at_full_length(tiny_model,
                                                                        fast_profiler_cfg):
    from runtime.choice.refine import keep
    from runtime.choice.selector import Constraints, select

    c = Constraints(1000)
    work = _work(tiny_model)
    profiler = Profiler(fast_profiler_cfg, EstimatedMeter(5.0, 2.0), "test-device")
    quick, hits, later = quick_pass(quick_order(work), profiler)
    assert hits == 0 and later == [] and len(quick) == len(work)
    assert {p.stage for p in quick if p.ok} == {"quick"}
    assert max(p.runs for p in quick if p.ok) <= 50 // 16 + 3  # a sixteenth of max_runs
    final = refine(work, quick, profiler, c)
    assert [p.variant_id for p in final] == [v.id for _, _, v in work]
    choice = select(final, c).profile
    assert choice.stage == "full" and choice.runs >= fast_profiler_cfg.min_runs
    # everything still in the race was measured at full length; the rest was pruned early
    kept = keep(final, c)
    assert all(p.stage == "full" for p in final if p.variant_id in kept)
    # a second start: everything from the cache, nothing left to refine
    again, hits, _ = quick_pass(quick_order(work), Profiler(
        fast_profiler_cfg, EstimatedMeter(5.0, 2.0), "test-device"))
    assert hits == len(work) and to_refine(again, c) == 0
    assert opencl_devices.measured(again) == opencl_devices.measured(final)


def test_quick_round_stops_when_enough_and_hands_back_the_rest(tiny_model, fast_profiler_cfg):
    work = _work(tiny_model)
    profiler = Profiler(fast_profiler_cfg, EstimatedMeter(5.0, 2.0), "test-device")
    done, _, later = quick_pass(work, profiler, enough=lambda ps: len(ps) >= 2)
    assert len(done) == 2 and [v.id for _, _, v in later] == [v.id for _, _, v in work[2:]]


def test_quick_order_puts_one_variant_of_every_form_first():
    from types import SimpleNamespace as NS

    def w(engine, form, i):
        return (None, None, NS(engine=engine, model=NS(name=form), id=f"{form}{i}@{engine}"))

    work = [w("opencv", "a", 0), w("onnxruntime", "a", 0), w("onnxruntime", "a", 1),
            w("onnxruntime", "b", 0), w("onnxruntime", "b", 1), w("openvino", "a", 0)]
    assert [x[2].id for x in quick_order(work)] == [
        "a0@onnxruntime", "b0@onnxruntime", "a1@onnxruntime", "b1@onnxruntime",
        "a0@openvino", "a0@opencv"]


class _Checked:
    """A real session whose inferences must run while `lock` is held."""

    def __init__(self, session, lock):
        self._s, self._lock = session, lock

    def infer(self, x):
        assert self._lock.locked(), "an inference outside the pause gate"
        return self._s.infer(x)

    def __getattr__(self, name):
        return getattr(self._s, name)


class _Gated:
    """A real backend whose sessions check the pause gate."""

    def __init__(self, backend, lock):
        self._b, self._lock = backend, lock

    def load(self, variant):
        return _Checked(self._b.load(variant), self._lock)

    def __getattr__(self, name):
        return getattr(self._b, name)


def test_every_inference_runs_inside_the_pause_gate(tiny_model, fast_profiler_cfg):
    # The daemon passes the pipeline's per-frame lock: a measuring inference must never run
    # outside it (it would share the CPU with a served frame), and the gate must be let go
    # between chunks (or a served frame would wait for the whole measurement).
    import threading

    from runtime.choice.refine import rounds

    bcfg = BackendsConfig(enabled=("onnxruntime",), threads=(1,))
    ((b, _d, v), *_) = _work(tiny_model, bcfg)
    lock = threading.Lock()
    entries = []

    def gate():
        entries.append(1)
        return lock

    profiler = Profiler(fast_profiler_cfg, EstimatedMeter(5.0, 2.0), "test-device")
    s = rounds(2, 5, 100000, 0.3)[-1]  # 0.3 s of measuring: many 20 ms chunks
    p = profiler.measure(_Gated(b, lock), v, s, pause=gate)
    assert p.ok, p.error
    assert len(entries) >= 2 + 3  # warm-ups one by one, then several chunks
    assert not lock.locked()


def test_a_background_reprofile_measures_every_round_inside_the_gate(tmp_path, tiny_model):
    # measure_model with a pause gate (the daemon's re-profile while serving): the quick
    # round too, not only the refinement (an inference outside the gate fails its variant).
    import threading

    from runtime.choice.measure import measure_model
    from runtime.choice.selector import Constraints
    from runtime.config import from_dict

    cfg = from_dict({"backends": {"enabled": ["onnxruntime"], "threads": [1]},
                     "profiler": {"idle_baseline_s": 0.05, "cache_dir": str(tmp_path / "c"),
                                  "warmup_runs": 2, "min_runs": 5, "max_runs": 50,
                                  "time_budget_s": 0.05}})
    lock = threading.Lock()
    backends = [_Gated(b, lock) for b in discover(cfg.backends)]
    m = measure_model(tiny_model, cfg, backends, EstimatedMeter(5.0, 2.0), "generic-x86", 2.0,
                      None, lambda *a: None, lambda *a: None, Constraints(1000),
                      pause=lambda: lock)
    assert m.profiles and all(p.ok for p in m.profiles), [p.error for p in m.profiles]


def test_a_fresh_reprofile_measures_again_but_does_not_retry_known_failures(tmp_path,
                                                                             fast_profiler_cfg):
    # A re-profile for heat or throttling (fresh) must not try OpenCV's unsupported op again
    # (and warn again); only `edgerun profile --fresh` does.
    path = _odd_model(tmp_path)
    bcfg = BackendsConfig(enabled=("onnxruntime", "opencv"), threads=(1,))
    work = _work(path, bcfg)

    def profiler():
        return Profiler(fast_profiler_cfg, EstimatedMeter(5.0, 2.0), "test-device")

    first, _, _ = quick_pass(work, profiler())
    assert any(not p.ok for p in first)
    again, hits, _ = quick_pass(work, profiler(), fresh=True)
    failed = [p for p in again if not p.ok]
    assert failed and all(p.stage == "known-failure" for p in failed)
    assert hits == len(failed)  # only the failure records came from the cache
    assert all(p.stage == "quick" for p in again if p.ok)
    b, d, v = next(w for w in work if w[2].engine == "opencv")
    assert profiler().profile(b, d, v, fresh=True, retry_failed=False).stage == "known-failure"
    assert profiler().profile(b, d, v, fresh=True).stage == "full"  # --fresh: tried again


def test_measure_first_serves_early_and_rest_completes_the_schedule(tmp_path):
    from models import bundled
    from runtime.choice.measure import measure_first
    from runtime.choice.selector import Constraints
    from runtime.config import from_dict

    if not (bundled() / "manifest.json").exists():
        pytest.skip("bundled model not built")

    def cfg(**profiler):
        return from_dict({
            "backends": {"enabled": ["onnxruntime"], "threads": [1],
                         "onnxruntime": {"spinning": [False], "include_default": False}},
            "profiler": {"idle_baseline_s": 0.05, "cache_dir": str(tmp_path / "c"),
                         "warmup_runs": 2, "min_runs": 5, "max_runs": 80,
                         "time_budget_s": 0.05, **profiler}})

    c = Constraints(1000)
    backends = discover(cfg().backends)

    def first(conf):
        return measure_first(bundled(), conf, backends, EstimatedMeter(5.0, 2.0), "generic-x86",
                             2.0, None, lambda *a: None, lambda *a: None, c)

    m, rest = first(cfg(first_decision_s=0))
    n_forms = len({p.model for p in m.profiles})
    assert rest is not None and len(m.profiles) == n_forms  # one per form, then serve
    final = rest(None)
    assert len(final.profiles) > len(m.profiles)
    assert {p.stage for p in final.profiles} >= {"full"}
    # warm: nothing left, the same final choice at once
    m2, rest2 = first(cfg(first_decision_s=0))
    assert rest2 is None and len(m2.profiles) == len(final.profiles)
    # the exhaustive schedule: everything at full length before returning, nothing after
    m3, rest3 = first(cfg(schedule="exhaustive", cache_dir=str(tmp_path / "x")))
    assert rest3 is None and {p.stage for p in m3.profiles} == {"full"}


class _Scripted:
    """The profiler's measuring replaced by a script of energies per variant (the schedule's
    decisions given measurements, not a timing test); caching as the real one."""

    def __init__(self, real, script):
        self._real, self.script, self.calls = real, script, []

    @property
    def cfg(self):
        return self._real.cfg

    def record(self, v, d, p):
        self._real.record(v, d, p)

    def lookup(self, v, d):
        return self._real.lookup(v, d)

    def measure(self, backend, v, s, pause=None):
        self.calls.append((v.id, s.final))
        energies = self.script.get(v.id, [3.0])
        n = sum(1 for vid, _ in self.calls if vid == v.id)
        mj = energies[min(n, len(energies)) - 1]
        return Profile(v.id, v.model.name, v.precision, v.engine, v.device, v.threads,
                       p50_ms=1.0, p95_ms=1.0, p99_ms=1.0, runs=30, energy_mj=mj,
                       energy_source="estimated", accuracy=v.model.accuracy,
                       options=dict(v.options), stage="full" if s.final else "quick",
                       energy_ci=0.01, latency_ci=0.01)


def test_refine_measures_near_ties_again_and_chooses_on_the_combined_numbers(
        tiny_model, fast_profiler_cfg):
    from runtime.choice.selector import Constraints, select

    work = _work(tiny_model)
    assert len(work) >= 3
    a, b = work[0][2].id, work[1][2].id
    # quick, refined, full, full again: a looks cheaper once at full length (by 3 %, inside
    # the noise band); measured again it is the dearer one
    script = {a: [1.0, 1.0, 1.0, 1.3], b: [1.02, 1.02, 1.03, 1.0]}
    prof = _Scripted(Profiler(fast_profiler_cfg, EstimatedMeter(5.0, 2.0), "test-device"),
                     script)
    c = Constraints(1000)
    quick, _, _ = quick_pass(work, prof)
    final = refine(work, quick, prof, c)
    full = [vid for vid, final_len in prof.calls if final_len]
    assert full.count(a) == 2 and full.count(b) == 2  # each finalist measured again once
    assert all(full.count(v.id) == 0 for _, _, v in work[2:])  # the clear losers were not
    choice = select(final, c).profile
    assert choice.variant_id == b and choice.runs == 60
    assert choice.energy_mj == pytest.approx(1.015)


def test_a_finished_refinement_is_not_run_again_on_a_warm_start(tmp_path):
    # The background refinement re-measured the near-ties at full length on every start,
    # beside the frames, even with every profile cached: once it has finished against the
    # same variants and constraints, a warm start is final. Its record is keyed by every
    # variant's cache key and the constraints: another target refines again.
    from models import bundled
    from runtime.choice.measure import measure_first
    from runtime.choice.selector import Constraints
    from runtime.config import from_dict

    if not (bundled() / "manifest.json").exists():
        pytest.skip("bundled model not built")
    conf = from_dict({
        "backends": {"enabled": ["onnxruntime"], "threads": [1],
                     "onnxruntime": {"spinning": [False], "include_default": False}},
        "profiler": {"idle_baseline_s": 0.05, "cache_dir": str(tmp_path / "c"),
                     "warmup_runs": 2, "min_runs": 5, "max_runs": 80, "time_budget_s": 0.05,
                     "first_decision_s": 0}})
    backends = discover(conf.backends)
    meter = EstimatedMeter(5.0, 2.0)

    def first(c):
        return measure_first(bundled(), conf, backends, meter, "generic-x86", 2.0, None,
                             lambda *a: None, lambda *a: None, c)

    c = Constraints(1000)
    _, rest = first(c)
    assert rest is not None
    final = rest(None)
    # a cache as a finished refinement can leave it: the choice's entry not at full length
    # (so `to_refine` alone would refine again)
    profiler = Profiler(conf.profiler, meter, "generic-x86", active_w_per_core=2.0)
    work = plan(backends, model_files(ModelConfig(path=str(bundled()))), (1,), conf.backends)
    choice = min((p for p in final.profiles if p.ok), key=lambda p: p.energy_mj)
    _b, d, v = next(w for w in work if w[2].id == choice.variant_id)
    cached = profiler.lookup(v, d)
    assert cached is not None
    profiler.record(v, d, Profile(**{**cached.__dict__, "stage": "quick"}))
    assert to_refine([profiler.lookup(v_, d_) for _b, d_, v_ in work], c) > 0
    m2, rest2 = first(c)
    assert rest2 is None and len(m2.profiles) == len(final.profiles)
    # another latency target: not the refinement that finished
    _, rest3 = first(Constraints(500))
    assert rest3 is not None
    # the record gone (a cache cleared by hand): refined again
    for f in (tmp_path / "c").glob("refined-*.done"):
        f.unlink()
    _, rest4 = first(c)
    assert rest4 is not None


def test_the_cache_is_keyed_by_content_and_a_failure_names_this_copy(tmp_path,
                                                                     fast_profiler_cfg):
    """Two checkouts sharing one cache: the second copy of a model takes the first copy's
    entries (same bytes, same key) and its known failures name its own path, not the
    other checkout's (issue 32)."""
    import shutil

    bcfg = BackendsConfig(enabled=("onnxruntime", "opencv"), threads=(1,))
    (tmp_path / "checkout-a").mkdir()
    first = _odd_model(tmp_path / "checkout-a")
    second = tmp_path / "checkout-b" / "odd.onnx"
    second.parent.mkdir()
    shutil.copyfile(first, second)

    def failures(path):
        profiler = Profiler(fast_profiler_cfg, EstimatedMeter(5.0, 2.0), "test-device")
        out, hits, _ = quick_pass(_work(path, bcfg), profiler)
        return [p for p in out if not p.ok], hits

    measured, hits = failures(first)
    assert measured and hits == 0 and all(str(first) in p.error for p in measured)
    known, hits = failures(second)
    assert hits == len(_work(second, bcfg))  # every entry shared: keyed by content
    assert known and all(p.stage == "known-failure" for p in known)
    for p in known:
        assert str(second) in p.error and "checkout-a" not in p.error, p.error
    # on disk the entry names neither copy
    stored = [json.loads(f.read_text()) for f in Path(fast_profiler_cfg.cache_dir).glob("*.json")]
    assert any(d["error"] for d in stored)
    assert not any("checkout-" in d["error"] for d in stored)


def test_an_entry_of_the_previous_cache_format_is_a_miss(tmp_path, fast_profiler_cfg):
    """Upgrading edgerun with a cache of the previous schema's entries: they are not read
    (another key), so each variant is measured again, never misread."""
    from runtime.choice import profiler as profiler_mod

    work = _work(_odd_model(tmp_path), BackendsConfig(enabled=("onnxruntime",), threads=(1,)))
    old = Profiler(fast_profiler_cfg, EstimatedMeter(5.0, 2.0), "test-device")
    b, d, v = work[0]
    now = profiler_mod.CACHE_SCHEMA
    try:
        profiler_mod.CACHE_SCHEMA = now - 1
        old_key = old.cache_key(v, d)
    finally:
        profiler_mod.CACHE_SCHEMA = now
    cache = Path(fast_profiler_cfg.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    p = old.measure(b, v, profiler_mod.full_settings(fast_profiler_cfg))
    (cache / f"{old_key}.json").write_text(json.dumps(
        {**p.__dict__, "error": f"cannot run {v.model.path}", "status": "failed"}))
    assert old.cache_key(v, d) != old_key and old.lookup(v, d) is None
    _, hits, _ = quick_pass(work, Profiler(fast_profiler_cfg, EstimatedMeter(5.0, 2.0), "t"))
    assert hits == 0


def test_the_default_cache_is_under_xdg_cache_home(tmp_path, monkeypatch):
    from runtime.config import ProfilerConfig

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert ProfilerConfig().cache_path() == tmp_path / "xdg" / "edgerun" / "profiles"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # the XDG spec: ignored
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert ProfilerConfig().cache_path() == tmp_path / "home/.cache/edgerun/profiles"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert ProfilerConfig().cache_path() == tmp_path / "home/.cache/edgerun/profiles"
    # a configured directory wins, `~` expanded
    assert ProfilerConfig(cache_dir="~/p").cache_path() == tmp_path / "home/p"


def test_a_cache_that_cannot_be_written_is_said_once_not_per_variant(tmp_path, tiny_model,
                                                                     fast_profiler_cfg, caplog):
    """A cache directory on a read-only mount (or a file in its place) logged one warning
    per variant stored, every round: 29 lines in the first 4 s of `serve`, and again at every
    re-profile. Once is the news; the profiles are still measured and used."""
    import logging
    from dataclasses import replace

    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache directory belongs\n")
    cfg = replace(fast_profiler_cfg, cache_dir=str(blocked))
    with caplog.at_level(logging.WARNING, logger="runtime.choice.profiler"):
        first = run(tiny_model, cfg)
        run(tiny_model, cfg)
    said = [r.getMessage() for r in caplog.records if "cannot write profile cache" in
            r.getMessage()]
    assert len(first) > 1 and len(said) == 1, said
    assert str(blocked) in said[0]
    assert all(p.ok or opencl_devices.refused_here(p) for p in first)
