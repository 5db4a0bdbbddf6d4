"""Bundled models (with their variant manifests), the synthetic dataset and training recipes."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent


def bundled(name: str = "inspection") -> Path:
    """Directory of a bundled model (holds manifest.json and the variant files)."""
    return ROOT / name
