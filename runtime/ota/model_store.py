"""On-device model versions: side by side in the state directory, one atomic `current` pointer.

    <state_dir>/models/
        versions/<name>@<version>/   verified model directories (manifest + variants)
        staging/                     bundles being unpacked (removed at start)
        downloads/                   partial and complete downloads (resumed)
        current.json                 {"current": id, "previous": id|null, "probation": {...}|null,
                                      "rejected": {id: reason}}

An install runs download -> verify (unpack into staging, fsync, rename into versions/) ->
profile -> swap. The swap is the only step that changes what is served: the new pointer is
written to a temporary file, fsynced, renamed over `current.json` and the directory fsynced,
so after a `kill -9` or power cut at any point the pointer names either the old version or the
new one, and each names a complete verified directory (a version directory appears only by
rename after every file was checked and fsynced). Nothing is served from staging. The previous
version is kept for rollback; older ones are removed.

`EDGERUN_CRASH_AT=<step>` (tests only) makes the process SIGKILL itself at that step:
`download`, `verify`, `profile`, `swap` (new pointer written, not yet renamed), `swapped`,
and `serving` (the daemon at start, once it chose what to serve: a crash loop).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.config.models import ModelsConfig
from runtime.durable import crash_point, fsync_dir, write_atomic

if TYPE_CHECKING:  # bundle is imported late: it loads the model-file code (numpy)
    from runtime.ota.bundle import BundleInfo

log = logging.getLogger("edgerun.models")

MANIFEST = "manifest.json"  # runtime.engine.manifest.MANIFEST (not imported: cv2, numpy)
POINTER = "current.json"
VERSION = 1


class ModelStore:
    """The versions in `<state_dir>/models` and the pointer to the one to serve."""

    def __init__(self, state_dir: str | Path):
        self.root = Path(state_dir).expanduser() / "models"
        self.versions = self.root / "versions"
        self.staging = self.root / "staging"
        self.downloads = self.root / "downloads"
        for d in (self.versions, self.staging, self.downloads):
            d.mkdir(parents=True, exist_ok=True)
        self.pointer = self.root / POINTER

    # -- the pointer --------------------------------------------------------------------------

    def read(self) -> dict[str, Any]:
        """The pointer document (empty fields when none was ever written). An unreadable one
        is moved aside and logged: the configured model is served, never a guess."""
        empty = {"v": VERSION, "current": None, "previous": None, "probation": None,
                 "rejected": {}}
        try:
            doc = json.loads(self.pointer.read_text())
            if not isinstance(doc, dict) or doc.get("v") != VERSION:
                raise ValueError("unknown version")
            doc = {**empty, **doc}
            # a field of the wrong type raised TypeError/AttributeError at every start
            for key, types in (("current", (str, type(None))), ("previous", (str, type(None))),
                               ("probation", (dict, type(None))), ("rejected", (dict,))):
                if not isinstance(doc[key], types):
                    raise ValueError(f"{key} is a {type(doc[key]).__name__}")
            return doc
        except FileNotFoundError:
            return empty
        except (OSError, ValueError, RecursionError) as e:  # deep nesting stopped every start
            bad = self.pointer.with_name(POINTER + ".bad")
            log.error("model pointer %s unreadable (%s): moved to %s; serving the configured "
                      "model", self.pointer, e, bad)
            with contextlib.suppress(OSError):
                os.replace(self.pointer, bad)
            return empty

    def _write(self, doc: dict[str, Any]) -> None:
        # crash_at "swap": the new pointer is written and fsynced, not yet renamed
        write_atomic(self.pointer, json.dumps(doc, indent=1), crash_at="swap")

    def path(self, vid: str | None) -> Path | None:
        """The directory of version `vid` when it is complete (has its manifest); None also
        for anything that is not a `name@version` naming a directory inside versions/."""
        if not vid:
            return None
        from runtime.ota.bundle import BundleError

        try:
            p = self.version_dir(vid)
        except BundleError:
            return None
        return p if (p / MANIFEST).is_file() else None

    def version_dir(self, vid: str) -> Path:
        """versions/<vid> for a valid `name@version` (runtime.ota.bundle.parse_id), proven
        inside versions/ once resolved; BundleError otherwise."""
        from runtime.ota.bundle import inside, parse_id

        parse_id(vid)
        return inside(self.versions, vid)

    def serving(self) -> tuple[str | None, Path | None]:
        """(version id, directory) to serve: the pointer's current, else its previous (a
        current that vanished is logged), else (None, None): the configured model."""
        doc = self.read()
        for key in ("current", "previous"):
            p = self.path(doc.get(key))
            if p is not None:
                if key == "previous":
                    log.error("model version %s named by %s is missing; serving the previous "
                              "version %s", doc.get("current"), self.pointer, doc["previous"])
                return doc[key], p
        if doc.get("current"):  # the fleet deployed it: serving another must not go unsaid
            log.error("model version %s named by %s is missing (no complete directory under "
                      "%s) and there is no previous version; serving the configured model",
                      doc["current"], self.pointer, self.versions)
        return None, None

    def has(self, vid: str) -> bool:
        """A complete version `vid` is on disk."""
        return self.path(vid) is not None

    def ids(self) -> list[str]:
        """Complete versions on disk."""
        return sorted(p.name for p in self.versions.iterdir() if (p / MANIFEST).is_file())

    def switch(self, vid: str, baseline: dict[str, Any] | None = None) -> None:
        """Make `vid` current (atomic), keeping the one it replaces as `previous`, and start
        its probation (`baseline`: the old model's KPIs, see runtime.ota.probation)."""
        if not self.has(vid):
            from runtime.ota.bundle import BundleError

            raise BundleError(f"model version {vid} is not on this device")
        doc = self.read()
        old = doc.get("current")
        if old == vid:
            return
        # previous None: the configured model ([model] path) is the one to go back to
        doc.update(current=vid, previous=old,
                   probation={"since": time.time(), "boots": 0, "baseline": baseline or {}})
        self._write(doc)
        crash_point("swapped")
        self.prune()

    def set_current(self, vid: str | None) -> None:
        """Record the version served now without probation (the first one, or a choose)."""
        doc = self.read()
        if doc.get("current") != vid:
            doc.update(current=vid, previous=doc.get("current"), probation=None)
            self._write(doc)

    def passed(self) -> None:
        """Probation passed: the current version stays, no more boot counting."""
        doc = self.read()
        if doc.get("probation") is not None:
            doc["probation"] = None
            self._write(doc)

    def rollback(self, reason: str) -> str | None:
        """Back to the previous version (atomic); the failed one is remembered as rejected
        with `reason` so it is not installed again. Returns the version now current."""
        doc = self.read()
        failed, prev = doc.get("current"), doc.get("previous")
        if failed:
            doc["rejected"] = {**doc.get("rejected", {}), failed: reason[:500]}
        doc.update(current=prev if self.has(prev or "") else None, previous=None,
                   probation=None)
        self._write(doc)
        return doc["current"]

    def boot(self, crash_boots: int) -> str | None:
        """At daemon start: count a start made during probation; at `crash_boots` the version
        never passed in that many starts (a crash loop) and is rolled back. Returns the reason
        of such a rollback, else None. Also clears staging left by a killed install."""
        for p in self.staging.iterdir():
            shutil.rmtree(p, ignore_errors=True)
        doc = self.read()
        pro = doc.get("probation")
        if not pro:
            return None
        boots = int(pro.get("boots", 0)) + 1
        if boots >= crash_boots:
            why = (f"crash loop: {boots} starts while {doc['current']} was in probation "
                   "without passing it")
            self.rollback(why)
            return why
        doc["probation"] = {**pro, "boots": boots}
        self._write(doc)
        return None

    def rejected(self, vid: str) -> str | None:
        """Why `vid` was rolled back on this device, or None."""
        return self.read().get("rejected", {}).get(vid)

    # -- installing ---------------------------------------------------------------------------

    def add(self, bundle: Path, trusted: Any, max_bytes: int = 0) -> BundleInfo:
        """Verify and unpack a bundle into versions/ (unless that version is already there).
        Raises BundleError with the reason; nothing refused stays on disk."""
        from runtime.ota.bundle import BundleError, inside, read_info, unpack

        info = read_info(bundle, trusted)
        if self.has(info.id):
            return info
        final = self.version_dir(info.id)  # the signed name is checked before any write
        tmp = inside(self.staging, f"{info.id}.{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)

        def step(name: str) -> None:
            crash_point("verify")

        got = unpack(bundle, tmp, trusted, max_bytes, step)
        if got.id != info.id:  # the bundle changed under us between the two reads
            shutil.rmtree(tmp, ignore_errors=True)
            raise BundleError(f"{bundle}: changed while it was being verified")
        shutil.rmtree(final, ignore_errors=True)  # an incomplete leftover (no manifest)
        os.replace(tmp, final)
        fsync_dir(self.versions)
        return got

    def prune(self) -> None:
        """Remove versions other than current and previous (and downloads of them)."""
        doc = self.read()
        keep = {doc.get("current"), doc.get("previous")}
        for p in self.versions.iterdir():
            if p.name not in keep:
                shutil.rmtree(p, ignore_errors=True)


__all__ = ["ModelStore", "ModelsConfig"]

