"""Shared fixtures."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time
from pathlib import Path

import pytest

# What tests share lives in tests/support/ (a package: `from support.modelgen import ...`);
# test files never import each other. tests/ is on the path for it.
_HERE = Path(__file__).parent
sys.path.insert(0, str(_HERE))

from support import children  # noqa: E402 (after the path it is found on)
from support.modelgen import tiny_cnn  # noqa: E402


@pytest.hookimpl(trylast=True)  # after pytest's faulthandler plugin, whose file this replaces
def pytest_configure(config):
    """Every process a test starts dies with the pytest process that runs the test, even one
    that crashes or is killed (tests/support/children.py).

    With EDGERUN_TEST_RUNNING_DIR set (.ci/run), this process's threads' stacks go to
    `<that folder>/<gw0|gw1|main>.stacks`, which .ci/run prints: on a fatal signal (a crash
    in native code; an xdist worker's stderr, where pytest sends them, is never shown) and
    on SIGINT (what .ci/run's wall limit sends) before the KeyboardInterrupt."""
    children.install()
    folder = os.environ.get("EDGERUN_TEST_RUNNING_DIR")
    if folder:
        stacks = (Path(folder) / f"{_process_name()}.stacks").open("w")
        _KEEP_OPEN.append(stacks)  # faulthandler writes to its fd: it must outlive this call
        faulthandler.enable(file=stacks, all_threads=True)
        faulthandler.register(signal.SIGINT, file=stacks, all_threads=True, chain=True)


_KEEP_OPEN: list = []


def _process_name() -> str:
    """This pytest process's name in EDGERUN_TEST_RUNNING_DIR: its xdist worker id, or
    `main` (pytest alone, or the xdist controller, which runs no test)."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def _leads_the_run(config) -> bool:
    """True in the process that leads the run: the xdist controller, or pytest alone (not in
    an xdist worker)."""
    return not hasattr(config, "workerinput")


def pytest_sessionstart(session):
    """Stop and remove the PostgreSQL clusters an earlier run's dead workers left behind."""
    if _leads_the_run(session.config):
        from runtime.coordinator.pgserver import reap_orphans

        reap_orphans()


def pytest_unconfigure(config):
    """Once every worker has ended: stop and remove the clusters of any that died (a worker
    that ends normally stops its own in the `postgres` fixture's teardown)."""
    if _leads_the_run(config):
        from runtime.coordinator.pgserver import reap_orphans

        reap_orphans()
    children.uninstall()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With EDGERUN_TEST_RUNNING_DIR set (.ci/run), each process running tests keeps the test
    it runs (from its setup to its teardown) in `<that folder>/<gw0|gw1|main>.test`, emptied
    when the test ends and kept when it is interrupted: what .ci/run prints when its wall
    limit ends a run that did not finish."""
    folder = os.environ.get("EDGERUN_TEST_RUNNING_DIR")
    if not folder:
        return (yield)
    name = Path(folder) / f"{_process_name()}.test"
    name.write_text(f"{item.nodeid}  (pid {os.getpid()}, since "
                    f"{time.strftime('%H:%M:%S')})\n")
    result = yield  # (an interruption raises here: the name stays)
    name.write_text("")
    return result


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


@pytest.fixture
def coordinator(tmp_path, broker):
    """A Coordinator of fleet "sys" on `broker` (connected), storing to tmp_path/coord.db:
    where the harness's broker configs (support.daemon_harness) publish."""
    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.service import Coordinator

    c = Coordinator(CoordinatorConfig(fleet="sys", broker=broker.coordinator("sys"),
                                      store=str(tmp_path / "coord.db")))
    c.start()
    assert c.connected.wait(30)
    yield c
    c.stop()


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
