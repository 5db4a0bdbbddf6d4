"""The edge node's coalescing rule (runtime/telemetry/sparkplug/metrics.py publish_points):
results read in one pass at the bounded rate become DDATA at every verdict change, at each
source's last live result, and at every historical one; the rest only count."""

from __future__ import annotations

import pytest

from runtime.telemetry.sparkplug.metrics import publish_points, verdict_of

OK, NG = "ok", "reject"


@pytest.mark.parametrize("items,last_sent,want", [
    # nothing read: nothing sent
    ([], {}, []),
    # a steady run of one verdict the host already shows: one DDATA, the last (counts)
    ([("a", OK, False)] * 5, {"a": OK}, [4]),
    # the host never saw a verdict from this source: the first result is a change
    ([("a", OK, False)] * 3, {}, [0, 2]),
    # a reject inside a run of OKs: the reject and the OK after it are both changes
    ([("a", OK, False), ("a", NG, False), ("a", OK, False), ("a", OK, False)], {"a": OK},
     [1, 2, 3]),
    # alternating verdicts: no coalescing possible, every result is a change
    ([("a", OK if i % 2 else NG, False) for i in range(5)], {"a": OK}, [0, 1, 2, 3, 4]),
    # the first result changes against what the host last saw
    ([("a", NG, False), ("a", NG, False)], {"a": OK}, [0, 1]),
    # a result without a label (verdict None) is a change like any other
    ([("a", None, False), ("a", OK, False)], {"a": OK}, [0, 1]),
    # sources are independent: each has its own previous verdict and its own last
    ([("a", OK, False), ("b", NG, False), ("a", OK, False), ("b", NG, False)],
     {"a": OK, "b": NG}, [2, 3]),
    ([("a", OK, False), ("b", OK, False), ("a", NG, False)], {"a": OK, "b": NG}, [1, 2]),
    # history goes out first-hand, every result; the live results after it coalesce
    ([("a", OK, True), ("a", OK, True), ("a", OK, False), ("a", OK, False)], {"a": OK},
     [0, 1, 3]),
    # history does not count as the live tag's previous verdict
    ([("a", NG, True), ("a", OK, False)], {"a": OK}, [0, 1]),
])
def test_publish_points(items, last_sent, want):
    assert publish_points(items, last_sent) == want


@pytest.mark.parametrize("items,every,want", [
    # a PLC-triggered source: every part's result, same verdict or not
    ([("plc", OK, False)] * 3, {"plc"}, [0, 1, 2]),
    # beside a free-running one, which still coalesces
    ([("plc", OK, False), ("cam", OK, False), ("plc", OK, False), ("cam", OK, False)],
     {"plc"}, [0, 2, 3]),
])
def test_a_plc_triggered_source_sends_every_result(items, every, want):
    assert publish_points(items, {"plc": OK, "cam": OK}, every) == want


def test_every_verdict_change_and_the_last_count_reach_the_host():
    """Whatever the sequence, a host that reads only the points sees each change of verdict
    (in order) and ends with the last result."""
    import random

    rng = random.Random(7)
    for _ in range(200):
        items = [(rng.choice("ab"), rng.choice([OK, NG, None]), False)
                 for _ in range(rng.randint(0, 30))]
        points = publish_points(items, {})
        for source in "ab":
            mine = [i for i, it in enumerate(items) if it[0] == source]
            seen = [items[i][1] for i in points if items[i][0] == source]
            changes = [items[i][1] for k, i in enumerate(mine)
                       if k == 0 or items[mine[k - 1]][1] != items[i][1]]
            dedup = [v for k, v in enumerate(seen) if k == 0 or seen[k - 1] != v]
            assert dedup == changes
            if mine:
                assert mine[-1] in points


@pytest.mark.parametrize("result,want", [
    ({"label": "ok"}, "ok"), ({"label": "none"}, "ok"), ({"label": "scratch"}, "reject"),
    ({}, None), ({"label": None}, None)])
def test_verdict_of(result, want):
    assert verdict_of(result, ("ok", "none")) == want
