"""`edgerun check` says how long the card lasts at the daemon's measured rate of disk writes
(the newest `storage.write_bytes_per_day` in its health history) with [storage] rated_tbw."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.under_test import child_env

from runtime.wire.health_history import HealthHistory


def _check(tmp_path: Path, storage: str) -> str:
    cfg = tmp_path / "e.toml"
    cfg.write_text(f'[governor]\npolicy = "off"\n[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
                   f"{storage}")
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "check", str(cfg)],
                       capture_output=True, text=True, timeout=120, env=child_env())
    return next(line for line in r.stderr.splitlines() if "storage:" in line)


def _health(tmp_path: Path, *rates: float | tuple[float, float] | None) -> None:
    (tmp_path / "state").mkdir(exist_ok=True)
    hist = HealthHistory(tmp_path / "state")
    for i, rate in enumerate(rates):
        mine, card = rate if isinstance(rate, tuple) else (rate, None)
        hist.append({"t": 1_800_000_000.0 + i, "storage": {"write_bytes_per_day": mine,
                                                           "card_write_bytes_per_day": card}})


@pytest.mark.parametrize("rates, storage, says", [
    ((), "", "no rate of disk writes measured yet"),
    ((None,), "", "no rate of disk writes measured yet"),
    ((5e9, 2e9), "", "wrote 2000.0 MB a day (its last health); set [storage] rated_tbw"),
    ((2e9,), "[storage]\nrated_tbw = 10.0\n",
     "a new 10 TBW card lasts 5,000 days (13.7 years) at that rate"),
    # the card's own rate (the journal included) is what wears it
    (((2e9, 8e9),), "[storage]\nrated_tbw = 10.0\n",
     "its card 8000.0 MB a day (every writer, the journal included); a new 10 TBW card "
     "lasts 1,250 days (3.4 years) at that rate"),
    # under a year (the outside run's solar node: 3.7 GB a day on a 0.05 TBW card) in days
    # alone: it said "13 days (0.0 years)"
    ((3.7e9,), "[storage]\nrated_tbw = 0.05\n",
     "a new 0.05 TBW card lasts 14 days at that rate"),
    # and said as a warning (it ended "ok" with nothing more)
    ((3.7e9,), "[storage]\nrated_tbw = 0.05\n", "WARNING: storage: "),
    ((2e9,), "[storage]\nrated_tbw = 2.0\n", "1,000 days (2.7 years) at that rate, under 3 "
     "years: what writes is in docs/telemetry.md"),
])
def test_check_states_the_cards_life_at_the_measured_rate(tmp_path, rates, storage, says):
    _health(tmp_path, *rates)
    assert says in _check(tmp_path, storage)
