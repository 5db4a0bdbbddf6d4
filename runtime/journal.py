"""Log lines journald files at their real priority.

Under systemd the daemon's stderr is a stream to journald, which reads a leading `<N>`
(syslog priority, sd-daemon(3); `SyslogLevelPrefix=` is on by default) and files the line
at that priority, so `journalctl -p warning` finds the WARNINGs. Without the prefix every
line is filed at the unit's default (info). The prefix is only written when stderr really
is that stream: systemd sets `JOURNAL_STREAM=<dev>:<inode>` of it (systemd.exec(5)), and a
child that inherited the variable but writes to a file or a terminal gets plain text.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import TextIO

# logging level -> syslog priority (syslog(3)): CRIT 2, ERR 3, WARNING 4, INFO 6, DEBUG 7
_PRIORITY = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4),
             (logging.INFO, 6))
FORMAT = "%(levelname)s %(name)s: %(message)s"


def priority(levelno: int) -> int:
    """The syslog priority of a logging level (levels between two round down to the lower
    severity, e.g. 25 -> info; anything below INFO is debug)."""
    for level, prio in _PRIORITY:
        if levelno >= level:
            return prio
    return 7


def connected(stream: TextIO | None = None) -> bool:
    """True when `stream` (stderr by default) is the journal stream systemd set up for this
    process: its device and inode match `$JOURNAL_STREAM`."""
    want = os.environ.get("JOURNAL_STREAM", "")
    if not want:
        return False
    try:
        st = os.fstat((stream or sys.stderr).fileno())
        dev, ino = (int(x) for x in want.split(":"))
    except (OSError, ValueError, AttributeError):  # no fd (a test's StringIO), garbage value
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


class JournalFormatter(logging.Formatter):
    """Prefixes every line of a record (a traceback included: journald parses each line on
    its own) with the record's `<N>` priority."""

    def format(self, record: logging.LogRecord) -> str:
        """The usual text, each line starting with `<N>`."""
        prefix = f"<{priority(record.levelno)}>"
        return "\n".join(prefix + line for line in super().format(record).split("\n"))


def setup(level: int, stream: TextIO | None = None) -> bool:
    """Configure root logging to `stream` (stderr) at `level`: with journald priorities when
    connected to the journal, plain text otherwise. Returns whether prefixes are on.

    On the journal, the two other ways Python writes to stderr go through logging too, so
    they carry a priority instead of landing at info: `warnings.warn` (a library's
    RuntimeWarning: WARNING, logger `py.warnings`) and an exception that ends a thread
    (CRITICAL, every traceback line prefixed)."""
    stream = stream or sys.stderr
    journal = connected(stream)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JournalFormatter(FORMAT) if journal else logging.Formatter(FORMAT))
    logging.basicConfig(level=level, handlers=[handler])
    if journal:
        logging.captureWarnings(True)
        threading.excepthook = _thread_died
    return journal


def _thread_died(args: threading.ExceptHookArgs) -> None:
    """An uncaught exception ended a thread: one CRITICAL record with its traceback."""
    if args.exc_type is SystemExit:
        return  # what the default hook does: a thread's sys.exit() is not a crash
    name = args.thread.name if args.thread is not None else "?"
    logging.getLogger("edgerun").critical(
        "thread %s died of an uncaught exception", name,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback))


def error_line(text: str, stream: TextIO | None = None) -> str:
    """`text` as an error line for `stream`: `<3>`-prefixed (each line) on the journal
    stream, unchanged elsewhere. For messages printed rather than logged (a refused config)."""
    if not connected(stream):
        return text
    return "\n".join("<3>" + line for line in text.split("\n"))
