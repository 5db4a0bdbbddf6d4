"""`edgerun models bundle|verify|install|ls`: a model bundle signed, checked and installed by
hand, and the profile step outside the daemon (`install`).

The steps themselves are runtime/ota/install.py's (the daemon runs the same ones for a
`deploy` command); the commands live here, on the CLI's layer, because `install` profiles
the new version as `serve` would, which takes the choice, the device profile and the engines:
a package below them cannot (tests/test_layering.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from runtime.durable import crash_point
from runtime.ota.install import MB, obtain, trusted_keys, verify_step
from runtime.ota.model_store import ModelsConfig, ModelStore

log = logging.getLogger("edgerun.models")


def profile_offline(cfg: Any, path: Path, progress: Callable[[int, int, str], None]) -> Any:
    """Step `profile` outside the daemon: measure every form as `serve` would (same cache, so
    the daemon's next start reuses the profiles). Returns runtime.choice.measure.Measured."""
    from power.nvml import gpu_meters
    from power.sensors import detect_meter
    from runtime.choice.measure import measure_model
    from runtime.device.profiles import load_profile
    from runtime.engine.backends import discover

    device = load_profile(cfg.device.profile)
    meter = detect_meter(Path(cfg.device.sysfs_root), device)
    # judged on inference alone, end-to-end target or not: the frame's costs around it are
    # for serving to measure
    c = replace(cfg.constraints, end_to_end_ms=None)
    return measure_model(path, cfg, discover(cfg.backends), meter, device.name,
                         device.power.active_w_per_core, None,
                         lambda v, e: log.error("variant %s refused: %s", v, e), progress,
                         c,
                         accelerators=device.accelerators, gpu_meters=gpu_meters())


# -- the commands ---------------------------------------------------------------------------

def cmd_bundle(args: argparse.Namespace) -> int:
    """`edgerun models bundle DIR --sign KEY`: pack and sign a prepared model directory."""
    from runtime.engine.onnx_model import ModelError
    from runtime.ota.bundle import SUFFIX, BundleError, make
    from runtime.wire.commands import load_private_key

    try:
        key = load_private_key(args.sign)
        out = args.out
        if out is None:
            from runtime.engine.manifest import load_manifest

            name = load_manifest(args.dir).name
            out = Path(f"{name}-{args.version}{SUFFIX}" if args.version else f"{name}{SUFFIX}")
        info = make(args.dir, key, out, args.version or "")
    except (ValueError, ModelError, BundleError, OSError) as e:
        print(f"edgerun models bundle: ERROR: {e}", file=sys.stderr)
        return 2
    if args.out is None and not args.version:  # name the file after the version it got
        final = out.with_name(f"{info.name}-{info.version}{SUFFIX}")
        out.replace(final)
        out = final
    print(f"bundle {out}: model {info.name} version {info.version}, {len(info.files)} files, "
          f"{info.size / 1024:.1f} KB, signed by publisher key {info.key_id}")
    return 0


def _models_cfg(args: argparse.Namespace) -> tuple[Any, ModelsConfig]:
    from runtime import config as config_mod

    cfg = config_mod.load(args.config)
    mc = cfg.models
    if getattr(args, "publisher_key", None):
        from dataclasses import replace

        mc = replace(mc, publisher_keys=tuple(args.publisher_key))
    return cfg, mc


def cmd_verify(args: argparse.Namespace) -> int:
    """`edgerun models verify BUNDLE`: check signature and every file, as a device would."""
    import tempfile

    from runtime.ota.bundle import BundleError, unpack

    _, mc = _models_cfg(args)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            info = unpack(args.bundle, Path(tmp) / "x", trusted_keys(mc),
                          int(mc.max_bundle_mb * MB))
    except (BundleError, ValueError) as e:
        print(f"REFUSED {e}", file=sys.stderr)
        return 1
    print(f"OK {args.bundle}: model {info.name} version {info.version}, {len(info.files)} "
          f"files verified, signed by {info.key_id}")
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    """`edgerun models install SOURCE --config CFG`: download, verify, profile, swap."""
    from runtime.ota.bundle import BundleError
    from runtime.ota.download import DownloadError

    cfg, mc = _models_cfg(args)
    store = ModelStore(cfg.daemon.state_dir)
    token = args.token_file.read_text().strip() if args.token_file else ""
    try:
        print(f"[download] {args.source}", file=sys.stderr, flush=True)
        bundle = obtain(store, mc, args.source, args.size or 0, args.sha256 or "", token)
        print(f"[verify] {bundle}", file=sys.stderr, flush=True)
        try:
            info = verify_step(store, mc, bundle)
        except BaseException:
            if bundle.parent == store.downloads:  # never resumed: the next try starts afresh
                print(f"[verify] refused: the download {bundle.name} is discarded; the next "
                      "attempt downloads it from the beginning", file=sys.stderr, flush=True)
            raise
        finally:
            if bundle.parent == store.downloads:  # ours (a download), not the user's file
                bundle.unlink(missing_ok=True)
        path = store.path(info.id)
        assert path is not None

        def progress(i: int, n: int, name: str) -> None:
            print(f"[profile] {name} {i}/{n}", file=sys.stderr, flush=True)
            crash_point("profile")

        measured = profile_offline(cfg, path, progress)
        print(f"[swap] {info.id}", file=sys.stderr, flush=True)
        store.switch(info.id)
    except (BundleError, DownloadError, ValueError, OSError) as e:
        print(f"edgerun models install: REFUSED: {e}", file=sys.stderr)
        return 1
    print(f"installed {info.id} ({len(measured.profiles)} forms profiled); it is served from "
          f"the daemon's next start, in probation against "
          f"{store.read().get('previous') or 'the configured model'}")
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    """`edgerun models ls --config CFG`: versions on the device and the pointer."""
    cfg, _ = _models_cfg(args)
    store = ModelStore(cfg.daemon.state_dir)
    doc = store.read()
    if args.json:
        print(json.dumps({**doc, "versions": store.ids()}, indent=2))
        return 0
    for vid in store.ids():
        mark = ("current" if vid == doc.get("current") else
                "previous" if vid == doc.get("previous") else "")
        print(f"{vid:<40} {mark}")
    print(f"serving {doc.get('current') or 'the configured model ([model] path)'}; "
          f"rollback goes to {doc.get('previous') or 'the configured model'}")
    if doc.get("probation"):
        print(f"probation: {doc['current']} since {doc['probation'].get('since', 0):.0f}, "
              f"{doc['probation'].get('boots', 0)} restarts")
    for vid, why in (doc.get("rejected") or {}).items():
        print(f"rejected {vid}: {why}")
    return 0


def add_parsers(msub: Any, common: argparse.ArgumentParser) -> None:
    """The `models bundle|verify|install|ls` subcommands (runtime.cli calls this)."""
    b = msub.add_parser("bundle", help="pack and sign a prepared model directory",
                        description=cmd_bundle.__doc__, parents=[common])
    b.add_argument("dir", type=Path, help="a directory made by `models prepare`")
    b.add_argument("--sign", type=Path, required=True, help="publisher private key (Ed25519 "
                   "PEM, from `edgerun keys`)")
    b.add_argument("--version", default="", help="version string (default: the manifest's "
                   "sha256, 12 hex)")
    b.add_argument("--out", type=Path, help="bundle file (default: NAME-VERSION.edgerun)")
    b.set_defaults(ota=cmd_bundle)
    for name, fn, helptext in (("verify", cmd_verify, "check a bundle as a device would"),
                               ("install", cmd_install, "install a bundle on this device"),
                               ("ls", cmd_ls, "model versions on this device")):
        p = msub.add_parser(name, help=helptext, description=fn.__doc__, parents=[common])
        if name == "verify":
            p.add_argument("bundle", type=Path)
        if name == "install":
            p.add_argument("source", help="a bundle file or an http(s) URL")
            p.add_argument("--size", type=int, help="bytes (required for a URL)")
            p.add_argument("--sha256", help="expected sha256 of the bundle file")
            p.add_argument("--token-file", type=Path, help="API token for the URL")
        p.add_argument("--config", type=Path, help="the device's config ([models], "
                       "[daemon] state_dir)")
        p.add_argument("--publisher-key", action="append", type=str,
                       help="trust this public key (instead of [models] publisher_keys)")
        p.add_argument("--json", action="store_true")
        p.set_defaults(ota=fn)
