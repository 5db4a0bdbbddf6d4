"""`edgerun models install URL` without --sha256 when the file at the URL changed after an
interrupted download: the part (named after the URL) is resumed only when the server's ETag /
Last-Modified recorded beside it still hold (If-Range, and checked on the answer), else the
download starts from the beginning; a download whose whole fails verification is discarded,
saying so. Against a real local HTTP server with Range support."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from support.model_dirs import model_dir

from runtime.ota.bundle import make
from runtime.ota.download import DownloadError
from runtime.ota.install import obtain, verify_step
from runtime.ota.model_store import ModelsConfig, ModelStore
from runtime.wire.commands import generate_keypair, load_private_key


class Site:
    """One file at http://127.0.0.1:PORT/latest.edgerun: Range (one `bytes=N-`), ETag,
    Last-Modified and If-Range as a web server does; `cut_after` drops the connection after
    that many bytes of the body; `if_range` False ignores If-Range (answers 206 anyway);
    `validators` False sends neither ETag nor Last-Modified."""

    def __init__(self) -> None:
        self.data, self.version = b"", 0
        self.cut_after: int | None = None
        self.if_range, self.validators = True, True
        self.requests: list[dict] = []
        site = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a) -> None:
                pass

            def do_GET(self) -> None:
                site.requests.append(dict(self.headers))
                data, etag = site.data, f'"v{site.version}"'
                modified = f"Mon, 30 Nov 2026 0{site.version % 10}:00:00 GMT"
                rng = self.headers.get("Range")
                cond = self.headers.get("If-Range")
                if rng and cond and site.if_range and cond not in (etag, modified):
                    rng = None  # changed: the whole new file (RFC 9110 13.1.5)
                first = int(rng.split("=")[1].rstrip("-")) if rng else 0
                body = data[first:]
                self.send_response(206 if rng else 200)
                if rng:
                    self.send_header("Content-Range", f"bytes {first}-{len(data) - 1}/"
                                     f"{len(data)}")
                if site.validators:
                    self.send_header("ETag", etag)
                    self.send_header("Last-Modified", modified)
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if site.cut_after is not None:
                    self.wfile.write(body[:site.cut_after])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/latest.edgerun"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def serve(self, data: bytes) -> None:
        self.data, self.version = data, self.version + 1


@pytest.fixture
def site():
    s = Site()
    yield s
    s.server.shutdown()


@pytest.fixture
def two_versions(tmp_path) -> tuple[bytes, bytes, Path]:
    """Bundles m@1 and m@2 of one model directory (same files, same length: only their
    headers differ), and the publisher's public key."""
    d = model_dir(tmp_path / "src")
    pad = os.urandom(200_000)
    (d / "pad.onnx").write_bytes(pad)
    m = json.loads((d / "manifest.json").read_text())
    m["variants"].append({**m["variants"][0], "name": "pad", "file": "pad.onnx",
                          "sha256": hashlib.sha256(pad).hexdigest(), "size_bytes": len(pad)})
    (d / "manifest.json").write_text(json.dumps(m))
    generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub")
    key = load_private_key(tmp_path / "k.pem")
    make(d, key, tmp_path / "1.edgerun", "1")
    make(d, key, tmp_path / "2.edgerun", "2")
    a, b = (tmp_path / "1.edgerun").read_bytes(), (tmp_path / "2.edgerun").read_bytes()
    assert len(a) == len(b) and a != b
    return a, b, tmp_path / "k.pub"


def _install(tmp_path: Path, site: Site, size: int, pub: Path) -> str:
    """The download and verify steps of `models install URL --size N` (no --sha256): the
    version that lands in the store."""
    store = ModelStore(tmp_path / "state")
    cfg = ModelsConfig(publisher_keys=(str(pub),))
    bundle = obtain(store, cfg, site.url, size)
    try:
        return verify_step(store, cfg, bundle).id
    finally:
        bundle.unlink(missing_ok=True)


def _downloads(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "state" / "models" / "downloads").iterdir())


@pytest.mark.parametrize("honours_if_range", [True, False])
def test_a_file_changed_at_the_url_is_not_appended_to_the_old_part(
        tmp_path, site, two_versions, caplog, honours_if_range):
    """Old code: the resume appended version 2's tail to version 1's head; both hold the same
    files, so the mix was a valid m@1 and `models install` installed the OLD version while
    the URL served m@2 (other changes give a mix refused as tampered)."""
    a, b, pub = two_versions
    site.serve(a)
    site.cut_after = len(a) // 2
    with pytest.raises(DownloadError, match="next attempt resumes"):
        _install(tmp_path, site, len(a), pub)
    assert any(n.endswith(".part") for n in _downloads(tmp_path))
    site.serve(b)  # published a new version at the same URL
    site.cut_after, site.if_range = None, honours_if_range
    caplog.set_level(logging.WARNING, "edgerun.download")
    assert _install(tmp_path, site, len(b), pub) == "m@2"
    assert site.requests[-1 if honours_if_range else -2]["If-Range"] == '"v1"'
    if not honours_if_range:  # 206 with another ETag: started again from the beginning
        assert "Range" not in site.requests[-1]
        assert 'changed since the partial download was made (etag "v1" -> "v2")' in \
            caplog.text
    assert _downloads(tmp_path) == []  # no part, no record left


