"""Regenerate the measured sections of docs/power.md: the governor bench (pure simulation with
sensor noise over several seeds, and the real daemon in the loop) and the solar bench.

    python bench/power_report.py [--daemon-runs 2] [--seeds 3]

Each section is the bench's own output, verbatim, between `<!-- bench:NAME -->` markers, with
the command that made it and the date; the prose around it is edited by hand.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
DOC = HERE.parent / "docs" / "power.md"


def run(cmd: list[str]) -> str:
    """The bench's output (it exits non-zero when a target is missed; the output says which)."""
    print("$", " ".join(cmd), flush=True)
    out = subprocess.run([sys.executable, *cmd], capture_output=True, text=True,
                         cwd=HERE.parent)
    if out.returncode not in (0, 1):
        raise SystemExit(f"{cmd} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return out.stdout


def replace_block(text: str, name: str, body: str) -> str:
    """Put `body` between the markers of block `name` (appended when they are missing)."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{body.rstrip()}\n{end}"
    pat = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    return pat.sub(lambda _: block, text) if pat.search(text) else f"{text.rstrip()}\n\n{block}\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--daemon-runs", type=int, default=2)
    args = ap.parse_args()
    day = time.strftime("%Y-%m-%d")
    gov = ["bench/governor.py", "--seeds", str(args.seeds), "--daemon", "--daemon-runs",
           str(args.daemon_runs)]
    sol = ["bench/solar.py"]
    text = DOC.read_text()
    for name, cmd in (("governor", gov), ("solar", sol)):
        out = run(cmd)
        text = replace_block(text, name, f"`python {' '.join(cmd)}` ({day}):\n\n```\n{out}```")
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
