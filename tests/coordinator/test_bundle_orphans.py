"""No chunk rows without a bundle: an upload that fails removes what it wrote; one killed
half-way (kill -9) is swept at the coordinator's next start; rows of no bundle or past a
bundle's last chunk are swept by the retention pass, with what was removed and the space it
freed in the log; an upload in progress is never swept. On SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.model_dirs import small_bundle
from support.under_test import child_env

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.bundles import UPLOAD_STALE_S, BundleRefused, Shelf
from runtime.coordinator.service import Coordinator
from runtime.coordinator.store import Store

ROOT = Path(__file__).resolve().parents[2]
UPLOAD = """
import io, sys
from runtime.coordinator.bundles import Shelf
from runtime.coordinator.store import Store
shelf = Shelf(Store(sys.argv[1]), 8 << 20, sys.argv[2])
shelf.chunk_bytes = 4096
data = open(sys.argv[3], "rb").read()
shelf.receive(io.BytesIO(data), len(data))
"""


def _chunks(store: Store, sha: str) -> list[int]:
    return [i for (i,) in store.read("SELECT idx FROM bundle_chunks WHERE sha256=? "
                                     "ORDER BY idx", (sha,))]


def _coordinator(tmp_path: Path, url: str, client_id: str) -> Coordinator:
    return Coordinator(CoordinatorConfig(fleet="f", store=url, client_id=client_id,
                                         bundles_dir=str(tmp_path / "none")))


def test_an_upload_killed_half_way_is_swept_at_the_next_start(tmp_path, store_url, caplog):
    """Old code: the rows a killed upload wrote stayed in the store for ever (no bundle row
    owns them, nothing removed them)."""
    data = small_bundle(tmp_path, "m", "1")
    (tmp_path / "b.edgerun").write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    env = child_env(EDGERUN_CRASH_AT="bundle_upload")
    p = subprocess.run([sys.executable, "-c", UPLOAD, store_url, "c1",
                        str(tmp_path / "b.edgerun")], env=env, capture_output=True,
                       timeout=60)
    assert p.returncode == -9, p.stderr.decode()[-2000:]
    store = Store(store_url)
    try:
        assert _chunks(store, sha) == [0]  # killed after its first row
        assert store.read("SELECT COUNT(*) FROM bundles")[0][0] == 0
        # another coordinator's upload in progress (its row fresh): kept by this start
        with store.transaction() as db:
            db.execute("INSERT INTO bundle_uploads VALUES (?,?,?,?)",
                       ("u2", "b" * 64, "c2", time.time()))
            db.execute("INSERT INTO bundle_chunks VALUES (?,?,?)", ("b" * 64, 0, b"x" * 100))
    finally:
        store.close()
    caplog.set_level(logging.INFO, "edgerun.coordinator.bundles")
    c = _coordinator(tmp_path, store_url, "c1")  # the same coordinator, restarted
    try:
        assert _chunks(c.store, sha) == [] and c.counters["bundle_rows_swept"] == 1
        assert c.store.read("SELECT id FROM bundle_uploads") == [("u2",)]
        assert _chunks(c.store, "b" * 64) == [0]
        logged = caplog.text
        assert "removed 1 chunk rows no bundle needs, 4096 bytes (0.0 MB) freed" in logged, logged
        assert f"{sha[:12]}... 1 rows (an upload that died)" in logged, logged
        # the other upload stops being refreshed: swept once stale, by any coordinator
        live = Shelf(c.store, 8 << 20, "c3")
        assert live.sweep(now=time.time() + 60)["rows"] == 0
        got = live.sweep(now=time.time() + UPLOAD_STALE_S + 60)
        assert got == {"uploads": 1, "rows": 1, "bytes": 100}, got
        assert c.store.read("SELECT COUNT(*) FROM bundle_uploads")[0][0] == 0
        # the file uploaded again is whole
        c.shelf.chunk_bytes = 4096
        import io

        held = c.shelf.receive(io.BytesIO(data), len(data))
        assert c.shelf.read(held, 0, len(data)) == data
        assert c.store.read("SELECT COUNT(*) FROM bundle_uploads")[0][0] == 0
    finally:
        c.store.close()


def test_an_upload_that_fails_removes_its_rows(tmp_path, store_url, monkeypatch):
    """Old code: a store error on the third chunk row left the first two behind."""
    import io

    data = small_bundle(tmp_path, "m", "1")
    sha = hashlib.sha256(data).hexdigest()
    store = Store(store_url)
    shelf = Shelf(store, 8 << 20, "c1")
    shelf.chunk_bytes = 2048
    real, n = store.transaction, [0]

    def failing():
        n[0] += 1
        if n[0] == 3:
            raise OSError("disk full (test)")
        return real()

    monkeypatch.setattr(store, "transaction", failing)
    try:
        with pytest.raises(OSError, match="disk full"):
            shelf.receive(io.BytesIO(data), len(data))
        monkeypatch.setattr(store, "transaction", real)
        assert _chunks(store, sha) == []
        assert store.read("SELECT COUNT(*) FROM bundle_uploads")[0][0] == 0
        assert shelf.get("m@1") is None
    finally:
        store.close()


def test_retention_sweeps_rows_of_no_bundle_and_past_a_bundles_end(tmp_path, store_url,
                                                                   caplog):
    """Old code: rows whose bundle row is gone, or past the bundle's chunk count (a re-upload
    with smaller rows), were kept and counted as the shelf's for ever."""
    import io

    data = small_bundle(tmp_path, "m", "1")
    c = _coordinator(tmp_path, store_url, "c1")
    try:
        c.shelf.chunk_bytes = 4096
        held = c.shelf.receive(io.BytesIO(data), len(data))
        n = -(-len(data) // 4096)
        with c.store.transaction() as db:
            for idx in (n, n + 1):  # past its end
                db.execute("INSERT INTO bundle_chunks VALUES (?,?,?)",
                           (held.sha256, idx, b"y" * 1000))
            for idx in range(3):  # of no bundle and no upload (an older version's leftovers)
                db.execute("INSERT INTO bundle_chunks VALUES (?,?,?)",
                           ("c" * 64, idx, b"z" * 4096))
        caplog.set_level(logging.INFO, "edgerun.coordinator.bundles")
        c.run_retention()
        assert _chunks(c.store, "c" * 64) == []
        assert _chunks(c.store, held.sha256) == list(range(n))
        assert c.shelf.read(held, 0, len(data)) == data
        assert c.shelf.stored_bytes() == len(data)
        assert c.counters["bundle_rows_swept"] == 5
        assert "removed 5 chunk rows no bundle needs, 14288 bytes (0.0 MB) freed" in caplog.text
        assert "2 rows past its bundle's last chunk" in caplog.text
        caplog.clear()
        c.run_retention()  # nothing more: nothing logged
        assert "removed" not in caplog.text
    finally:
        c.store.close()


def test_an_upload_whose_header_is_nested_too_deeply_is_refused_and_leaves_nothing(tmp_path):
    """An upload whose edgerun-bundle.json is 200,000 `[`: json.loads raised RecursionError,
    which the shelf's header peek did not catch: the API answered 500 with a traceback in
    the log, not the 400 saying what is wrong. Parsed with runtime/wire/safejson now."""
    import io
    import tarfile

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("edgerun-bundle.json")
        info.size = 200_000
        tar.addfile(info, io.BytesIO(b"[" * info.size))
    data = raw.getvalue()
    store = Store(str(tmp_path / "c.db"))
    shelf = Shelf(store, 8 << 20, "c1")
    try:
        with pytest.raises(BundleRefused, match="not an edgerun bundle: not JSON") as e:
            shelf.receive(io.BytesIO(data), len(data))
        assert e.value.status == 400
        assert store.read("SELECT COUNT(*) FROM bundle_uploads")[0][0] == 0
    finally:
        store.close()