def test_an_unchanged_file_is_resumed(tmp_path, site, two_versions):
    a, _b, pub = two_versions
    site.serve(a)
    site.cut_after = len(a) // 2
    with pytest.raises(DownloadError):
        _install(tmp_path, site, len(a), pub)
    site.cut_after = None
    assert _install(tmp_path, site, len(a), pub) == "m@1"
    assert site.requests[-1]["Range"] == f"bytes={len(a) // 2}-"


def test_a_part_that_cannot_be_checked_starts_over(tmp_path, site, two_versions, caplog):
    """A part left by an older version (no record beside it), or from a server that gives no
    validators, is not resumed: its bytes may be of another copy."""
    a, b, pub = two_versions
    site.serve(b)
    downloads = tmp_path / "state" / "models" / "downloads"
    downloads.mkdir(parents=True)
    name = hashlib.sha256(site.url.encode()).hexdigest()[:24]
    (downloads / f"{name}.edgerun.part").write_bytes(a[:len(a) // 2])
    caplog.set_level(logging.WARNING, "edgerun.download")
    assert _install(tmp_path, site, len(b), pub) == "m@2"
    assert "Range" not in site.requests[-1]
    assert "no record of which copy of the file it holds" in caplog.text
    # no validators from the server: an interrupted download is not resumed either
    site.validators, site.cut_after = False, len(b) // 3
    with pytest.raises(DownloadError):
        _install(tmp_path, site, len(b), pub)
    site.cut_after = None
    assert _install(tmp_path, site, len(b), pub) == "m@2"
    assert "Range" not in site.requests[-1]
    assert "the server gave no ETag or Last-Modified" in caplog.text


def test_models_install_discards_a_download_that_fails_verification(tmp_path, site,
                                                                    two_versions, capsys):
    from runtime.cli import main

    _a, b, pub = two_versions
    bad = bytearray(b)
    bad[len(bad) // 2] ^= 1  # inside pad.onnx (most of the bundle)
    site.serve(bytes(bad))
    cfg = tmp_path / "edgerun.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
                   f'[models]\npublisher_keys = ["{pub}"]\n')
    assert main(["models", "install", site.url, "--size", str(len(b)), "--config",
                 str(cfg)]) == 1
    err = capsys.readouterr().err
    assert "is discarded; the next attempt downloads it from the beginning" in err, err
    assert "REFUSED" in err and "pad.onnx" in err, err
    assert _downloads(tmp_path) == []
    site.serve(b)  # fixed at the source: the next attempt fetches all of it
    assert _install(tmp_path, site, len(b), pub) == "m@2"
    assert "Range" not in site.requests[-1]


def test_the_coordinator_names_its_bundle_bytes_for_resumes(tmp_path, two_versions):
    """The coordinator's bundle download carries ETag "<sha256>" and honours If-Range: a
    bundle id deleted and uploaded again with other bytes is sent whole to a resume of the
    old ones (old code: no ETag, so a `models install URL` of it could never resume, and a
    Range was always answered from the new bytes)."""
    import io

    from support.web import http_get

    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.api import serve
    from runtime.coordinator.service import Coordinator

    a, b, _pub = two_versions
    b_as_1 = b.replace(b'"version":"2"', b'"version":"1"')  # other bytes under m@1 (unsigned)
    c = Coordinator(CoordinatorConfig(fleet="f", store=str(tmp_path / "s.db")))
    server = serve(c, "127.0.0.1", 0, token="t" * 24)
    try:
        held = c.shelf.receive(io.BytesIO(a), len(a))
        url = f"http://127.0.0.1:{server.server_address[1]}/api/v1/bundles/m@1"
        status, headers, body = http_get(url, held.token)
        assert status == 200 and headers["ETag"] == f'"{held.sha256}"' and body == a
        # a resume through the coordinator, no sha256: checked by its ETag, and resumed
        dest = tmp_path / "dl" / "x.edgerun"
        dest.parent.mkdir()
        from runtime.ota.download import _Record, fetch

        part = dest.with_name("x.edgerun.part")
        part.write_bytes(a[:5000])
        _Record(part.with_name("x.edgerun.part.json"), url, len(a)).write(headers)
        assert fetch(url, dest, len(a), held.token).read_bytes() == a
        c.shelf.delete("m@1")
        held2 = c.shelf.receive(io.BytesIO(b_as_1), len(b_as_1))
        assert held2.id == "m@1" and held2.sha256 != held.sha256
        req_headers = {"If-Range": f'"{held.sha256}"'}
        status, headers, body = _get_with(url, held2.token, "bytes=5000-", req_headers)
        assert status == 200 and body == b_as_1 and headers["ETag"] == f'"{held2.sha256}"'
        status, _h, body = _get_with(url, held2.token, "bytes=5000-",
                                     {"If-Range": f'"{held2.sha256}"'})
        assert status == 206 and body == b_as_1[5000:]
    finally:
        server.shutdown()
        c.store.close()


def _get_with(url: str, token: str, rng: str, extra: dict) -> tuple[int, dict, bytes]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}",
                                               "Range": rng, **extra})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()
