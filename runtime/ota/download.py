"""Resumable bundle download over HTTP(S) into the state directory.

The partial file (`<name>.part`) survives a crash or a dropped link; the next attempt asks for
the rest with `Range: bytes=N-` and appends only when the server answers 206 starting at N
(anything else starts over). Without a sha256 (a part named after its URL) the server's ETag
or Last-Modified is recorded in `<name>.part.json` and a resume is sent with `If-Range` and
kept only when they are unchanged: a file changed at the URL starts over instead of being
appended to the old bytes; a part without such a record is not resumed.

Before writing, the size declared by the caller (from the signed deploy command) is checked
against `max_bytes`, and the free space against what is still to come plus `min_free_bytes`;
the server sending more than declared is cut off. What arrives is unverified until
runtime.ota.bundle checks its signature and hashes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from runtime.durable import crash_point, write_atomic

log = logging.getLogger("edgerun.download")

CHUNK = 1 << 14  # small enough that a bundle arrives in several (the crash hook fires mid-way)
# The slowest average rate a download may keep after its first timeout_s: the socket timeout
# bounds each read, not the whole, so a server trickling a byte at a time held the update
# (and, by the part's lock, every later attempt) for as long as it liked. Cut off, the part
# is kept and the next attempt resumes: a slow link still gets there.
MIN_BPS = 1024
_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


class DownloadError(Exception):
    """The download failed or was refused; the message says why (the partial file is kept
    when a retry can resume it). `unreachable`: no connection to the server at all (the
    device may try another route: `[models] fetch = "auto"`)."""

    def __init__(self, message: str, unreachable: bool = False):
        super().__init__(message)
        self.unreachable = unreachable


# (part, have, size): append bytes have..size of the bundle to `part` (runtime/ota/bundle_mqtt.py)
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
    # Without a sha256 the part is named after the URL, whose content may change between
    # attempts: a resume then appends new bytes to old ones. So the server's validators
    # (ETag, Last-Modified) are recorded beside the part and a resume is made only when they
    # are known (If-Range) and still the same; anything else starts from the beginning.
    record = _Record(part.with_name(part.name + ".json"), url, size) if not sha256 else None
    have = part.stat().st_size if part.exists() else 0
    if have > size:
        _discard(part, record)
        have = 0
    if have and record is not None and (why := record.unusable()):
        log.warning("%s: discarding the partial download (%d bytes): %s; starting from the "
                    "beginning", url, have, why)
        _discard(part, record)
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
            _get(url, part, have, size, token, timeout_s, record)
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
    if record is not None:
        record.path.unlink(missing_ok=True)
    return dest


class _Record:
    """Which copy of `url` a part holds: the size and the server's validators, in
    `<part>.json` (written before the first byte of the part)."""

    def __init__(self, path: Path, url: str, size: int):
        self.path, self.url, self.size = path, url, size
        try:
            doc = json.loads(path.read_text())
            self.doc = doc if isinstance(doc, dict) else {}
        except (OSError, ValueError):
            self.doc = {}

    def validator(self) -> str:
        """What If-Range sends: the strong ETag, else Last-Modified ("" for none)."""
        return str(self.doc.get("etag") or self.doc.get("last_modified") or "")

    def unusable(self) -> str:
        """Why a resume of the part cannot be checked ("" when it can)."""
        if not self.doc:
            return "no record of which copy of the file it holds (written by an older version?)"
        if self.doc.get("url") != self.url or self.doc.get("size") != self.size:
            return "it was of another URL or size"
        if not self.validator():
            return ("the server gave no ETag or Last-Modified, so a resume cannot be checked "
                    "against a changed file")
        return ""

    def changed(self, headers: Any) -> str:
        """How the response's validators differ from the recorded ones ("" when the same)."""
        got = _validators(headers)
        for key in ("etag", "last_modified"):
            if self.doc.get(key):
                if got[key] != self.doc[key]:
                    return f"{key.replace('_', '-')} {self.doc[key]} -> {got[key] or 'none'}"
                return ""
        return "no validator recorded"

    def write(self, headers: Any) -> None:
        """Record the copy a response is of (before its bytes are written)."""
        self.doc = {"url": self.url, "size": self.size, **_validators(headers)}
        write_atomic(self.path, json.dumps(self.doc))


