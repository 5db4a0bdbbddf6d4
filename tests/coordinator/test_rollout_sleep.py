"""A canary that sleeps (a solar node, docs/sleep.md) is not a silent canary: the rollout's
verdict timeout counts only the time it was awake or expected awake; a sleeper that misses its
wake still fails. The pure clock with tables, then the real rollout code in a coordinator fed
real state messages, on both store backends."""

from __future__ import annotations

import time

import pytest

from runtime.coordinator import service
from runtime.coordinator.canary_clock import MAX_SLEEPS, asleep_s, note_sleep, overdue

T = 100.0  # rollout_timeout_s
M = 60.0  # wake_margin_s


@pytest.mark.parametrize("sent, now, sleeps, until, late", [
    (0, 50, [], None, None),                       # awake, within the timeout
    (0, 101, [], None, "no verdict within 100 s"),  # awake, silent: failed (as before)
    (0, 400, [[10, 500]], 500.0, None),            # asleep now, wake ahead: clock stopped
    (0, 545, [[10, 500]], 500.0, None),            # late for its wake, within the margin
    (0, 561, [[10, 500]], 500.0, "missed its wake"),  # past wake + margin, still asleep
    (0, 580, [[10, 500]], None, None),             # woke: 10 + 80 s awake
    (0, 591, [[10, 500]], None, "no verdict within 100 s of the deploy (awake; 490 s"),
    (100, 300, [[0, 250]], None, None),            # slept before and after the deploy: 50 s
    (0, 240, [[10, 100], [50, 150], [200, 210]], None, None),  # overlaps once: 240 - 150
    (0, 251, [[10, 100], [50, 150], [200, 210]], None, "no verdict"),  # 251 - 150 > 100
    (0, 140, [[-50, 30], [120, 130]], None, None),  # a sleep from before the deploy: 100 s
])
def test_overdue_table(sent, now, sleeps, until, late):
    why = overdue(sent, now, T, sleeps, until, M)
    if late is None:
        assert why is None, why
    else:
        assert why is not None and late in why, why


def test_asleep_s_and_note_sleep():
    assert asleep_s(0, 100, [[20, 40], [30, 60], [90, 200]]) == 50
    assert asleep_s(50, 100, [[0, 60]]) == 10
    sleeps: list[list[float]] = []
    assert note_sleep(sleeps, 10, 500, now=20)
    assert not note_sleep(sleeps, 12, 500, now=30)  # the same sleep seen again
    assert note_sleep(sleeps, 900, 1500, now=800) and sleeps[-1] == [800, 1500]  # clamped
    assert not note_sleep(sleeps, 10, 0, now=20)  # no wake announced: not a sleep
    for k in range(MAX_SLEEPS + 5):
        note_sleep(sleeps, 2000 + k, 2001 + k, now=1e9)
    assert len(sleeps) == MAX_SLEEPS


def test_a_sleeping_canary_holds_the_rollout_until_it_wakes_and_a_missed_wake_halts(
        tmp_path, store_url):
    """Old code: the canary asleep for longer than rollout_timeout_s halted its rollout
    ('no verdict within 100 s'), though the coordinator knew it was asleep until later."""
    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.service import Coordinator
    from runtime.wire import payloads

    coord = Coordinator(CoordinatorConfig(fleet="f", store=store_url, rollout_timeout_s=T,
                                          wake_margin_s=M, bundles_dir=str(tmp_path / "b")))
    sent = []
    args = {"name": "m", "version": "2", "url": "http://x/api/v1/bundles/m@2", "size": 1,
            "sha256": "0" * 64, "token": "t"}
    coord.rollouts._send = lambda d, c, a: sent.append((d, c))
    coord.rollouts._deploy_args = lambda b: args

    def state(device, online, t, **extra):
        now = time.time()
        coord._ingest([(payloads.topic("f", device, "state"), payloads.encode("state", {
            "v": 1, "online": online, "boot": "b", "t": t, **extra}), now)])

    try:
        t0 = time.time()
        for d in ("sun1", "sun2", "grid1"):
            state(d, True, t0)
        coord.rollouts.set_group("g", ["sun1", "grid1"])
        coord.rollouts.set_group("h", ["sun2", "grid1"])
        r = coord.rollouts.start("m@2", "g", 50)
        assert r["canary"] == ["sun1"] and sent == [("sun1", "deploy")]
        state("sun1", False, t0 + 1, asleep=True, wake_at=t0 + 500)  # a 500 s night
        coord.rollouts.tick(t0 + 2)
        coord.rollouts.tick(t0 + 400)  # asleep 399 s of the 400: not silent
        got = coord.rollouts.get(r["id"])
        assert got["state"] == "canary", got["reason"]
        assert got["devices"]["sun1"]["sleeps"][0][1] == t0 + 500
        state("sun1", True, t0 + 2)  # it wakes (its birth; stamped by the real clock)
        assert service.sleep_of(coord.views.get("sun1")) is None
        coord.rollouts.tick(t0 + 560)  # 1 s before the sleep + 60 s after it
        assert coord.rollouts.get(r["id"])["state"] == "canary"
        coord.rollouts.tick(t0 + 610)  # 111 s awake without a verdict: failed, halted
        got = coord.rollouts.get(r["id"])
        assert got["state"] == "halted" and "no verdict within 100 s" in got["reason"] \
            and "asleep not counted" in got["reason"], got["reason"]

        # a canary that misses its announced wake fails (at wake + margin), and halts
        r2 = coord.rollouts.start("m@2", "h", 50)
        assert r2["canary"] == ["grid1"]  # sorted: grid1 before sun2
        coord.rollouts._set_desired("sun2", {})
        state("grid1", False, t0 + 1, asleep=True, wake_at=t0 + 200)
        coord.rollouts.tick(t0 + 200 + M - 1)
        assert coord.rollouts.get(r2["id"])["state"] == "canary"
        coord.rollouts.tick(t0 + 200 + M + 1)
        got = coord.rollouts.get(r2["id"])
        assert got["state"] == "halted" and "missed its wake" in got["reason"], got["reason"]
    finally:
        coord.store.close()
        coord.shelf.close()
