"""Shared fixtures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# What tests share lives in tests/support/ (a package: `from support.modelgen import ...`);
# test files never import each other. tests/ is on the path for it.
_HERE = Path(__file__).parent
sys.path.insert(0, str(_HERE))

from support.modelgen import tiny_cnn  # noqa: E402 (after the path it is found on)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A small CNN with a dynamic batch dimension, input [N,3,32,32]."""
    return tiny_cnn(tmp_path_factory.mktemp("models") / "tiny.onnx")


@pytest.fixture
def broker(tmp_path):
    """A real Mosquitto on a free loopback port with authentication and the fleet ACL on
    (anonymous refused). Log in with `broker.device(fleet, device)`,
    `broker.coordinator(fleet[, name])` or `broker.client(name, read=..., write=...)`: each
    enrols the identity (reloading the broker) and returns the BrokerConfig to connect with."""
    from runtime.wire.broker import Mosquitto

    b = Mosquitto(tmp_path).start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def profile_cache(tmp_path_factory):
    """A profile cache shared by a module's daemons: each variant is measured once."""
    return tmp_path_factory.mktemp("profiles")


@pytest.fixture
def fleet(tmp_path, profile_cache):
    """Mosquitto + coordinator + API for over-the-air tests (tests/support/ota_harness.py); start
    daemons with `fleet.device()`. Every daemon must exit 0 at the end."""
    from support.ota_harness import Fleet

    f = Fleet(tmp_path, profile_cache)
    yield f
    f.close()


@pytest.fixture
def fast_profiler_cfg(tmp_path):
    """Profiler settings that keep a test run short."""
    from runtime.config import ProfilerConfig

    return ProfilerConfig(warmup_runs=2, min_runs=5, max_runs=50, time_budget_s=0.05,
                          idle_baseline_s=0.05, cache_dir=str(tmp_path / "cache"))


def pytest_collection_modifyitems(config, items):
    """`@pytest.mark.slow` tests run only with EDGERUN_SLOW=1, as pyproject's marker promises
    (a test that only carried the marker used to run in CI anyway)."""
    if os.environ.get("EDGERUN_SLOW"):
        return
    skip = pytest.mark.skip(reason="slow soak/fault test: set EDGERUN_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def postgres():
    """A throw-away PostgreSQL cluster for the session (runtime/coordinator/pgserver.py).
    Skipped where the server or psycopg is missing, except in CI (.ci/run installs both)."""
    from runtime.coordinator.pgserver import TempPostgres, pg_bindir

    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
        missing = None if pg_bindir() else "PostgreSQL server binaries"
    except ImportError:
        missing = "psycopg (pip install -e '.[postgres]')"
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"{missing} not installed: .ci/run should have installed it")
        pytest.skip(f"{missing} not installed")
    pg = TempPostgres().start()
    yield pg
    pg.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request, tmp_path):
    """A fresh coordinator store on each backend: an SQLite path, then a new PostgreSQL
    database in the session cluster."""
    if request.param == "sqlite":
        return str(tmp_path / "store.db")
    import uuid

    return request.getfixturevalue("postgres").create_database(f"t{uuid.uuid4().hex[:12]}")
