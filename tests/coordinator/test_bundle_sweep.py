"""Review R4 of bundle delete / sweep (H26): findings, each a test that failed before its fix."""

from __future__ import annotations

import json

import pytest
from support.bundle_api import TOKEN, req
from support.model_dirs import small_bundle


def test_cli_rm_of_a_version_with_plus(tmp_path, coord, capsys):
    """Old code: `edgerun fleet bundles rm m@1.0+b2` sent `m@1.0%2Bb2` (quoted) and the
    server, which never unquoted the path, answered 404 "not a bundle id": a bundle whose
    version has a `+` (allowed by runtime.ota.bundle.VERSION) could not be deleted by the CLI."""
    from runtime.cli import main

    c, port = coord
    assert req(port, "PUT", "/api/v1/bundles", small_bundle(tmp_path, "m", "1.0+b2"))[0] == 200
    assert c.shelf.get("m@1.0+b2") is not None
    (tmp_path / "tok").write_text(TOKEN + "\n")
    conf = ["fleet", "--api", f"http://127.0.0.1:{port}", "--token-file", str(tmp_path / "tok")]
    assert main([*conf, "bundles", "rm", "m@1.0+b2"]) == 0
    assert "deleted m@1.0+b2" in capsys.readouterr().out
    assert c.shelf.get("m@1.0+b2") is None
    # a path character, encoded or not, is still no bundle id
    assert req(port, "DELETE", "/api/v1/bundles/m%2F..@1")[0] == 404


def test_rollout_started_as_its_bundle_is_deleted(tmp_path, coord):
    """Old code: `Rollouts.start` read the bundle, then stored the rollout; a delete in
    between (another coordinator's, or this one's API) saw no rollout, removed the bundle, and
    the rollout was stored and its canary sent a deploy of a bundle no coordinator holds (404
    on download; the device's desired state named it). Now the rollout is refused, halted,
    and nothing is sent."""
    c, port = coord
    assert req(port, "PUT", "/api/v1/bundles", small_bundle(tmp_path, "m", "1"))[0] == 200
    c.rollouts.set_group("g", ["d1", "d2"])
    real, sent = c.rollouts._deploy_args, []

    def args_then_deleted(bundle_id):
        args = real(bundle_id)
        c.shelf.delete(bundle_id)  # lands between the read and the rollout's row
        return args

    c.rollouts._deploy_args = args_then_deleted
    c.rollouts._send = lambda device, cmd, args: sent.append((device, cmd))
    with pytest.raises(ValueError, match="was deleted while the rollout was being created"):
        c.rollouts.start("m@1", "g", 50)
    assert c.shelf.get("m@1") is None and sent == []
    assert [r["state"] for r in c.rollouts.list()] == ["halted"]
    assert c.rollouts.desired("d1") == {} and c.rollouts.desired("d2") == {}
    # through the API: 400 with the reason
    c.rollouts._deploy_args = real
    status, err = req(port, "POST", "/api/v1/rollouts",
                       json.dumps({"bundle": "m@1", "to": "g"}).encode())
    assert status == 400 and "no bundle" in err["error"], err


def test_held_now_waits_for_a_delete_under_way(tmp_path, coord):
    """The read a rollout makes after storing itself must wait for a delete already past its
    checks (PostgreSQL read committed would otherwise see the row the delete is removing and
    let the rollout deploy it)."""
    import threading

    from runtime.coordinator import bundles
    from runtime.coordinator.bundles import held_now

    c, port = coord
    assert req(port, "PUT", "/api/v1/bundles", small_bundle(tmp_path, "m", "1"))[0] == 200
    checked, go = threading.Event(), threading.Event()
    real = bundles._in_use

    def slow_check(db, bundle_id):
        why = real(db, bundle_id)
        checked.set()
        assert go.wait(30)
        return why

    bundles._in_use = slow_check
    try:
        t = threading.Thread(target=c.shelf.delete, args=("m@1",))
        t.start()
        assert checked.wait(30)  # the delete found nothing needing it; not committed yet
        got: list[bool] = []
        reader = threading.Thread(target=lambda: got.append(held_now(c.store, "m@1")))
        reader.start()
        reader.join(0.5)
        assert reader.is_alive() and not got  # waits for the delete
        go.set()
        t.join(30)
        reader.join(30)
        assert got == [False]
    finally:
        bundles._in_use = real
        go.set()


def test_sweep_keeps_a_live_upload_of_a_host_whose_clock_is_behind(tmp_path, store_url,
                                                                   monkeypatch):
    """Old code: an upload's row was stamped with the uploading coordinator's clock and
    judged stale by the sweeping one's: with two coordinators on one store whose clocks
    differ by more than UPLOAD_STALE_S (15 min), every retention pass of the one ahead
    removed the live uploads of the one behind (their chunk rows, mid-upload). The stamp and
    the judgement are now both the store's clock."""
    import hashlib
    import io
    import time as _time
    from types import SimpleNamespace

    from runtime.coordinator import bundles
    from runtime.coordinator.bundles import Shelf
    from runtime.coordinator.store import Store

    store = Store(store_url)
    try:
        behind = Shelf(store, 8 << 20, "c-behind")
        behind.chunk_bytes = 4096
        data = small_bundle(tmp_path, "m", "1")
        sha = hashlib.sha256(data).hexdigest()
        monkeypatch.setattr(bundles, "time", SimpleNamespace(time=lambda: _time.time() - 3600))
        # half of the upload written (the rest still to come), on the host an hour behind
        behind._write_chunks(io.BytesIO(data[:8192]), sha, 8192, 4096, upload="u1")
        monkeypatch.undo()
        got = Shelf(store, 8 << 20, "c-ahead").sweep()
        assert got["rows"] == 0 and got["uploads"] == 0, got
        assert store.read("SELECT COUNT(*) FROM bundle_chunks WHERE sha256=?",
                          (sha,))[0][0] == 2
        assert store.read("SELECT id FROM bundle_uploads") == [("u1",)]
    finally:
        store.close()
