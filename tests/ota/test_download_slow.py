"""A bundle server that trickles (a hostile or broken host at the deploy's URL, or a MITM on a
plain-HTTP link): the download ends, resumable, instead of holding the update for ever."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from runtime.ota import download
from runtime.ota.download import DownloadError, fetch

SIZE = 20_000


@pytest.fixture
def trickle():
    """Serves SIZE bytes, one byte every 50 ms (each read arrives well within the socket
    timeout, so only an overall deadline can end it: about 17 minutes otherwise)."""
    stop = threading.Event()

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(SIZE))
            self.end_headers()
            for _ in range(SIZE):
                if stop.is_set():
                    return
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.05)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/b.edgerun"
    stop.set()
    server.shutdown()


def test_a_trickling_server_is_cut_off_and_the_part_kept_for_a_resume(tmp_path, trickle,
                                                                       monkeypatch):
    """urlopen's timeout bounds each read, not the whole: a server sending a byte every
    50 ms held the device's update (and every later deploy of it: the part's lock) for as
    long as it liked. A download must now keep up MIN_BPS on average after timeout_s; the
    error says so and the bytes received stay in the part for the next attempt."""
    # 20 KB at 5000 B/s: due in 1 + 4 s; the trickle sends 20 B/s, far under it (at 1000
    # B/s the test waited 21 s to show the same cut-off)
    monkeypatch.setattr(download, "MIN_BPS", 5000, raising=False)
    done: list[BaseException | None] = []

    def run():
        try:
            fetch(trickle, tmp_path / "b.edgerun", SIZE, timeout_s=1.0)
            done.append(None)
        except BaseException as e:
            done.append(e)

    t0 = time.monotonic()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(60)
    assert done, "still downloading after 60 s"
    assert isinstance(done[0], DownloadError) and "too slow" in str(done[0]), done[0]
    assert time.monotonic() - t0 < 20  # its deadline (5 s), not the trickle's 17 minutes
    part = tmp_path / "b.edgerun.part"
    assert 0 < part.stat().st_size < SIZE  # kept: the next attempt resumes
