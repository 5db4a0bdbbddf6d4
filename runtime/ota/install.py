"""Installing a model bundle: the steps `download` and `verify` (then profile, then swap).

The daemon runs them for a `deploy` command (download, verify and profile on a background
thread; the swap between frames on its main loop, runtime/device/ota.py); `edgerun models
install` runs them as a separate process, for a device being set up or serviced (the daemon
serves the new version from its next start): its commands, and the profile step outside the
daemon, are in runtime/cli_bundles.py, above every package they use.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.ota.model_store import ModelsConfig, ModelStore

if TYPE_CHECKING:  # imported late: `edgerun --help` must not load OpenCV and numpy
    from runtime.ota.bundle import BundleInfo

MB = 1024 * 1024
_SHA256 = re.compile(r"[0-9a-f]{64}")


def trusted_keys(cfg: ModelsConfig) -> dict[str, Any]:
    """The publisher keys by key id; ValueError naming a bad file."""
    from runtime.wire.commands import load_public_keys

    try:
        return load_public_keys(cfg.publisher_keys)
    except ValueError as e:
        raise ValueError(f"[models] publisher_keys: {e}") from e


def obtain(store: ModelStore, cfg: ModelsConfig, source: str, size: int = 0,
           sha256: str = "", token: str = "") -> Path:
    """Step `download`: a local bundle path as it is, an http(s) URL downloaded (resumably)
    into the store's downloads directory."""
    from runtime.ota.bundle import inside
    from runtime.ota.download import fetch

    if not source.startswith(("http://", "https://")):
        return Path(source)
    if sha256 and not _SHA256.fullmatch(sha256):  # it names the download file: never a path
        raise ValueError(f"the expected sha256 must be 64 lowercase hex digits, got "
                         f"{sha256[:80]!r}")
    name = sha256[:24] if sha256 else hashlib.sha256(source.encode()).hexdigest()[:24]
    return fetch(source, inside(store.downloads, f"{name}.edgerun"), size, token,
                 int(cfg.max_bundle_mb * MB), int(cfg.min_free_mb * MB), sha256)


def verify_step(store: ModelStore, cfg: ModelsConfig, bundle: Path) -> BundleInfo:
    """Step `verify`: signature and hashes; the version lands in the store (not yet served).
    A version this device already rolled back is refused with the reason it was."""
    from runtime.ota.bundle import BundleError, read_info

    trusted = trusted_keys(cfg)
    info = read_info(bundle, trusted)
    if why := store.rejected(info.id):
        raise BundleError(f"{info.id} was rolled back on this device before: {why}")
    return store.add(bundle, trusted, int(cfg.max_bundle_mb * MB))
