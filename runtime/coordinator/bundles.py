"""Model bundles held by the coordinator for devices to download (docs/ota.md).

`edgerun fleet deploy BUNDLE` uploads the file (`PUT /api/v1/bundles`, spooled to a temporary
file, at most `max_bundle_mb`); the coordinator reads its header (name, version, sizes: the
signature is the devices' to check, against their own publisher keys) and keeps it **in the
store** (store.py: tables `bundles` and `bundle_chunks`, on SQLite or PostgreSQL), so every
coordinator sharing the store holds every bundle: upload through one, download through any.
The bytes are rows of at most CHUNK_BYTES (1 MiB) keyed by (sha256, index): content-addressed,
written one row per transaction (an upload never holds the store's write lock for long) and
before the bundle's row, which is what makes the bundle visible. An upload cut off halfway
leaves no bundle. While it writes, an upload holds a row in `bundle_uploads` (refreshed with
each chunk row); the bundle's row and the end of that one are one transaction. An upload that
fails removes its rows; one that died (kill -9) leaves its rows under a stale upload row, and
`sweep` (at the coordinator's start and in each retention pass) removes them, with any chunk
rows of no bundle or past a bundle's end.

Devices get the URL, size, sha256 and a random download token (one per bundle, the same on
every coordinator) in the signed `deploy` command and download with `Authorization: Bearer
<token>` (valid for that bundle only), resuming with Range requests served from the rows.

Read API (stable; the MQTT chunk server reads through it too): `get(bundle_id)` and
`read(held, offset, length)`. `delete(bundle_id)` removes a bundle nothing needs any more
(`DELETE /api/v1/bundles/{id}`, `edgerun fleet bundles rm ID`).
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import re
import secrets
import sqlite3
import tarfile
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from runtime.durable import crash_point
from runtime.ota.bundle import HEADER, BundleError, model_id, parse_id
from runtime.wire import safejson

if TYPE_CHECKING:
    from runtime.coordinator.store import Store

log = logging.getLogger("edgerun.coordinator.bundles")

_SHA = re.compile(r"^[0-9a-f]{64}$")
_RANGE = re.compile(r"^bytes=(\d{1,18})-(\d{0,18})$")
CHUNK = 1 << 16  # upload read size
# bytes per bundle_chunks row; rows are keyed by (sha256, index), so changing this needs the
# rows rewritten (each bundle records the size it was written with: Held.chunk)
CHUNK_BYTES = 1 << 20
CACHE_CHUNKS = 8  # chunk rows kept in memory (small reads of one chunk: MQTT transfer)
# an upload whose row has not been refreshed (a chunk written) for this long has died
UPLOAD_STALE_S = 900.0
# a bundle's chunk rows (sha256 ?) when no bundle row and no upload in progress holds them
_DELETE_ORPHAN = ("DELETE FROM bundle_chunks WHERE sha256=? AND NOT EXISTS (SELECT 1 FROM "
                  "bundles WHERE sha256=?) AND NOT EXISTS (SELECT 1 FROM bundle_uploads "
                  "WHERE sha256=?)")


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
    chunk: int = 1 << 20  # bytes per bundle_chunks row (the last one may be shorter)

    def public(self) -> dict:
        """Without the download token (listings)."""
        d = asdict(self)
        del d["token"], d["chunk"]
        return d


class Shelf:
    """The bundles in the coordinator's store (tables `bundles`, `bundle_chunks`)."""

    def __init__(self, store: Store, max_bytes: int, owner: str = ""):
        self._store = store
        self.max_bytes = max_bytes
        self.owner = owner  # whose uploads (the coordinator's client_id): see `sweep`
        self.chunk_bytes = CHUNK_BYTES  # rows written here; each bundle records its own
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[tuple[str, int, int], bytes] = \
            collections.OrderedDict()

    def get(self, bundle_id: str) -> Held | None:
        """The bundle `bundle_id` (`name@version`), or None."""
        rows = self._store.read("SELECT body FROM bundles WHERE id=?", (bundle_id,))
        return _held(rows[0][0]) if rows else None

    def list(self) -> list[Held]:
        """Every bundle held, oldest first."""
        rows = self._store.read("SELECT body FROM bundles ORDER BY created")
        return [h for (b,) in rows if (h := _held(b)) is not None]

    def stored_bytes(self) -> int:
        """Bytes of the bundles' chunk rows (retention leaves them out of max_store_mb)."""
        rows = self._store.read("SELECT COALESCE(SUM(LENGTH(data)), 0) FROM bundle_chunks")
        return int(rows[0][0])

    def read(self, held: Held, offset: int, length: int) -> bytes:
        """`length` bytes of the bundle from `offset` (fewer only at its end), from its chunk
        rows. BundleRefused(416) for an offset outside it; BundleRefused(500) when a row is
        missing or short (the store was changed under it)."""
        if offset < 0 or length < 0 or offset >= held.size:
            raise BundleRefused(f"offset {offset} is outside the bundle's {held.size} bytes",
                                416)
        end, step = min(held.size, offset + length), held.chunk
        out = bytearray()
        for idx in range(offset // step, (end - 1) // step + 1 if length else 0):
            data = self._chunk(held, idx)
            out += data[max(offset - idx * step, 0):end - idx * step]
        return bytes(out)

    def _chunk(self, held: Held, idx: int) -> bytes:
        key = (held.sha256, held.chunk, idx)
        with self._lock:
            data = self._cache.get(key)
            if data is not None:
                self._cache.move_to_end(key)
                return data
        rows = self._store.read("SELECT data FROM bundle_chunks WHERE sha256=? AND idx=?",
                                (held.sha256, idx))
        want = min(held.chunk, held.size - idx * held.chunk)
        data = bytes(rows[0][0]) if rows else b""
        if len(data) != want:
            raise BundleRefused(f"bundle {held.id}: chunk {idx} is "
                                f"{'missing' if not rows else f'{len(data)} bytes'} in the "
                                f"store (want {want}); upload the bundle again", 500)
        with self._lock:
            self._cache[key] = data
            while len(self._cache) > CACHE_CHUNKS:
                self._cache.popitem(last=False)
        return data

    def receive(self, src: IO[bytes], length: int) -> Held:
        """Store an uploaded bundle of `length` bytes read from `src`; BundleRefused when it
        is too big, short, not a bundle, or another file under the same name@version."""
        if length <= 0 or length > self.max_bytes:
            raise BundleRefused(f"bundle of {length} bytes: must be 1..{self.max_bytes} "
                                "(coordinator.max_bundle_mb)", 413)
        h = hashlib.sha256()
        with tempfile.TemporaryFile(prefix="edgerun-upload-") as tmp:
            got = 0
            while got < length:
                chunk = src.read(min(CHUNK, length - got))
                if not chunk:
                    break
                h.update(chunk)
                tmp.write(chunk)
                got += len(chunk)
            if got != length:
                raise BundleRefused(f"upload ended after {got} of {length} bytes")
            tmp.seek(0)
            name, version = _peek(tmp)
            bundle_id, sha = f"{name}@{version}", h.hexdigest()
            old = self.get(bundle_id)
            if old is not None and old.sha256 != sha:
                raise BundleRefused(f"{bundle_id} is already held with other contents; "
                                    "bundle it with a new --version", 409)
            if old is not None and self._whole(old):
                return old
            # chunk rows first, under an upload row (refreshed with each chunk) that tells
            # them from the rows of an upload that died; the bundle's row and the end of the
            # upload's in one transaction. A failure here removes what it wrote (unless
            # another bundle or upload has the same bytes); a kill -9 leaves them to `sweep`.
            upload = secrets.token_hex(8)
            done = False
            try:
                tmp.seek(0)
                # rows lost from a held bundle (a partial restore, a hand-made DELETE): reading
                # it says "upload the bundle again", which mends it with its own chunk size
                self._write_chunks(tmp, sha, length, old.chunk if old else None, upload)
                held = old or Held(bundle_id, name, version, length, sha,
                                   secrets.token_urlsafe(24), time.time(), self.chunk_bytes)
                with self._store.transaction() as db:
                    # two coordinators taking the same id at once: the first row stays (ON
                    # CONFLICT DO NOTHING) and is compared below
                    db.execute("INSERT INTO bundles (id, sha256, size, created, body) "
                               "VALUES (?,?,?,?,?) ON CONFLICT(id) DO NOTHING",
                               (held.id, sha, length, held.created, json.dumps(asdict(held))))
                    db.execute("DELETE FROM bundle_uploads WHERE id=?", (upload,))
                done = True
            finally:
                if not done:
                    self._abandon(upload, sha)
            old = self.get(bundle_id)
            if old is None:  # `delete` ran between our row and this read
                raise BundleRefused(f"{bundle_id} was deleted while it was being uploaded; "
                                    "upload it again", 409)
            if old.sha256 != sha:
                self._abandon("", sha)  # lost the race for the id: our rows are nobody's
                raise BundleRefused(f"{bundle_id} is already held with other contents; "
                                    "bundle it with a new --version", 409)
            if not self._whole(old):  # rows taken meanwhile (by hand): written again
                tmp.seek(0)
                self._write_chunks(tmp, sha, length, old.chunk)
            return old

    def _abandon(self, upload: str, sha: str) -> None:
        """An upload that will not finish: its row, and its chunk rows unless a bundle or
        another upload holds the same bytes (best effort: what is left, `sweep` removes)."""
        try:
            with self._store.transaction() as db:
                db.execute("DELETE FROM bundle_uploads WHERE id=?", (upload,))
                n = len(db.execute(_DELETE_ORPHAN + " RETURNING idx", (sha, sha, sha)
                                   ).fetchall())
            if n:
                log.info("bundle upload %s... abandoned: removed its %d chunk rows", sha[:12],
                         n)
        except Exception as e:  # the store failing is likely why we are here
            log.error("bundle upload %s... abandoned, and its chunk rows could not be "
                      "removed now (%s): the next sweep (start, retention) removes them",
                      sha[:12], e)

    def sweep(self, at_start: bool = False, now: float | None = None) -> dict[str, int]:
        """Remove chunk rows no bundle needs: those of an upload that died (its upload row
        not refreshed for UPLOAD_STALE_S, or at start any of this coordinator's own, `owner`:
        they died with its previous run), those of no bundle and no upload (written by an
        older version, or a bundle's row deleted by hand), and those past a bundle's last
        chunk. An upload in progress keeps its rows. Logs what it removed and the bytes
        freed; returns {"uploads", "rows", "bytes"}."""
        # stale by the store's clock, which stamped the rows (another coordinator's clock
        # behind this one's must not make its live uploads look dead); `now`: tests
        sql, args = (f"DELETE FROM bundle_uploads WHERE t < {_now(self._store)} - ?",
                     [UPLOAD_STALE_S]) if now is None else (
            "DELETE FROM bundle_uploads WHERE t < ?", [now - UPLOAD_STALE_S])
        if at_start:
            sql, args = sql + " OR owner = ?", [*args, self.owner]
        with self._store.transaction() as db:
            dead = {sha for (sha,) in db.execute(sql + " RETURNING sha256", args).fetchall()}
        orphans = self._store.read(
            "SELECT sha256 FROM bundle_chunks c WHERE NOT EXISTS (SELECT 1 FROM bundles b "
            "WHERE b.sha256 = c.sha256) AND NOT EXISTS (SELECT 1 FROM bundle_uploads u WHERE "
            "u.sha256 = c.sha256) GROUP BY sha256")
        removed: list[str] = []
        rows = freed = 0
        for (sha,) in orphans:
            with self._store.transaction() as db:  # one bundle's rows a transaction
                got = db.execute(_DELETE_ORPHAN + " RETURNING LENGTH(data)",
                                 (sha, sha, sha)).fetchall()
            if got:
                rows, freed = rows + len(got), freed + sum(int(n) for (n,) in got)
                removed.append(f"{sha[:12]}... {len(got)} rows"
                               f"{' (an upload that died)' if sha in dead else ''}")
        ends: dict[str, int] = {}
        for held in self.list():
            ends[held.sha256] = max(ends.get(held.sha256, 0), -(-held.size // held.chunk))
        for sha, end in sorted(ends.items()):
            with self._store.transaction() as db:
                got = db.execute("DELETE FROM bundle_chunks WHERE sha256=? AND idx >= ? AND "
                                 "NOT EXISTS (SELECT 1 FROM bundle_uploads WHERE sha256=?) "
                                 "RETURNING LENGTH(data)", (sha, end, sha)).fetchall()
            if got:
                rows, freed = rows + len(got), freed + sum(int(n) for (n,) in got)
                removed.append(f"{sha[:12]}... {len(got)} rows past its bundle's last chunk")
        if rows:
            with self._lock:
                self._cache.clear()
            log.warning("bundle shelf: removed %d chunk rows no bundle needs, %d bytes "
                        "(%.1f MB) freed in the store (%s)", rows, freed, freed / 2**20,
                        "; ".join(removed[:10]))
        return {"uploads": len(dead), "rows": rows, "bytes": freed}

    def _whole(self, held: Held) -> bool:
        """Whether every chunk row of `held` is in the store, of the right size."""
        n, total = self._store.read("SELECT COUNT(*), COALESCE(SUM(LENGTH(data)), 0) FROM "
                                    "bundle_chunks WHERE sha256=? AND idx < ?",
                                    (held.sha256, -(-held.size // held.chunk)))[0]
        return int(n) == -(-held.size // held.chunk) and int(total) == held.size

    def _write_chunks(self, src: IO[bytes], sha: str, length: int,
                      step: int | None = None, upload: str = "") -> None:
        """The bytes as rows of `step` (default `chunk_bytes`), one short transaction each;
        with `upload`, each also (re)writes that upload's row with the time (see `sweep`)."""
        step = step or self.chunk_bytes
        for idx in range((length + step - 1) // step):
            data = src.read(step)
            with self._store.transaction() as db:
                if upload:
                    # the store's clock, as `sweep` judges it: coordinators' clocks differ
                    db.execute("INSERT INTO bundle_uploads (id, sha256, owner, t) VALUES "
                               f"(?,?,?,{_now(self._store)}) ON CONFLICT(id) DO UPDATE SET "
                               "t = excluded.t", (upload, sha, self.owner))
                db.execute("INSERT INTO bundle_chunks (sha256, idx, data) VALUES (?,?,?) "
                           "ON CONFLICT(sha256, idx) DO UPDATE SET data = excluded.data",
                           (sha, idx, data))
            crash_point("bundle_upload")

    def delete(self, bundle_id: str) -> dict[str, Any]:
        """Remove bundle `bundle_id`: its row and its chunk rows (unless another bundle row,
        or an upload in progress, holds the same bytes) in one transaction, with the check
        that nothing needs it.
        BundleRefused(404) when it is not held; BundleRefused(409), naming the rollout or the
        devices, while an unfinished rollout (canary, rolling) deploys it or may put it back
        on its canary (their model before), or while it is any device's desired model (the
        coordinator re-sends that to a device returning with another). Returns {"id",
        "chunks", "bytes"}: the chunk rows deleted and their bytes."""
        check_id(bundle_id)
        with self._store.transaction() as db:
            # PostgreSQL: the row locked first, so a rollout's `held_now` waits for this
            # transaction (SQLite: BEGIN IMMEDIATE already excludes every other writer)
            row = db.execute("SELECT sha256 FROM bundles WHERE id=?" + _lock(self._store, "UPDATE"),
                             (bundle_id,)).fetchone()
            if row is None:
                raise BundleRefused(f"no bundle {bundle_id} held by this coordinator", 404)
            sha = row[0]
            if why := _in_use(db, bundle_id):
                raise BundleRefused(why, 409)
            db.execute("DELETE FROM bundles WHERE id=?", (bundle_id,))
            # its rows, unless another bundle row or an upload in progress has the same bytes
            got = db.execute(_DELETE_ORPHAN + " RETURNING LENGTH(data)",
                             (sha, sha, sha)).fetchall()
            n, freed = len(got), sum(int(b) for (b,) in got)
        with self._lock:
            for key in [k for k in self._cache if k[0] == sha]:
                del self._cache[key]
        log.info("bundle %s deleted: %d chunk rows, %d bytes freed in the store", bundle_id,
                 n, freed)
        return {"id": bundle_id, "chunks": int(n), "bytes": int(freed)}

    def import_dir(self, directory: str | Path) -> list[str]:
        """Bundles of a shelf directory of an older coordinator (its `index.db` and
        `<id>.edgerun` files) into the store, keeping their download tokens (devices mid-way
        through a rollout hold them). Returns the ids imported; a missing directory, or a
        bundle already in the store, is skipped."""
        index = Path(directory).expanduser() / "index.db"
        if not index.is_file():
            return []
        db = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
        try:
            rows = db.execute("SELECT body FROM bundles").fetchall()
        except sqlite3.Error:
            rows = []
        finally:
            db.close()
        done = []
        for (body,) in rows:
            held = _held(body)
            path = index.parent / f"{held.id}.edgerun" if held else None
            if held is None or path is None or not path.is_file() \
                    or path.stat().st_size != held.size or self.get(held.id) is not None:
                continue
            # the bytes must be the ones the old index names: a file damaged on disk since
            # would be served under that sha256, and every device would fetch all of it only
            # to refuse it
            h = hashlib.sha256()
            with path.open("rb") as f:
                while block := f.read(CHUNK):
                    h.update(block)
            if h.hexdigest() != held.sha256:
                log.error("bundle %s in %s: its bytes do not match the sha256 of its index "
                          "entry (damaged on disk?): not imported; upload it again",
                          held.id, index.parent)
                continue
            held = replace(held, chunk=self.chunk_bytes)
            upload, finished = secrets.token_hex(8), False
            try:
                with path.open("rb") as f:
                    self._write_chunks(f, held.sha256, held.size, upload=upload)
                with self._store.transaction() as db:
                    db.execute("INSERT INTO bundles (id, sha256, size, created, body) "
                               "VALUES (?,?,?,?,?) ON CONFLICT(id) DO NOTHING",
                               (held.id, held.sha256, held.size, held.created,
                                json.dumps(asdict(held))))
                    db.execute("DELETE FROM bundle_uploads WHERE id=?", (upload,))
                finished = True
            finally:
                if not finished:
                    self._abandon(upload, held.sha256)
            done.append(held.id)
        return done

    def close(self) -> None:
        """Drop the cached chunks (the store is the coordinator's to close)."""
        with self._lock:
            self._cache.clear()


def _now(store: Store) -> str:
    """SQL for the store's clock in Unix seconds (one clock for every coordinator on it)."""
    if store.backend == "postgresql":
        return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"
    return "((julianday('now') - 2440587.5) * 86400.0)"


def _lock(store: Store, mode: str) -> str:
    """` FOR <mode>` on PostgreSQL (read committed: a plain read does not wait for a writer);
    nothing on SQLite, whose write transactions are serialised."""
    return f" FOR {mode}" if store.backend == "postgresql" else ""


def held_now(store: Store, bundle_id: str) -> bool:
    """Whether `bundle_id` is held, read after any `Shelf.delete` of it under way has ended
    (a rollout stored before this read is seen by every delete after it: rollout.py)."""
    with store.transaction() as db:
        return db.execute("SELECT 1 FROM bundles WHERE id=?" + _lock(store, "SHARE"),
                          (bundle_id,)).fetchone() is not None


def _model_id(args: Any) -> str:
    """`name@version` of a deploy command's arguments (a desired model), else ""."""
    if isinstance(args, dict):
        return f"{args.get('name')}@{args.get('version')}"
    return ""


def _in_use(db: Any, bundle_id: str) -> str:
    """Why `bundle_id` must not be deleted now (see Shelf.delete), or "" when it may. The
    rows are narrowed with LIKE on its version, then read as JSON (a row that is not is
    skipped: it names no bundle)."""
    like = f"%{bundle_id.rpartition('@')[2]}%"
    for rid, body in db.execute("SELECT id, body FROM rollouts WHERE body LIKE ?",
                                (like,)).fetchall():
        try:
            r = json.loads(body)
            state, devices = r.get("state"), r.get("devices") or {}
            if state not in ("canary", "rolling"):
                continue
            if r.get("bundle") == bundle_id:
                return (f"{bundle_id} is in use: rollout {rid} deploys it ({state}); wait for "
                        "it to finish or halt")
            back = sorted(d for d, st in devices.items()
                          if isinstance(st, dict) and _model_id(st.get("before")) == bundle_id)
        except (ValueError, AttributeError, TypeError):
            continue
        if back:
            return (f"{bundle_id} is in use: rollout {rid} ({state}) puts it back on "
                    f"{', '.join(back[:5])}{' ...' if len(back) > 5 else ''} if it halts")
    wanted = []
    for device, body in db.execute("SELECT device, body FROM desired WHERE body LIKE ?",
                                   (like,)).fetchall():
        try:
            if _model_id(json.loads(body).get("model")) == bundle_id:
                wanted.append(device)
        except (ValueError, AttributeError):
            continue
    if wanted:
        wanted.sort()
        return (f"{bundle_id} is in use: it is the desired model of {len(wanted)} device(s) "
                f"({', '.join(wanted[:5])}{' ...' if len(wanted) > 5 else ''}); deploy "
                "another version to them first")
    return ""


def _held(body: str) -> Held | None:
    """A `bundles` row's body as Held; None when it is not one (a forged or damaged row: a
    size or chunk that is not a positive integer, an id or sha256 of the wrong form)."""
    try:
        h = Held(**json.loads(body))
    except (ValueError, TypeError):
        return None
    ints = all(isinstance(x, int) and not isinstance(x, bool) and x > 0
               for x in (h.size, h.chunk))
    if not ints or not _valid_id(h.id) \
            or not isinstance(h.sha256, str) or not _SHA.match(h.sha256) \
            or not isinstance(h.token, str) or not h.token:
        return None
    return h


def _valid_id(bundle_id: Any) -> bool:
    try:
        parse_id(bundle_id)
    except BundleError:
        return False
    return True


def _peek(src: IO[bytes]) -> tuple[str, str]:
    """(name, version) from a bundle's header, unverified (devices check the signature)."""
    try:
        with tarfile.open(fileobj=src, mode="r:") as tar:
            m = tar.next()
            if m is None or m.name != HEADER or not m.isreg() or m.size > 1 << 20:
                raise BundleRefused(f"not an edgerun bundle (no {HEADER} first)")
            f = tar.extractfile(m)
            assert f is not None
            header = safejson.loads(f.read())  # hostile bytes: RecursionError, NaN...
        name, version = header["name"], header["version"]
    except (tarfile.TarError, ValueError, KeyError, TypeError, EOFError) as e:
        if isinstance(e, BundleRefused):
            raise
        raise BundleRefused(f"not an edgerun bundle: {e}") from None
    try:  # the devices' own rule (runtime.ota.bundle.model_id): one function, both sides
        model_id(name, version)
    except BundleError as e:
        raise BundleRefused(f"bundle names an unusable model: {e}") from None
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
    try:
        parse_id(bundle_id)
    except BundleError:
        raise BundleRefused(f"not a bundle id (name@version): {bundle_id[:80]!r}", 404) from None
    return bundle_id
