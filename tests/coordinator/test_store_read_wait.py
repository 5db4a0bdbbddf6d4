"""A PostgreSQL store that is down answers the API's reads with a 503 within seconds.

Each read waited up to the pool's 30 s for a connection (psycopg_pool's default timeout)
before the API could say "store unavailable": the dashboard hung half a minute a request,
every /metrics scrape too. Reads now wait `coordinator.store_read_timeout_s` (5 s) for a
pooled connection; writes keep the pool's 30 s (a batch waits out a short outage rather than
fail, devices re-send anyway). A real PostgreSQL cluster of its own, stopped mid-test.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.api import serve
from runtime.coordinator.service import Coordinator


def _get(port: int, path: str, token: str) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.timeout(240)
def test_reads_of_a_stopped_postgres_store_are_a_503_within_seconds(tmp_path, postgres):
    # `postgres`: skipped where PostgreSQL or psycopg is missing, as every store test is
    from runtime.coordinator.pgserver import TempPostgres

    pg = TempPostgres().start()  # its own cluster: the session's goes on serving others
    coord = server = None
    try:
        url = pg.create_database("reads")
        coord = Coordinator(CoordinatorConfig(fleet="f", store=url,
                                              api_token_file=str(tmp_path / "api-token"),
                                              store_read_timeout_s=2.0))
        server = serve(coord, "127.0.0.1", 0, timeout_s=60)
        port, token = server.server_address[1], (tmp_path / "api-token").read_text().strip()
        assert _get(port, "/api/v1/fleet", token)[0] == 200
        pg._run("pg_ctl", "-D", str(pg.dir / "data"), "-m", "immediate", "-w", "stop")
        took = []
        for path in ("/api/v1/fleet", "/api/v1/devices/d1/results", "/api/v1/bundles",
                     "/api/v1/fleet"):
            t0 = time.monotonic()
            status, body = _get(port, path, token)
            took.append(time.monotonic() - t0)
            assert status == 503 and "store" in body["error"], (status, body)
        # each within the read bound and a little (was: 30 s each, the first excepted: it
        # took the pool's stale connection, which failed at once)
        print("503 after s:", [round(t, 3) for t in took])
        assert max(took) < 2.0 + 3.0, [round(t, 2) for t in took]
        assert coord.store._d.pool.timeout == 30.0  # what a write waits: the pool's own
    finally:
        if server is not None:
            server.shutdown()
        if coord is not None:
            coord.stop()
        pg.stop()

