"""`edgerun profile`'s progress on stderr: a bar on a terminal, a line per variant otherwise.

On a terminal one line redrawn in place (tqdm: the count, the rate, the time left and the
variant being measured); log lines printed meanwhile go above the bar, not through it. Piped
or redirected (CI, `2> file`), one plain `[n/N] variant` line each, as before: a log keeps
every step and no carriage returns.
"""

from __future__ import annotations

import contextlib
import os
import sys
from types import TracebackType
from typing import Any, TextIO


def _isatty(stream: TextIO) -> bool:
    """A terminal a bar can be drawn on: one that says it has columns (a pseudo-terminal
    nobody sized reports 0, where tqdm would draw an empty bar)."""
    try:
        return stream.isatty() and os.get_terminal_size(stream.fileno()).columns > 0
    except (AttributeError, ValueError, OSError):  # no isatty or fd, or a closed stream
        return False


class Progress:
    """A `progress(i, n, variant_id)` callback for runtime.choice.profiler.profile_all (called
    before variant i of n is measured); a context manager that finishes the bar."""

    def __init__(self, stream: TextIO | None = None, bar: bool | None = None):
        """`bar`: None decides by whether `stream` (stderr) is a terminal."""
        self.stream = stream if stream is not None else sys.stderr
        self.bar_wanted = _isatty(self.stream) if bar is None else bar
        self._bar: Any = None
        self._logs = contextlib.ExitStack()

    def __enter__(self) -> Progress:
        if self.bar_wanted:
            from tqdm.contrib.logging import logging_redirect_tqdm

            # log records (a failed variant's warning) printed above the bar, not across it
            self._logs.enter_context(logging_redirect_tqdm())
        return self

    def __call__(self, i: int, n: int, variant_id: str) -> None:
        """Variant `i` of `n` (1-based) is about to be measured."""
        if not self.bar_wanted:
            print(f"[{i}/{n}] {variant_id}", file=self.stream, flush=True)
            return
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=n, file=self.stream, unit="variant", dynamic_ncols=True,
                             desc="profiling")
        self._bar.set_postfix_str(variant_id, refresh=False)
        self._bar.update(i - 1 - self._bar.n)  # the variants before this one are done

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._bar is not None:
            if kind is None:  # every variant measured: the bar full, left on screen
                self._bar.set_postfix_str("done", refresh=False)
                self._bar.update(self._bar.total - self._bar.n)
            self._bar.close()
        self._logs.close()
