"""`edgerun profile`'s table: sorted (choice, frontier, the rest by energy), terminal-width,
failures summarised one line per kind; `--all` lists everything; `--engine`/`--threads`."""

from __future__ import annotations

import json
import subprocess
import sys

from runtime.choice.report import failure_kinds, profile_table
from runtime.choice.selector import Constraints, Profile, frontier, select


def _ok(i: int, energy: float, acc: float, opts: str = "") -> Profile:
    return Profile(f"m/fp32@onnxruntime:CPU/t{i}{opts}", "m", "fp32", "onnxruntime", "CPU", i,
                   actual_device="CPU", p50_ms=1.0, p95_ms=1.0 + i / 100, p99_ms=2.0, runs=30,
                   energy_mj=energy, energy_source="rapl", cpu_ms=1.0, accuracy=acc)


def _failed(engine: str, i: int, cause: str) -> Profile:
    return Profile(f"m/int8@{engine}:CPU/t{i}", "m", "int8", engine, "CPU", i, status="failed",
                   error=f"{engine} cannot run /models/m/int8.onnx: {cause}")


def _profiles() -> list[Profile]:
    ok = [_ok(i, energy=5.0 - i * 0.1, acc=0.90) for i in range(1, 31)]  # t30 cheapest
    ok += [_ok(40, energy=9.0, acc=0.95), _ok(41, energy=0.5, acc=0.80)]
    fails = [_failed("opencv", i, "layer QuantizeLinear is not supported") for i in range(24)]
    fails += [_failed("openvino", i, "bf16 is not supported on this CPU") for i in range(2)]
    mixed = []  # measured order interleaves everything
    for a, b in zip(ok, fails, strict=False):
        mixed += [b, a]
    return mixed + ok[len(fails):] + fails[len(ok):]


def test_table_is_sorted_short_and_summarises_failures():
    profiles = _profiles()
    choice = select(profiles, Constraints(latency_ms=10, accuracy_floor=0.85))
    front = {p.variant_id for p in frontier(profiles)}
    text = profile_table(profiles, choice, front, width=100)
    lines = text.splitlines()
    assert all(len(ln) <= 100 for ln in lines)
    rows = [ln for ln in lines[1:] if ln.startswith(("*  ", "f  ", " " * 3))]
    ids = [ln.split()[1] if ln[0] in "*f" else ln.split()[0] for ln in rows]
    assert ids[0] == choice.profile.variant_id == "m/fp32@onnxruntime:CPU/t30"
    assert lines[1].startswith("*")
    # then the frontier by energy (t41 0.5 mJ, t40 9 mJ), then the 10 cheapest others
    assert ids[1:3] == ["m/fp32@onnxruntime:CPU/t41", "m/fp32@onnxruntime:CPU/t40"]
    assert ids[3:13] == [f"m/fp32@onnxruntime:CPU/t{i}" for i in range(29, 19, -1)]
    assert len(ids) == 13
    assert "... 19 more variants that ran" in text
    summary = [ln for ln in lines if ln.lstrip().startswith("failed")]
    assert summary == [
        "  failed: 24 opencv variants (m/int8@opencv:CPU/t0, ...): layer QuantizeLinear is "
        "not supported",
        "  failed: 2 openvino variants (m/int8@openvino:CPU/t0, ...): bf16 is not supported "
        "on this CPU"]
    assert "32 of 58 variants ran" in lines[-2]


def test_all_lists_every_variant_and_error():
    profiles = _profiles()
    choice = select(profiles, Constraints(latency_ms=10, accuracy_floor=0.85))
    text = profile_table(profiles, choice, {p.variant_id for p in frontier(profiles)},
                         all_rows=True, width=200)
    for p in profiles:
        assert p.variant_id in text
    assert text.count("failed m/int8@opencv") == 24  # each error below the table
    assert "more variants" not in text
    failed_rows = [ln for ln in text.splitlines() if ln.rstrip().endswith("failed")]
    assert len(failed_rows) == 26


def test_narrow_terminal_drops_columns_then_shortens_ids():
    long = [_ok(i, 1.0 + i, 0.9, opts=",spinning=0,graph_optimization=all,x=" + "y" * 40)
            for i in range(1, 4)]
    choice = select(long, Constraints(latency_ms=10))
    text = profile_table(long, choice, set(), width=72)
    lines = text.splitlines()
    assert all(len(ln) <= 72 for ln in lines), text
    assert "p99 ms" not in lines[0] and "mJ/inf" in lines[0] and "acc" in lines[0]
    assert "~" in lines[1]  # the id was shortened, visibly


def test_failure_kinds_group_by_engine_and_cause():
    kinds = failure_kinds([_failed("opencv", 1, "a"), _failed("opencv", 2, "a"),
                           _failed("opencv", 3, "b"), _failed("openvino", 1, "a")])
    assert kinds[0] == ("opencv", "a", ["m/int8@opencv:CPU/t1", "m/int8@opencv:CPU/t2"])
    assert {(e, c) for e, c, _ in kinds[1:]} == {("opencv", "b"), ("openvino", "a")}


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "runtime.cli", *map(str, args)],
                          capture_output=True, text=True, check=False, timeout=300)


def test_profile_engine_and_threads_filters(tiny_model, tmp_path):
    cfg = tmp_path / "fast.toml"
    cfg.write_text(f'[profiler]\nwarmup_runs = 2\nmin_runs = 5\ntime_budget_s = 0.05\n'
                   f'idle_baseline_s = 0.05\ncache_dir = "{tmp_path / "cache"}"\n')
    r = _cli("profile", tiny_model, "--config", cfg, "--engine", "onnxruntime", "--threads", "1",
             "--latency-ms", "1000", "--json")
    assert r.returncode == 0, r.stderr
    ids = [v["variant_id"] for v in json.loads(r.stdout)["variants"]]
    assert ids and all("@onnxruntime:" in i and "/t1" in i for i in ids)
    r = _cli("profile", tiny_model, "--config", cfg, "--engine", "tensorrt")
    assert r.returncode == 2 and "--engine tensorrt: not an engine" in r.stderr
    assert "Traceback" not in r.stderr


def test_known_failures_from_the_cache_say_so_in_their_summary_line():
    from dataclasses import replace

    profiles = _profiles()
    profiles = [replace(p, stage="known-failure") if p.engine == "opencv" and not p.ok else p
                for p in profiles]
    choice = select(profiles, Constraints(latency_ms=10, accuracy_floor=0.85))
    text = profile_table(profiles, choice, set(), width=200)
    summary = [ln for ln in text.splitlines() if ln.lstrip().startswith("failed")]
    assert summary[0].startswith("  failed: 24 opencv variants (m/int8@opencv:CPU/t0, ...) "
                                 "[known from the cache; --fresh tries again]: layer")
    assert "known from the cache" not in summary[1]  # openvino's were tried this run
