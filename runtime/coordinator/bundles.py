"""Model bundles held by the coordinator for devices to download (docs/ota.md).

`edgerun fleet deploy BUNDLE` uploads the file (`PUT /api/v1/bundles`, streamed to disk, at
most `max_bundle_mb`); the coordinator reads its header (name, version, sizes: the signature
is the devices' to check, against their own publisher keys), keeps it as
`<bundles_dir>/<name>@<version>.edgerun` and makes a random download token for it. Devices get
the URL, size, sha256 and token in the signed `deploy` command and download with
`Authorization: Bearer <token>` (valid for that bundle only), resuming with Range requests.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import sqlite3
import tarfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

from runtime.bundle import HEADER, VERSION

_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}@[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}$")
_RANGE = re.compile(r"^bytes=(\d{1,18})-(\d{0,18})$")
CHUNK = 1 << 16


class BundleRefused(ValueError):
    """An upload or a request for a bundle is refused; `status` is the HTTP status."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Held:
    """A bundle the coordinator serves."""

    id: str
    name: str
    version: str
    size: int
    sha256: str
    token: str
    created: float

    def public(self) -> dict:
        """Without the download token (listings)."""
        d = asdict(self)
        del d["token"]
        return d


class Shelf:
    """The bundles directory and its index (a small SQLite table next to the files)."""

    def __init__(self, directory: str | Path, max_bytes: int):
        self.dir = Path(directory).expanduser()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._db = sqlite3.connect(self.dir / "index.db", check_same_thread=False,
                                   isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS bundles (id TEXT PRIMARY KEY, body TEXT)")
        self._lock = threading.Lock()

    def get(self, bundle_id: str) -> Held | None:
        """The bundle `bundle_id` (`name@version`), or None."""
        with self._lock:
            row = self._db.execute("SELECT body FROM bundles WHERE id=?",
                                   (bundle_id,)).fetchone()
        return Held(**json.loads(row[0])) if row else None

    def list(self) -> list[Held]:
        """Every bundle held, oldest first."""
        with self._lock:
            rows = self._db.execute("SELECT body FROM bundles").fetchall()
        return sorted((Held(**json.loads(b)) for (b,) in rows), key=lambda h: h.created)

    def path(self, held: Held) -> Path:
        """Where the bundle's file is."""
        return self.dir / f"{held.id}.edgerun"

    def receive(self, src: IO[bytes], length: int) -> Held:
        """Store an uploaded bundle of `length` bytes read from `src`; BundleRefused when it
        is too big, short, not a bundle, or another file under the same name@version."""
        if length <= 0 or length > self.max_bytes:
            raise BundleRefused(f"bundle of {length} bytes: must be 1..{self.max_bytes} "
                                "(coordinator.max_bundle_mb)", 413)
        tmp = self.dir / f".upload-{secrets.token_hex(8)}"
        h = hashlib.sha256()
        try:
            got = 0
            with tmp.open("wb") as out:
                while got < length:
                    chunk = src.read(min(CHUNK, length - got))
                    if not chunk:
                        break
                    h.update(chunk)
                    out.write(chunk)
                    got += len(chunk)
                out.flush()
                os.fsync(out.fileno())
            if got != length:
                raise BundleRefused(f"upload ended after {got} of {length} bytes")
            name, version = _peek(tmp)
            bundle_id = f"{name}@{version}"
            sha = h.hexdigest()
            old = self.get(bundle_id)
            if old is not None:
                if old.sha256 != sha:
                    raise BundleRefused(f"{bundle_id} is already held with other contents; "
                                        "bundle it with a new --version", 409)
                return old
            held = Held(bundle_id, name, version, length, sha, secrets.token_urlsafe(24),
                        time.time())
            os.replace(tmp, self.path(held))
            with self._lock:
                self._db.execute("INSERT INTO bundles VALUES (?, ?)",
                                 (bundle_id, json.dumps(asdict(held))))
            return held
        finally:
            tmp.unlink(missing_ok=True)

    def close(self) -> None:
        """Close the index."""
        with self._lock:
            self._db.close()


def _peek(path: Path) -> tuple[str, str]:
    """(name, version) from a bundle's header, unverified (devices check the signature)."""
    try:
        with tarfile.open(path, "r:") as tar:
            m = tar.next()
            if m is None or m.name != HEADER or not m.isreg() or m.size > 1 << 20:
                raise BundleRefused(f"not an edgerun bundle (no {HEADER} first)")
            f = tar.extractfile(m)
            assert f is not None
            header = json.loads(f.read())
        name, version = header["name"], header["version"]
    except (tarfile.TarError, ValueError, KeyError, TypeError, EOFError) as e:
        if isinstance(e, BundleRefused):
            raise
        raise BundleRefused(f"not an edgerun bundle: {e}") from None
    if not isinstance(name, str) or not isinstance(version, str) \
            or not _ID.match(f"{name}@{version}") or not VERSION.match(version):
        raise BundleRefused(f"bundle names an unusable model {name!r} / version {version!r}")
    return name, version


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(first, last) byte of a `Range: bytes=N-[M]` header within `size`, None for no header;
    BundleRefused(416) for anything else (several ranges, suffix ranges, past the end)."""
    if header is None:
        return None
    m = _RANGE.match(header.strip())
    if not m:
        raise BundleRefused(f"only one Range of the form bytes=N- or bytes=N-M is served, got "
                            f"{header[:60]!r}", 416)
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) else size - 1
    if first >= size or last < first:
        raise BundleRefused(f"range {first}-{last} is outside the bundle's {size} bytes", 416)
    return first, min(last, size - 1)


def check_id(bundle_id: str) -> str:
    """A `name@version` from a URL; BundleRefused otherwise."""
    if not _ID.match(bundle_id):
        raise BundleRefused(f"not a bundle id (name@version): {bundle_id[:80]!r}", 404)
    return bundle_id
