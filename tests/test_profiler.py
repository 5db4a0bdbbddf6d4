"""The profiler on real engines: percentiles, energy with its source, cache, failures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from modelgen import tiny_cnn

from power.sensors import EstimatedMeter
from runtime.backends import discover
from runtime.config import BackendsConfig, ModelConfig
from runtime.profiler import Profiler, model_files, profile_all

CFG = BackendsConfig(threads=(1,))


def run(model_path, prof_cfg, fresh=False):
    meter = EstimatedMeter(5.0, 2.0)
    profiler = Profiler(prof_cfg, meter, "test-device")
    backends = discover(CFG)
    models = model_files(ModelConfig(path=str(model_path)))
    return profile_all(backends, models, (1,), CFG, profiler, fresh=fresh)


def test_profiles_every_variant_with_numbers(tiny_model, fast_profiler_cfg):
    profiles = run(tiny_model, fast_profiler_cfg)
    assert {p.engine for p in profiles} >= {"onnxruntime", "openvino", "opencv"}
    for p in profiles:
        assert p.ok, p.error
        assert 0 < p.p50_ms <= p.p95_ms <= p.p99_ms
        assert p.runs >= fast_profiler_cfg.min_runs
        assert p.energy_source == "estimated" and p.energy_mj >= 0
        assert p.actual_device


def test_cache_hit_and_fresh(tiny_model, fast_profiler_cfg):
    first = run(tiny_model, fast_profiler_cfg)
    cached = run(tiny_model, fast_profiler_cfg)
    assert [p.p95_ms for p in first] == [p.p95_ms for p in cached]  # read back, not re-measured
    files = list(Path(fast_profiler_cfg.cache_dir).glob("*.json"))
    assert len(files) == len(first)
    again = run(tiny_model, fast_profiler_cfg, fresh=True)
    assert [p.p95_ms for p in again] != [p.p95_ms for p in first]


def test_corrupt_cache_entry_is_remeasured(tiny_model, fast_profiler_cfg):
    run(tiny_model, fast_profiler_cfg)
    for f in Path(fast_profiler_cfg.cache_dir).glob("*.json"):
        f.write_text("{not json")
    assert all(p.ok for p in run(tiny_model, fast_profiler_cfg))


def test_unsupported_op_fails_one_backend_others_profile(tmp_path, fast_profiler_cfg):
    path = tiny_cnn(tmp_path / "odd.onnx", extra_op="RandomUniformLike")
    profiles = run(path, fast_profiler_cfg)
    failed = [p for p in profiles if not p.ok]
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

    from runtime.backends import ModelFile

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
