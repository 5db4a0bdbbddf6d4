"""Bundles leave the coordinator's store: `DELETE /api/v1/bundles/{id}` and `edgerun fleet
bundles rm ID` remove a bundle's row and its chunk rows in one transaction, refused (409, with
the rollout or devices named) while a rollout under way or a device's desired state needs it;
on SQLite and PostgreSQL."""

from __future__ import annotations

import http.client
import json

import pytest
from support.bundle_api import TOKEN, req
from support.model_dirs import small_bundle


def _rows(c, sha: str) -> int:
    return c.store.read("SELECT COUNT(*) FROM bundle_chunks WHERE sha256=?", (sha,))[0][0]


def test_delete_refused_while_needed_then_removes_row_and_chunks(tmp_path, coord, capsys):
    """Old code: no way to delete a bundle (DELETE answered 501, the rows stayed for ever)."""
    from runtime.cli import main

    c, port = coord
    a, b = small_bundle(tmp_path, "m", "1"), small_bundle(tmp_path, "m", "2", seed=1)
    assert req(port, "PUT", "/api/v1/bundles", a)[0] == 200
    assert req(port, "PUT", "/api/v1/bundles", b)[0] == 200
    ha, hb = c.shelf.get("m@1"), c.shelf.get("m@2")
    assert _rows(c, ha.sha256) == -(-len(a) // 4096) > 1
    # a rollout of m@1 under way (canary d1, d2 waits): refused, the rollout named
    c.rollouts.set_group("g", ["d1", "d2"])
    r = c.rollouts.start("m@1", "g", 50)
    status, err = req(port, "DELETE", "/api/v1/bundles/m@1")
    assert status == 409 and r["id"] in err["error"] and "canary" in err["error"], err
    # the rollout is over, but m@1 is still d1's desired model (re-sent when it returns)
    c.store.update("UPDATE rollouts SET body = ? WHERE id = ?",
                   (json.dumps({**r, "state": "done"}), r["id"]))
    status, err = req(port, "DELETE", "/api/v1/bundles/m@1")
    assert status == 409 and "desired model of 1 device(s) (d1)" in err["error"], err
    assert c.shelf.get("m@1") is not None and _rows(c, ha.sha256) > 1  # nothing touched
    # d1 moves on to m@2 (a new rollout: d1's model before is m@1, kept while it may halt)
    c.rollouts.set_group("h", ["d1"])
    r2 = c.rollouts.start("m@2", "h", 100)
    status, err = req(port, "DELETE", "/api/v1/bundles/m@1")
    assert status == 409 and r2["id"] in err["error"] and "puts it back on d1" in \
        err["error"], err
    c.store.update("UPDATE rollouts SET body = ? WHERE id = ?",
                   (json.dumps({**c.rollouts.get(r2["id"]), "state": "done"}), r2["id"]))
    # now nothing needs m@1: deleted through the CLI, its rows with it; m@2 untouched
    conf_args = ["fleet", "--api", f"http://127.0.0.1:{port}", "--token-file",
                 str(tmp_path / "tok")]
    (tmp_path / "tok").write_text(TOKEN + "\n")
    capsys.readouterr()
    assert main([*conf_args, "bundles", "rm", "m@1"]) == 0
    out = capsys.readouterr().out
    assert f"deleted m@1: {-(-len(a) // 4096)} chunk rows, {len(a) / 1024:.1f} KB freed" \
        in out, out
    assert c.shelf.get("m@1") is None and _rows(c, ha.sha256) == 0
    assert c.shelf.get("m@2") is not None and _rows(c, hb.sha256) == -(-len(b) // 4096)
    assert c.shelf.stored_bytes() == len(b)
    assert req(port, "DELETE", "/api/v1/bundles/m@1")[0] == 404
    with pytest.raises(SystemExit, match=r"no bundle m@1 .*\(HTTP 404\)"):
        main([*conf_args, "bundles", "rm", "m@1"])
    # m@2 is d1's desired model: the CLI says why and fails
    with pytest.raises(SystemExit, match=r"desired model of 1 device\(s\) \(d1\).*HTTP 409"):
        main([*conf_args, "bundles", "rm", "m@2"])
    assert main([*conf_args, "bundles"]) == 0
    assert "m@2" in capsys.readouterr().out
    # and the same file can be uploaded again afterwards (its rows are written anew)
    assert req(port, "PUT", "/api/v1/bundles", a)[0] == 200
    assert c.shelf.read(c.shelf.get("m@1"), 0, len(a)) == a


def test_delete_needs_the_api_token(coord):
    _c, port = coord
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("DELETE", "/api/v1/bundles/m@1", headers={"Authorization": "Bearer nope"})
    assert conn.getresponse().status == 401
    conn.close()
    assert req(port, "DELETE", "/api/v1/bundles/not-an-id")[0] == 404
