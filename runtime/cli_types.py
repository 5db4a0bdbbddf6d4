"""Argument types and the registration signature the per-package CLI modules share.

Each package's `cli` module registers its own subcommands (`add_*(sub, common)`) with the
parser `runtime/cli.py` builds; the types of its options that more than one package uses live
here, so no package's CLI imports another's.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Protocol


class Subparsers(Protocol):
    """What a package's CLI needs of argparse's subparsers action (a private class)."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        """A new subcommand's parser."""
        ...


def model(text: str) -> Path:
    """A model on the command line: a path that exists (an .onnx file or a model directory),
    else the name of a bundled model (`inspection`, `defects`), so it is found from any
    directory. A missing one is an argparse error naming the argument."""
    from runtime.config.source import BUNDLED_MODELS, bundled_names

    p = Path(text).expanduser()
    if p.exists():
        return p
    names = bundled_names()
    if text in names:
        return BUNDLED_MODELS / text
    raise argparse.ArgumentTypeError(
        f"{text!r}: no such file or directory, nor a bundled model "
        f"({', '.join(names) or 'none installed'})")


def shape(text: str) -> tuple[int, ...]:
    """Input dims like 1,3,224,224 (or 1x3x224x224), every one positive."""
    try:
        dims = tuple(int(x) for x in text.replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected dims like 1,3,224,224, got {text!r}") from None
    if any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(f"every dimension must be positive, got {text!r}")
    return dims


def ratio(text: str) -> float:
    """A number within 0..1."""
    try:
        r = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number 0..1, got {text!r}") from None
    if not 0 <= r <= 1:
        raise argparse.ArgumentTypeError(f"must be within 0..1, got {text!r}")
    return r


def _ints(text: str, expected: str, each: str, least: int) -> tuple[int, ...]:
    """A comma-separated list of integers, every one >= `least`."""
    try:
        out = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if any(n < least for n in out):
        raise argparse.ArgumentTypeError(f"every {each} must be at least {least}, got {text!r}")
    return out


def sizes(text: str) -> tuple[int, ...]:
    """`--sizes 80,64,48`: input heights of reduced-resolution forms, each at least 16."""
    return _ints(text, "input heights like 80,64,48", "size", 16)


def threads(text: str) -> tuple[int, ...]:
    """Thread counts like 1,4, every one >= 1."""
    return _ints(text, "thread counts like 1,4", "thread count", 1)

