"""Resumable bundle download over HTTP(S) into the state directory.

The partial file (`<name>.part`) survives a crash or a dropped link; the next attempt asks for
the rest with `Range: bytes=N-` and appends only when the server answers 206 starting at N
(anything else starts over). Before writing, the size declared by the caller (from the signed
deploy command) is checked against `max_bytes`, and the free space against what is still to
come plus `min_free_bytes`; the server sending more than declared is cut off. What arrives is
unverified until runtime.bundle checks its signature and hashes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from runtime.model_store import crash_point

CHUNK = 1 << 14  # small enough that a bundle arrives in several (the crash hook fires mid-way)
_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


class DownloadError(Exception):
    """The download failed or was refused; the message says why (the partial file is kept
    when a retry can resume it). `unreachable`: no connection to the server at all (the
    device may try another route: `[models] fetch = "auto"`)."""

    def __init__(self, message: str, unreachable: bool = False):
        super().__init__(message)
        self.unreachable = unreachable


# (part, have, size): append bytes have..size of the bundle to `part` (runtime/bundle_mqtt.py)
Transport = Callable[[Path, int, int], None]


def fetch(url: str, dest: Path, size: int, token: str = "", max_bytes: int = 0,
          min_free_bytes: int = 0, sha256: str = "", timeout_s: float = 30.0,
          via: Transport | None = None) -> Path:
    """Download `url` (of `size` bytes) to `dest`, resuming `dest.part`; returns `dest`.
    `sha256` (when given) is checked before the rename; a mismatch deletes the part. `via`
    fetches the bytes another way than HTTP (`url` then only names the source in messages);
    the size cap, free-space check and sha256 are the same."""
    if size <= 0:
        raise DownloadError(f"{url}: the bundle's size must be known before downloading "
                            "(the deploy command's `size`, `models install --size`)")
    if max_bytes and size > max_bytes:
        raise DownloadError(f"{url}: {size} bytes is over the cap of {max_bytes} "
                            "([models] max_bundle_mb)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _only_fetcher(dest, url):
        return _fetch(url, dest, size, token, max_bytes, min_free_bytes, sha256, timeout_s,
                      via)


@contextlib.contextmanager
def _only_fetcher(dest: Path, url: str) -> Iterator[None]:
    """Hold `<dest>.lock` for the download: two at once of the same bundle (the daemon's
    deploy and `edgerun models install`, or an HTTP and an MQTT attempt) would both append
    to one part file, each at the offset it believed, and leave a file of neither."""
    lock = dest.with_name(dest.name + ".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise DownloadError(f"{url}: another download of this bundle into {dest.parent} "
                                "is running (its part file is not touched)") from None
        try:
            yield
        finally:
            # unlinked while held: the next download makes a new one
            with contextlib.suppress(OSError):
                lock.unlink()
    finally:
        os.close(fd)


def _fetch(url: str, dest: Path, size: int, token: str, max_bytes: int, min_free_bytes: int,
           sha256: str, timeout_s: float, via: Transport | None) -> Path:
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    if have > size:
        part.unlink()
        have = 0
    free = shutil.disk_usage(dest.parent).free
    if free - (size - have) < min_free_bytes:
        raise DownloadError(f"{url}: {size - have} bytes still to download but only {free} "
                            f"free in {dest.parent} ({min_free_bytes} must stay free: "
                            "[models] min_free_mb)")
    if have < size:
        if via is not None:
            via(part, have, size)
        else:
            _get(url, part, have, size, token, timeout_s)
    if sha256:
        h = hashlib.sha256()
        with part.open("rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
        if h.hexdigest() != sha256:
            part.unlink()
            raise DownloadError(f"{url}: sha256 of the download does not match the deploy "
                                "command's: discarded")
    os.replace(part, dest)
    return dest


def _get(url: str, part: Path, have: int, size: int, token: str, timeout_s: float) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if have:
        headers["Range"] = f"bytes={have}-"
    req = urllib.request.Request(url, headers=headers)
    try:
        resp = urllib.request.urlopen(req, timeout=timeout_s)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # our part is not a prefix of what is served now
            part.unlink()
            raise DownloadError(f"{url}: server refused to resume (416); starting over on "
                                "the next attempt") from None
        raise DownloadError(f"{url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        raise DownloadError(f"{url}: cannot connect: {getattr(e, 'reason', e)}",
                            unreachable=True) from None
    with resp:
        mode = "ab"
        if have and resp.status == 206:
            m = _RANGE.match(resp.headers.get("Content-Range", ""))
            if not m or int(m.group(1)) != have:
                raise DownloadError(f"{url}: answered a resume with Content-Range "
                                    f"{resp.headers.get('Content-Range')!r}, not from {have}")
        elif have:  # 200: the server sent everything again
            mode, have = "wb", 0
        written = have
        try:
            with part.open(mode) as out:
                while chunk := resp.read(CHUNK):
                    written += len(chunk)
                    if written > size:
                        raise DownloadError(f"{url}: the server sent more than the declared "
                                            f"{size} bytes: refused")
                    out.write(chunk)
                    out.flush()
                    crash_point("download")
                os.fsync(out.fileno())
        except (OSError, TimeoutError) as e:
            raise DownloadError(f"{url}: interrupted after {written} of {size} bytes ({e}); "
                                "the next attempt resumes") from None
    if written != size:
        raise DownloadError(f"{url}: got {written} of {size} bytes; the next attempt resumes")


__all__ = ["DownloadError", "Transport", "fetch"]