def _validators(headers: Any) -> dict[str, str]:
    """The response's strong ETag (a weak one cannot be used in If-Range) and Last-Modified."""
    etag = (headers.get("ETag") or "").strip()
    return {"etag": "" if etag.startswith("W/") else etag[:200],
            "last_modified": (headers.get("Last-Modified") or "").strip()[:100]}


def _discard(part: Path, record: _Record | None) -> None:
    part.unlink(missing_ok=True)
    if record is not None:
        record.path.unlink(missing_ok=True)


def _get(url: str, part: Path, have: int, size: int, token: str, timeout_s: float,
         record: _Record | None = None) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if have:
        headers["Range"] = f"bytes={have}-"
        if record is not None:  # the rest of that copy, or (changed) all of the new one
            headers["If-Range"] = record.validator()
    req = urllib.request.Request(url, headers=headers)
    try:
        resp = urllib.request.urlopen(req, timeout=timeout_s)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # our part is not a prefix of what is served now
            _discard(part, record)
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
            if m.group(3) != "*" and int(m.group(3)) != size:
                _discard(part, record)
                raise DownloadError(f"{url}: the server's file is {m.group(3)} bytes, not the "
                                    f"declared {size} (it changed?): partial download "
                                    "discarded")
            if record is not None and (why := record.changed(resp.headers)):
                # a server that ignored If-Range: the rest of another copy
                _discard(part, record)
                log.warning("%s: changed since the partial download was made (%s): "
                            "starting from the beginning", url, why)
                return _get(url, part, 0, size, token, timeout_s, record)
        elif have:  # 200: the server sent everything again
            if record is not None and (why := record.changed(resp.headers)):
                log.warning("%s: changed since the partial download was made (%s): "
                            "downloading it from the beginning", url, why)
            mode, have = "wb", 0
        if resp.status == 200 and (n := resp.headers.get("Content-Length", "")).isdigit() \
                and int(n) != size:
            _discard(part, record)
            raise DownloadError(f"{url}: the server's file is {n} bytes, "
                                f"{'more' if int(n) > size else 'fewer'} than the declared "
                                f"{size} (--size, or the deploy command's size): refused")
        if record is not None and not have:  # a fresh start (or the server's restart)
            record.write(resp.headers)  # before a byte: the part is of this copy
        written = have
        started = time.monotonic()
        deadline = started + timeout_s + (size - have) / MIN_BPS
        try:
            with part.open(mode) as out:
                # read1: what has arrived (read(n) waits for all n bytes, however slowly)
                while chunk := resp.read1(CHUNK):
                    written += len(chunk)
                    if written > size:
                        raise DownloadError(f"{url}: the server sent more than the declared "
                                            f"{size} bytes: refused")
                    out.write(chunk)
                    out.flush()
                    crash_point("download")
                    if time.monotonic() > deadline and written < size:
                        raise DownloadError(
                            f"{url}: too slow: {written - have} bytes in "
                            f"{time.monotonic() - started:.0f} s, under {MIN_BPS} bytes/s on "
                            f"average; {written} of {size} kept, the next attempt resumes")
                os.fsync(out.fileno())
        except (OSError, TimeoutError) as e:
            raise DownloadError(f"{url}: interrupted after {written} of {size} bytes ({e}); "
                                "the next attempt resumes") from None
    if written != size:
        raise DownloadError(f"{url}: got {written} of {size} bytes; the next attempt resumes")


__all__ = ["DownloadError", "Transport", "fetch"]
