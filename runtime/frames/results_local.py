"""Results on the box itself: `serve --print`, a rotated JSONL file, snapshots of non-ok frames.

These are views, not a second store: the outbox is a result's one durable home on the device
(docs/daemon.md, "One home for results"). The pipeline hands each stored group here after the
outbox commit (`submit`): a set lookup and a non-blocking queue put on the infer thread,
nothing more. A `local-results` thread prints, appends and encodes JPEGs, so a slow disk or a
4K frame never delays inference. When that thread falls behind, groups are dropped and
counted (the outbox still has every result); at most `MAX_PENDING_IMAGES` frames wait for
encoding, so memory stays bounded.

A sink that fails (disk full, stdout closed) is reported (log, rate-limited, and an event)
and counted; the others and the daemon go on. Snapshot files are named
`<UTC time>-<seq>-<label>.jpg` with a `.json` sidecar (the result), written to a temporary
name and renamed, so a reader never sees half a file; retention deletes the oldest pairs
beyond `keep` or older than `max_age_h`, and only files with that name pattern.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import queue
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import cv2

from runtime.config.results import JsonlConfig, ResultsConfig, SnapshotConfig
from runtime.config.schema import ConfigError
from runtime.wire.clock import SteadyWall
from runtime.wire.events import EventType

log = logging.getLogger("edgerun.results")

MAX_PENDING_IMAGES = 32  # frames held for snapshot encoding; beyond, snapshots are skipped
QUEUE_GROUPS = 1024  # result groups waiting for the local sinks
_SNAP = re.compile(r"^(\d{8}T\d{6}\d{3}Z)-(\d+)-([A-Za-z0-9_.-]{1,64})\.jpg$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def snapshot_labels(cfg: SnapshotConfig, labels: tuple[str, ...]) -> Callable[[str], bool]:
    """Which labels get a snapshot: the configured ones, else every label except the first of
    the manifest (by convention the ok/normal class; a manifest without labels reports class
    indices, so "0")."""
    if cfg.labels:
        wanted = frozenset(cfg.labels)
        if labels and (unknown := sorted(wanted - set(labels))):
            log.warning("results.snapshots.labels: %s not among the model's labels (%s); "
                        "no snapshot will ever match them", unknown, ", ".join(labels))
        return wanted.__contains__
    ok = labels[0] if labels else "0"
    return lambda label: label != ok


def print_line(r: dict[str, Any]) -> str:
    """One result as a line: UTC time, source ref (`<source>/<ref>` for a named source), label,
    score, variant, rung. The ref comes
    from outside (a file name): whitespace and control characters in it are escaped so a
    result is always exactly one line of six fields."""
    ref = "".join(c if c.isprintable() and not c.isspace() else f"\\x{ord(c):02x}"
                  for c in str(r["ref"]))
    if r.get("source", "main") != "main":  # several cameras: which one (names have no spaces)
        ref = f"{r['source']}/{ref}"
    return (f"{_stamp(r['t'], '%Y-%m-%dT%H:%M:%S', '.')} {ref} {r['label']} "
            f"{r['score']:.4f} {r['variant']} rung {r['rung']}")


def _stamp(t: float, fmt: str, sep: str) -> str:
    ms = int((t % 1) * 1000)
    return time.strftime(fmt, time.gmtime(t)) + f"{sep}{ms:03d}Z"


class Jsonl:
    """Appends results to `path`, rotating to path.1 .. path.keep by size."""

    def __init__(self, cfg: JsonlConfig):
        self.cfg = cfg
        self.path = Path(cfg.path).expanduser()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = self.path.open("ab")
        except OSError as e:
            raise ConfigError(f"results.jsonl.path {self.path}: cannot open for appending: "
                              f"{e.strerror or e}") from e
        self._size = self._f.tell()

    def write(self, results: list[dict[str, Any]]) -> None:
        """Append one line per result (rotating first when a line would not fit)."""
        for r in results:
            line = json.dumps(r, separators=(",", ":"), allow_nan=False).encode() + b"\n"
            if self._size and self._size + len(line) > self.cfg.max_bytes:
                self._rotate()
            self._f.write(line)
            self._size += len(line)
        self._f.flush()

    def _rotate(self) -> None:
        self._f.close()
        keep = self.cfg.keep
        if keep == 0:
            self.path.unlink(missing_ok=True)
        else:
            Path(f"{self.path}.{keep}").unlink(missing_ok=True)
            for i in range(keep - 1, 0, -1):
                older = Path(f"{self.path}.{i}")
                if older.exists():
                    older.rename(f"{self.path}.{i + 1}")
            self.path.rename(f"{self.path}.1")
        self._f = self.path.open("ab")
        self._size = 0

    def close(self) -> None:
        """Flush and close."""
        self._f.close()


class Snapshots:
    """JPEG + JSON sidecar per snapshot in `dir`, with retention by count and age."""

    def __init__(self, cfg: SnapshotConfig):
        self.cfg = cfg
        self.dir = Path(cfg.dir).expanduser()
        # ages judged by a wall time that never steps forward (runtime/wire/clock.py): an NTP
        # sync a week ahead must not delete every snapshot named by the clock before it
        self._clock = SteadyWall(what="snapshot expiry")
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            names = [p.name for p in self.dir.iterdir()]
            if not os.access(self.dir, os.W_OK | os.X_OK):
                raise PermissionError(13, "not writable")
        except OSError as e:
            raise ConfigError(f"results.snapshots.dir {self.dir}: cannot use: "
                              f"{e.strerror or e}") from e
        # (name stem) oldest first; names start with the UTC time, so sorting is by age
        self._held: collections.deque[str] = collections.deque(
            sorted(n[:-4] for n in names if _SNAP.match(n)))
        self.saved = 0
        self.expire()

    def save(self, image: Any, r: dict[str, Any]) -> None:
        """Write one snapshot (atomically: temporary name, then rename), then apply retention."""
        stem = f"{_stamp(r['t'], '%Y%m%dT%H%M%S', '')}-{r.get('seq', 0)}-" \
               f"{_UNSAFE.sub('_', str(r['label']))[:64]}"
        ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, self.cfg.quality])
        if not ok:
            raise ValueError(f"JPEG encoding failed for {r['ref']}")
        self._write(self.dir / f"{stem}.json",
                    json.dumps(r, indent=1, allow_nan=False).encode())
        self._write(self.dir / f"{stem}.jpg", buf.tobytes())
        self._held.append(stem)
        self.saved += 1
        self.expire()

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            # a new file: the name is known in advance, and a link planted there (the
            # directory is often a share) must be replaced, not written through
            tmp.unlink(missing_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)  # a full disk leaves no half-written file behind
            raise

    def expire(self) -> None:
        """Delete the oldest snapshots beyond `keep` and those older than `max_age_h`."""
        cutoff = self._clock.now() - self.cfg.max_age_h * 3600 if self.cfg.max_age_h else None
        while self._held and (len(self._held) > self.cfg.keep or (
                cutoff is not None and _age_t(self._held[0]) < cutoff)):
            stem = self._held.popleft()
            for ext in (".jpg", ".json"):
                (self.dir / f"{stem}{ext}").unlink(missing_ok=True)

    def __len__(self) -> int:
        return len(self._held)


def _age_t(stem: str) -> float:
    """The UTC time a snapshot name starts with."""
    import calendar

    ts = stem.split("-", 1)[0]
    return calendar.timegm(time.strptime(ts[:15], "%Y%m%dT%H%M%S")) + int(ts[15:18]) / 1e3


class LocalResults:
    """The local sinks and their thread (see module docstring)."""

    def __init__(self, cfg: ResultsConfig, on_event: Callable[[dict], None],
                 stdout: TextIO | None = None):
        self.cfg = cfg
        self._event = on_event
        self._out = stdout or sys.stdout
        self._print = cfg.print
        self.jsonl = Jsonl(cfg.jsonl) if cfg.jsonl.path else None
        self.snapshots = Snapshots(cfg.snapshots) if cfg.snapshots.dir else None
        self._q: queue.Queue = queue.Queue(maxsize=QUEUE_GROUPS)
        self._images = threading.BoundedSemaphore(MAX_PENDING_IMAGES)  # frames held
        self._wanted: tuple[tuple[str, ...], Callable[[str], bool]] | None = None
        # Every key made now: health copies the dict from another thread, and a key added
        # meanwhile would change its size during the copy.
        self.counters: collections.Counter = collections.Counter({k: 0 for k in (
            "local_dropped", "snapshots_saved", "snapshots_skipped", "print_errors",
            "jsonl_errors", "snapshots_errors")})
        self._said: dict[str, float] = {}
        self._thread = threading.Thread(target=self._run, name="local-results", daemon=True)

    def start(self) -> None:
        """Start the sink thread."""
        self._thread.start()

    def submit(self, frames: list[Any], results: list[dict[str, Any]], seqs: list[int],
               labels: tuple[str, ...]) -> None:
        """Hand over a stored group (infer thread; never blocks). `frames[i]` produced
        `results[i]`, stored as outbox seq `seqs[i]`; `labels` are the running manifest's
        (a detector's after "none", its result when nothing was found)."""
        images: list[Any] = [None] * len(results)
        if self.snapshots is not None:
            if self._wanted is None or self._wanted[0] != labels:
                self._wanted = (labels, snapshot_labels(self.cfg.snapshots, labels))
            want = self._wanted[1]
            for i, r in enumerate(results):
                if want(r["label"]):
                    if not self._images.acquire(blocking=False):
                        self.counters["snapshots_skipped"] += 1
                        continue
                    images[i] = frames[i].image
        try:
            self._q.put_nowait((results, seqs, images))
        except queue.Full:
            for x in images:
                if x is not None:
                    self._images.release()
            self.counters["local_dropped"] += len(results)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Write what is queued, then close the files."""
        if self._thread.is_alive():
            try:  # a sink stuck on a dead disk must not hold up the shutdown
                self._q.put(None, timeout=timeout_s)
                self._thread.join(timeout_s)
            except queue.Full:
                log.warning("local results: the sink thread is stuck; %d groups not written",
                            self._q.qsize())
        if self.jsonl is not None:
            self.jsonl.close()

    def stats(self) -> dict[str, int]:
        """Counters for health (merged into the pipeline's)."""
        return dict(self.counters)

    def _run(self) -> None:
        while True:
            try:
                item = self._q.get(timeout=60)
            except queue.Empty:  # a quiet line: snapshots still age out
                if self.snapshots is not None:
                    self._guard("snapshots", self.snapshots.expire)
                continue
            if item is None:
                return
            results, seqs, images = item
            if seqs and len(seqs) == len(results):  # the outbox seq joins a line to MQTT
                results = [{**r, "seq": s} for r, s in zip(results, seqs, strict=True)]
            if self._print:
                self._guard("print", self._print_all, results)
            if self.jsonl is not None:
                self._guard("jsonl", self.jsonl.write, results)
            for image, r in zip(images, results, strict=True):
                if image is None:
                    continue
                if self._guard("snapshots", self.snapshots.save, image, r):
                    self.counters["snapshots_saved"] += 1
                self._images.release()

    def _print_all(self, results: list[dict[str, Any]]) -> None:
        try:
            self._out.write("".join(print_line(r) + "\n" for r in results))
            self._out.flush()
        except BrokenPipeError:
            self._print = False  # `serve --print | head`: the reader left; keep serving
            raise OSError("stdout was closed by its reader; printing stopped") from None

    def _guard(self, sink: str, fn: Callable[..., Any], *args: Any) -> bool:
        """Run one sink's work; a failure is counted and reported (once a minute per sink),
        never raised: the other sinks and the daemon go on."""
        try:
            fn(*args)
            return True
        except Exception as e:
            self.counters[f"{sink}_errors"] += 1
            now = time.monotonic()
            if now - self._said.get(sink, -1e9) >= 60:
                self._said[sink] = now
                log.warning("local results: %s failed: %s (results stay in the outbox; "
                            "retrying with the next ones)", sink, e)
                self._event({"type": EventType.LOCAL_RESULTS_FAILED, "severity": "warning",
                             "sink": sink, "error": str(e)[:300]})
            return False
