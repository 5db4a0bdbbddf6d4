"""One bundle shelf for every coordinator on a store: the bundles and their bytes live in the
store (tables bundles, bundle_chunks), so a bundle uploaded through one coordinator is
downloaded, with Range requests, through another; on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import sqlite3
from pathlib import Path

import pytest
from support.model_dirs import model_dir
from support.web import http_get

from runtime.ota.bundle import make, unpack
from runtime.ota.download import fetch
from runtime.wire.commands import generate_keypair, load_private_key, load_public_keys

TOKEN = "t" * 24


def big_bundle(tmp_path: Path, size: int = (5 << 20) // 2) -> Path:
    """A signed bundle of about `size` bytes: a model directory with a second, padding
    variant of random bytes (listed in the manifest with its sha256)."""
    d = model_dir(tmp_path / "src")
    pad = os.urandom(size)
    (d / "pad.onnx").write_bytes(pad)
    m = json.loads((d / "manifest.json").read_text())
    m["variants"].append({**m["variants"][0], "name": "pad", "file": "pad.onnx",
                          "sha256": hashlib.sha256(pad).hexdigest(), "size_bytes": size})
    (d / "manifest.json").write_text(json.dumps(m))
    generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub")
    make(d, load_private_key(tmp_path / "k.pem"), tmp_path / "b.edgerun", "7")
    return tmp_path / "b.edgerun"


def _put(port: int, body: bytes) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("PUT", "/api/v1/bundles", body=body,
                 headers={"Authorization": f"Bearer {TOKEN}",
                          "Content-Length": str(len(body))})
    resp = conn.getresponse()
    out = resp.status, json.loads(resp.read())
    conn.close()
    return out


@pytest.fixture
def two(tmp_path, store_url):
    """Two coordinators on one store (share_group), each with its API; on two hosts (their
    own bundles_dir: the old per-coordinator shelf)."""
    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.api import serve
    from runtime.coordinator.service import Coordinator

    coords, servers = [], []
    for k in (1, 2):
        c = Coordinator(CoordinatorConfig(fleet="f", store=store_url, share_group="g",
                                          client_id=f"c{k}", max_bundle_mb=8,
                                          bundles_dir=str(tmp_path / f"host{k}")))
        coords.append(c)
        servers.append(serve(c, "127.0.0.1", 0, token=TOKEN))
    yield coords, [s.server_address[1] for s in servers]
    for c, s in zip(coords, servers, strict=True):
        s.shutdown()
        c.store.close()
        c.shelf.close()


def test_upload_through_one_coordinator_download_with_range_through_another(tmp_path, two):
    """Old code: each coordinator had its own bundles_dir and SQLite index; the second
    answered 404/401 for a bundle uploaded to the first, and could not start its rollout."""
    (_a, b), (port_a, port_b) = two
    path = big_bundle(tmp_path)
    data = path.read_bytes()
    assert len(data) > 2 * (1 << 20)  # spans three chunk rows
    status, held = _put(port_a, data)
    assert status == 200 and held["id"] == "m@7", held
    got = b.shelf.get("m@7")  # the other coordinator holds it
    assert got is not None and got.sha256 == hashlib.sha256(data).hexdigest()
    assert [h.id for h in b.shelf.list()] == ["m@7"]
    url = f"http://127.0.0.1:{port_b}/api/v1/bundles/m@7"
    # ranges inside one row, across a row boundary, to the end; with the bundle's own token
    mib = 1 << 20
    for rng, want in ((f"bytes=10-{mib - 11}", data[10:mib - 10]),
                      (f"bytes={mib - 5}-{mib + 4}", data[mib - 5:mib + 5]),
                      (f"bytes={2 * mib + 3}-", data[2 * mib + 3:])):
        status, _h, body = http_get(url, got.token, rng)
        assert status == 206 and body == want, (rng, status, len(body))
    status, _, body = http_get(url, got.token)
    assert status == 200 and body == data
    assert http_get(url, got.token, f"bytes={len(data)}-")[0] == 416
    # a device's resumable download through B, then verified as a device does
    dest = tmp_path / "dl" / "b.edgerun"
    dest.parent.mkdir()
    (dest.parent / "b.edgerun.part").write_bytes(data[:mib + 123])
    fetch(url, dest, got.size, got.token, sha256=got.sha256)
    info = unpack(dest, tmp_path / "out", load_public_keys([str(tmp_path / "k.pub")]))
    assert info.id == "m@7" and (tmp_path / "out" / "pad.onnx").read_bytes() == \
        (tmp_path / "src" / "pad.onnx").read_bytes()
    # B makes deploy arguments for it (its own URL, the bundle's one token), so B can
    # start the rollout and re-send desired state pointing at bytes it serves
    args = b.deploy_args("m@7")
    assert args["token"] == got.token and args["url"] == b.api_url + "/api/v1/bundles/m@7"
    # the same file again through B: the same bundle; other bytes under its id: refused
    assert _put(port_b, data) == (200, held)
    other = bytearray(data)
    other[-1] ^= 1
    status, err = _put(port_b, bytes(other))
    assert status == 409 and "other contents" in err["error"]


def test_range_reads_over_small_chunk_rows(tmp_path, monkeypatch, store_url):
    """The one read function (used by the HTTP route and the MQTT chunk server) at every
    offset class over rows of 4 KiB; a row missing from the store is an error, never short
    or wrong bytes served as good."""
    from runtime.coordinator import bundles
    from runtime.coordinator.bundles import BundleRefused, Shelf
    from runtime.coordinator.store import Store

    monkeypatch.setattr(bundles, "CHUNK_BYTES", 4096)
    store = Store(store_url)
    try:
        shelf = Shelf(store, 1 << 20)
        generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub")
        make(model_dir(tmp_path / "src"), load_private_key(tmp_path / "k.pem"),
             tmp_path / "b.edgerun", "1")
        data = (tmp_path / "b.edgerun").read_bytes()
        with (tmp_path / "b.edgerun").open("rb") as f:
            held = shelf.receive(f, len(data))
        assert held.chunk == 4096 and len(data) > 3 * 4096
        n = store.read("SELECT COUNT(*) FROM bundle_chunks WHERE sha256=?", (held.sha256,))
        assert n[0][0] == (len(data) + 4095) // 4096
        for off, ln in ((0, 1), (0, 4096), (4095, 2), (4096, 4096), (100, 3 * 4096 + 7),
                        (len(data) - 1, 10), (len(data) - 5000, 1 << 20), (7, 0)):
            assert shelf.read(held, off, ln) == data[off:off + ln], (off, ln)
        with pytest.raises(BundleRefused) as e:
            shelf.read(held, len(data), 1)
        assert e.value.status == 416
        store.write("DELETE FROM bundle_chunks WHERE sha256=? AND idx=?", [(held.sha256, 2)])
        shelf.close()  # drop the cached rows
        with pytest.raises(BundleRefused) as e:
            shelf.read(held, 2 * 4096 + 1, 10)
        assert e.value.status == 500 and "chunk 2 is missing" in str(e.value)
    finally:
        store.close()


def test_a_bundle_shelf_directory_of_an_older_coordinator_is_imported(tmp_path):
    """An upgraded coordinator's bundles (bundles_dir with index.db) go into the store with
    their tokens, so devices mid-way through a rollout still download."""
    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.service import Coordinator

    generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub")
    make(model_dir(tmp_path / "src"), load_private_key(tmp_path / "k.pem"),
         tmp_path / "b.edgerun", "1")
    data = (tmp_path / "b.edgerun").read_bytes()
    old = tmp_path / "coord" / "bundles"
    old.mkdir(parents=True)
    (old / "m@1.edgerun").write_bytes(data)
    body = {"id": "m@1", "name": "m", "version": "1", "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(), "token": "old-token", "created": 1.0}
    db = sqlite3.connect(old / "index.db")
    db.execute("CREATE TABLE bundles (id TEXT PRIMARY KEY, body TEXT)")
    db.execute("INSERT INTO bundles VALUES (?, ?)", ("m@1", json.dumps(body)))
    db.commit()
    db.close()
    c = Coordinator(CoordinatorConfig(store=str(tmp_path / "coord" / "c.db")))
    try:
        held = c.shelf.get("m@1")
        assert held is not None and held.token == "old-token"
        assert c.shelf.read(held, 0, len(data)) == data
    finally:
        c.store.close()
        c.shelf.close()


def test_a_damaged_bundle_row_is_not_served(store_url):
    """A `bundles` row whose body does not hold up (a chunk size of 0 would divide by zero
    in the download loop; a bad id or sha256) reads as no bundle, never an exception."""
    from runtime.coordinator.bundles import Shelf
    from runtime.coordinator.store import Store

    s = Store(store_url)
    try:
        shelf = Shelf(s, 1 << 20)
        good = {"id": "m@1", "name": "m", "version": "1", "size": 10, "sha256": "a" * 64,
                "token": "t", "created": 1.0, "chunk": 4096}
        for i, bad in enumerate(({"chunk": 0}, {"size": -1}, {"sha256": "x"}, {"id": "../x"},
                                 {"size": True}, {"extra": 1})):
            s.write("INSERT INTO bundles VALUES (?,?,?,?,?)",
                    [(f"b{i}@1", "a" * 64, 10, 1.0, json.dumps({**good, **bad}))])
            assert shelf.get(f"b{i}@1") is None, bad
        s.write("INSERT INTO bundles VALUES (?,?,?,?,?)", [("m@1", "a" * 64, 10, 2.0,
                                                            json.dumps(good))])
        assert [h.id for h in shelf.list()] == ["m@1"]
    finally:
        s.close()


def test_bundles_do_not_make_retention_delete_results(tmp_path):
    """The shelf moved into the store, and max_store_mb measures the store: a 2.5 MiB bundle
    in a store capped at 1.5 MB made every retention pass delete acked results (and health,
    events) for room the results never took."""
    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.service import Coordinator
    from runtime.coordinator.store import Inbound

    c = Coordinator(CoordinatorConfig(store=str(tmp_path / "c.db"), max_store_mb=1.5,
                                      max_bundle_mb=8))
    try:
        path = big_bundle(tmp_path)
        with path.open("rb") as f:
            c.shelf.receive(f, path.stat().st_size)
        assert c.shelf.stored_bytes() == path.stat().st_size
        c.store.ingest([Inbound("d", "result", {
            "v": 1, "stream": "s", "boot": "b", "floor": 1,
            "results": [{"seq": q, "t": 1.0, "boot": "b"} for q in range(1, 101)]})])
        assert c.store.acks() == {("d", "s"): 100}
        assert c.store.used_bytes() > 1.5 * 2**20  # over the cap, because of the bundle
        assert c.run_retention()["results_by_size"] == 0
        assert c.store.counts() == {"d": 100}
    finally:
        c.store.close()
        c.shelf.close()
