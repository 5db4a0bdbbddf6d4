"""Installed size of every distribution in a venv (sum of the files in its RECORD)."""
import sys
from importlib.metadata import distributions
from pathlib import Path

site = [str(p) for p in Path(sys.argv[1]).glob("lib/python3*/site-packages")]
rows = []
for d in distributions(path=site):
    total = 0
    for f in d.files or ():
        p = Path(d.locate_file(f))
        if p.is_file():
            total += p.stat().st_size
    rows.append((total, d.metadata["Name"], d.version))
for total, name, ver in sorted(rows, reverse=True):
    print(f"{total / 1e6:8.1f} MB  {name} {ver}")
print(f"{sum(r[0] for r in rows) / 1e6:8.1f} MB  total")
