"""The OPC UA standard address space kept on disk (`[opcua]`): asyncua's ~7,000 standard
nodes as a shelf that the server reads node by node when a client asks (asyncua's
LazyLoadingDict), instead of building all of them in memory at every start.

Built in memory they are ~56 MB of the daemon's resident set that nothing reads (a PLC
browses edgerun's few folders); the shelf is made once per asyncua version, in a child
process (so the daemon's own memory never holds the whole space), in a folder beside the
daemon's state that is renamed into place only when whole.

`python -m runtime.telemetry.opcua_aspace DIR` makes it (what `shelf()` runs).
"""

from __future__ import annotations

import asyncio
import dbm
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

log = logging.getLogger("edgerun.opcua")
BUILD_TIMEOUT_S = 120.0  # ~3 s on a desktop core; a Pi-class core takes several times that


def shelf_path(state_dir: Path, version: str) -> Path:
    """Where the shelf of this asyncua version lives (a new version: a new shelf, since the
    nodes are pickled asyncua objects)."""
    return Path(state_dir).expanduser() / f"opcua-aspace-{version}" / "aspace"


def ready(path: Path) -> bool:
    """Whether a whole shelf is at `path` (dbm knows its files, whichever backend made it)."""
    return bool(dbm.whichdb(str(path)))


def shelf(state_dir: Path, version: str) -> Path | None:
    """The shelf of the standard address space, made first (in a child process) when it is
    not there yet; None when it cannot be (the server then builds the space in memory)."""
    path = shelf_path(state_dir, version)
    if ready(path):
        return path
    try:
        path.parent.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".opcua-aspace-", dir=path.parent.parent))
        try:
            subprocess.run([sys.executable, "-m", "runtime.telemetry.opcua_aspace",
                            str(tmp / path.name)], check=True, timeout=BUILD_TIMEOUT_S,
                           capture_output=True)
            os.rename(tmp, path.parent)  # whole, or not there
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except (OSError, subprocess.SubprocessError) as e:
        err = getattr(e, "stderr", b"") or b""
        log.warning("OPC UA: could not keep the standard address space in %s (%s%s); it is "
                    "built in memory", path.parent, e, f": {err[-300:]!r}" if err else "")
        return None
    return path if ready(path) else None


async def _build(path: Path) -> None:
    from asyncua.server.internal_server import InternalServer

    # no shelf there yet: asyncua fills the space from its generated code, then shelves it
    await InternalServer().load_standard_address_space(path)


if __name__ == "__main__":
    asyncio.run(_build(Path(sys.argv[1])))
