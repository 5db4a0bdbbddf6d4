"""A kill -9 storm (bench/kill_storm.py): `edgerun serve` SIGKILLed at drawn points of a run,
restarted each time, against a real Mosquitto and a real `edgerun coordinator`; every result
the daemon made is stored exactly once. And the storm's judge on hand-made outcomes."""

from __future__ import annotations

import json

import pytest
from support.benches import load_bench

from models import bundled

storm = load_bench("kill_storm")
needs_model = pytest.mark.skipif(not (bundled() / "manifest.json").exists(),
                                 reason="bundled model not built")


def _body(boot: str, t: float) -> str:
    return json.dumps({"boot": boot, "t": t, "label": "ok"})


@pytest.mark.parametrize(("rows", "held", "want"), [
    # (stream, seq, body) stored; seq -> identity the outbox held; (lost, changed, dup, streams)
    ([("s", 1, _body("a", 1.0)), ("s", 2, _body("a", 2.0))], {}, ([], [], [], 1)),
    ([("s", 1, _body("a", 1.0))], {}, ([2], [], [], 1)),  # seq 2 made, never stored
    ([("s", 1, _body("a", 1.0)), ("s", 2, _body("a", 1.0))], {}, ([], [], [(1, 2)], 1)),
    ([("s", 1, _body("a", 1.0)), ("s", 2, _body("b", 2.0))], {2: ("a", 2.0)},
     ([], [2], [], 1)),  # the outbox held another result as seq 2: one was lost
    ([("s", 1, _body("a", 1.0)), ("s", 2, _body("a", 2.0)), ("u", 2, _body("b", 3.0))], {},
     ([], [], [(2, 2)], 2)),  # a second stream re-sent seq 2
])
def test_judge_counts_what_was_lost_changed_and_duplicated(rows, held, want):
    r = storm.Report(seed=0)
    storm.judge(r, 2, held, rows)
    assert (r.lost, r.changed, r.duplicated, r.streams) == want
    assert r.ok == (want == ([], [], [], 1) and r.stored == r.made)


def test_render_says_what_a_storm_did():
    r = storm.Report(seed=5, made=3, stored=2, lost=[3], streams=1, wall_s=1.0)
    r.kills = [storm.Kill("log", "timer", 0.3, "start", 0, 0, 0),
               storm.Kill("spill", "append", 2.5, "connected", 4, 2, 0)]
    text = storm.render(r)
    assert "seed 5: 2 SIGKILLs" in text and "lost 1" in text and "lost seqs: [3]" in text
    assert "0.25-0.5s 1" in text and "2-3s 1" in text
    assert "results in SQLite 1 (50%)" in text
    assert text.endswith("exactly once: NO")


def _run(tmp_path, kills: int, seed: int):
    r = storm.storm(tmp_path, kills, seed, progress=print)
    print(storm.render(r))  # in the test's output: the numbers and the spread of kill points
    assert len(r.kills) == kills and not r.exits, r.exits[:3]
    assert r.made > 0 and r.ok, storm.render(r)
    return r


@needs_model
@pytest.mark.timeout(420)
def test_six_sigkills_of_serve_lose_and_duplicate_nothing(tmp_path):
    """Six kills, one of each kind the seed draws (a drawn delay, after a log line, at the Nth
    write to the result log or SQLite or send/receive on the socket)."""
    _run(tmp_path, 6, seed=27)


@needs_model
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fifty_sigkills_of_serve_lose_and_duplicate_nothing(tmp_path):
    """~3-4 minutes on a loaded 2-core box; `python bench/kill_storm.py` runs 500."""
    r = _run(tmp_path, 50, seed=20261206)
    assert len({k.sink for k in r.kills}) == len(storm.SINKS)  # every write path was hit
