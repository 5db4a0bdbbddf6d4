"""What `edgerun check` says about the configured sources: the problems `serve` would only
report after start-up, as a `source_failed` retried with backoff for ever (a folder that does
not exist, a video file that is not there, a camera URL whose host name does not resolve, a
trigger source without a broker, a pylon camera not found); and that serve would refuse a
pylon source without pypylon."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def notes(cfg: Any) -> list[str]:
    """One line per source (`[source]` or each `[[sources]]` entry): what it reads and, with
    "note:", why `serve` would not get frames from it now."""
    out = []
    entries = list(cfg.sources) if cfg.sources else [cfg.source]
    for src in entries:
        name = src.name or "main"
        why = _problem(src, bool(cfg.telemetry.broker.host))
        then = ("serve refuses to start" if why.startswith("pypylon") else
                "serve starts and retries it with backoff")
        out.append(f"source {name}: {src.kind}" + (f" {_shown(src.path)}" if src.path else "")
                   + (f" serial {src.serial}" if src.serial else "")
                   + (f"; note: {why} ({then})" if why else ""))
    return out


def _shown(path: str) -> str:
    from runtime.frames.stream_url import shown

    return shown(path)


def _problem(src: Any, has_broker: bool) -> str:
    try:
        if src.kind == "folder":
            p = Path(src.path).expanduser()
            return "" if p.is_dir() else f"{p} is not a directory (yet?)"
        if src.kind == "capture" and "://" in src.path:
            from runtime.frames.stream_url import unresolved

            return unresolved(src.path)
        if src.kind == "capture" and not src.path.isdigit():
            p = Path(src.path).expanduser()
            return "" if p.exists() else f"{p} does not exist (yet?)"
        if src.kind == "pylon":
            return _pylon_problem(src.serial)
        if src.kind == "trigger" and not has_broker:
            return "a trigger source needs telemetry.broker.host (it is empty)"
    except (OSError, ValueError) as e:  # a name the filesystem refuses
        return str(e)
    return ""


def _pylon_problem(serial: str) -> str:
    """Whether pypylon is there and finds the camera (by serial, or any)."""
    from runtime.frames.pylon_source import CameraError, Found, choose, pypylon

    try:
        pylon = pypylon()
    except ImportError:
        return "pypylon is not installed: pip install 'edgerun[camera]'"
    try:
        choose(serial, [Found(d.GetSerialNumber(), d.GetModelName(), d.GetFriendlyName())
                        for d in pylon.TlFactory.GetInstance().EnumerateDevices()])
    except CameraError as e:
        return str(e)
    return ""
