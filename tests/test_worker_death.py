"""A test worker that dies (a crash, SIGKILL) leaves no server behind (issue 32: a dead xdist
worker leaked a running PostgreSQL cluster, 488 MB in /tmp).

The worker here is a real pytest process with tests/conftest.py as its plugin, running a test
that holds the `postgres` and `broker` fixtures and (where installed) a chromium with its
chromedriver; it is SIGKILLed mid-test, so no teardown runs. Its children end by their
parent-death signal (tests/support/children.py); the cluster, which pg_ctl daemonized, by the
reaper the next run (or the run's controller) calls (runtime/coordinator/pgserver.py
`reap_orphans`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.under_test import child_env
from support.waiting import wait
from support.webdriver import find_browser

from runtime.coordinator.pgserver import pg_bindir, reap_orphans
from runtime.wire.broker import mosquitto_path

TESTS = Path(__file__).resolve().parent

HOLDER = '''
import json, os, time
from pathlib import Path

from support.webdriver import Browser, find_browser

def test_holds_its_servers(postgres, broker, tmp_path):
    pm = int((postgres.dir / "data" / "postmaster.pid").read_text().split()[0])
    servers = {"cluster": str(postgres.dir), "postmaster": pm, "mosquitto": broker.proc.pid}
    if find_browser():
        b = Browser(*find_browser(), tmp_path)
        servers.update(chromium=b.browser.pid, chromedriver=b.proc.pid,
                       profile=str(tmp_path / "chromium-profile"))
    out = Path(os.environ["HOLDER_OUT"])  # whole or absent: the test reads it once it exists
    out.with_suffix(".tmp").write_text(json.dumps(servers))
    out.with_suffix(".tmp").replace(out)
    time.sleep(600)
'''


def _using(path: str) -> list[int]:
    """Live processes whose command line names `path` (a chromium profile: the browser
    and every helper process it started)."""
    pids = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and path in (d / "cmdline").read_text() and _alive(int(d.name)):
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, left for an init that reaps it, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in "ZX"


@pytest.mark.skipif(pg_bindir() is None or mosquitto_path() is None,
                    reason="needs PostgreSQL's server binaries and Mosquitto")
@pytest.mark.timeout(240)
def test_a_killed_worker_leaves_no_server_and_no_cluster_behind(tmp_path):
    (tmp_path / "test_holder.py").write_text(HOLDER)
    out = tmp_path / "servers.json"
    env = child_env(TESTS, HOLDER_OUT=str(out))
    for own in ("EDGERUN_TEST_RUNNING_DIR", "PYTEST_XDIST_WORKER"):  # this run's, not its
        env.pop(own, None)
    worker = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
         "-p", "conftest", "-c", os.devnull, "--rootdir", str(tmp_path),
         "--basetemp", str(tmp_path / "basetemp"), str(tmp_path / "test_holder.py")],
        cwd=tmp_path, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline_s = 180
        wait(lambda: out.exists() or worker.poll() is not None, deadline_s, "the servers")
        assert out.exists(), f"the worker exited {worker.returncode}: {worker.stdout.read()}"
        servers = json.loads(out.read_text())
        assert ("chromium" in servers) == (find_browser() is not None)
        children = [servers[k] for k in ("mosquitto", "chromium", "chromedriver")
                    if k in servers]
        assert all(_alive(pid) for pid in [servers["postmaster"], *children])
        worker.send_signal(signal.SIGKILL)  # no teardown, no atexit: as a crashed worker
        worker.wait()
        wait(lambda: not any(_alive(pid) for pid in children), 60,
             f"the end of the worker's children {children}")
        if "profile" in servers:  # chromium's helpers (zygotes, renderers) go with it
            wait(lambda: not _using(servers["profile"]), 60, "the end of chromium's helpers")
        # pg_ctl's server is nobody's child: it outlives the worker until the reaper runs
        assert _alive(servers["postmaster"])
        assert Path(servers["cluster"]) in reap_orphans()
        assert not _alive(servers["postmaster"])
        assert not Path(servers["cluster"]).exists()
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.wait()
        worker.stdout.close()
        reap_orphans()


def test_the_reaper_leaves_a_cluster_of_a_live_owner_alone(tmp_path):
    """Clusters of a running process (another run on the same box, the caller's own) and
    those without an owner file (older checkouts) are not the reaper's."""
    live = tmp_path / "edgerun-pg-live"
    live.mkdir()
    me = Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()[19]
    (live / "owner").write_text(f"{os.getpid()} {me}\n")
    unowned = tmp_path / "edgerun-pg-unowned"
    unowned.mkdir()
    reused = tmp_path / "edgerun-pg-reused"  # the owner's pid now names another process
    reused.mkdir()
    (reused / "owner").write_text(f"{os.getpid()} 1\n")
    assert reap_orphans(str(tmp_path)) == [reused]
    assert live.exists() and unowned.exists() and not reused.exists()
