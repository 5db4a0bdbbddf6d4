"""The Sparkplug edge node's session table (runtime/telemetry/sparkplug/session.py): births,
bdSeq, seq, the 3.0 primary host STATE rule and the births' rate bound, step by step."""

from __future__ import annotations

import pytest

from runtime.telemetry.sparkplug.session import (
    BIRTH_WINDOW_S,
    Action,
    Event,
    Kind,
    Phase,
    Session,
    may_publish_data,
    next_bd_seq,
    step,
    take_seq,
)

B, N = Action.BIRTH, ()


def run(s: Session, events: list[tuple]) -> list[tuple[Phase, tuple]]:
    """Feed (kind, now, extra kwargs...) events; the phase and actions after each."""
    out = []
    for kind, now, *kw in events:
        s, actions = step(s, Event(kind, now, **(kw[0] if kw else {})))
        out.append((s.phase, actions))
    return out


@pytest.mark.parametrize("primary,events,want", [
    # no primary host: a birth at connect, none while a snapshot is missing
    (False, [(Kind.CONNECTED, 0, {"bd_seq": 3})], [(Phase.BORN, (B,))]),
    (False, [(Kind.CONNECTED, 0, {"ready": False}), (Kind.TICK, 1, {"ready": False}),
             (Kind.TICK, 2)],
     [(Phase.BIRTH_DUE, N), (Phase.BIRTH_DUE, N), (Phase.BORN, (B,))]),
    # with one: held until its STATE says online; offline holds the data again
    (True, [(Kind.CONNECTED, 0), (Kind.TICK, 1), (Kind.HOST_ONLINE, 2, {"host_ts": 10}),
            (Kind.HOST_OFFLINE, 3, {"host_ts": 11}), (Kind.REBIRTH, 4),
            (Kind.HOST_ONLINE, 5, {"host_ts": 12})],
     [(Phase.WAITING_HOST, N), (Phase.WAITING_HOST, N), (Phase.BORN, (B,)),
      (Phase.WAITING_HOST, N), (Phase.WAITING_HOST, N), (Phase.BORN, (B,))]),
    # a STATE older than the last one is stale: ignored
    (True, [(Kind.CONNECTED, 0), (Kind.HOST_ONLINE, 1, {"host_ts": 10}),
            (Kind.HOST_OFFLINE, 2, {"host_ts": 9})],
     [(Phase.WAITING_HOST, N), (Phase.BORN, (B,)), (Phase.BORN, (Action.STALE_STATE,))]),
    # rebirth on NCMD; a host that says online again may have lost us: born again
    (True, [(Kind.CONNECTED, 0), (Kind.HOST_ONLINE, 1, {"host_ts": 1}), (Kind.REBIRTH, 2),
            (Kind.HOST_ONLINE, 3, {"host_ts": 2})],
     [(Phase.WAITING_HOST, N), (Phase.BORN, (B,)), (Phase.BORN, (B,)), (Phase.BORN, (B,))]),
    # a lost connection ends everything; the host is learnt again after the next connect
    (True, [(Kind.CONNECTED, 0), (Kind.HOST_ONLINE, 1, {"host_ts": 5}), (Kind.LOST, 2),
            (Kind.REBIRTH, 3), (Kind.CONNECTED, 4), (Kind.HOST_ONLINE, 5, {"host_ts": 5})],
     [(Phase.WAITING_HOST, N), (Phase.BORN, (B,)), (Phase.OFFLINE, N), (Phase.OFFLINE, N),
      (Phase.WAITING_HOST, N), (Phase.BORN, (B,))]),
])
def test_the_session_table(primary, events, want):
    assert run(Session(primary=primary), events) == want


def test_a_birth_resets_seq_and_keeps_the_connections_bd_seq():
    s, actions = step(Session(), Event(Kind.CONNECTED, 0, bd_seq=7))
    assert actions == (B,) and s.bd_seq == 7 and s.seq == 1  # NBIRTH took 0
    seqs = []
    for _ in range(300):
        s, n = take_seq(s)
        seqs.append(n)
    assert seqs[:3] == [1, 2, 3] and seqs[254:257] == [255, 0, 1]  # wraps at 255
    s, actions = step(s, Event(Kind.REBIRTH, 1))
    assert actions == (B,) and s.seq == 1 and s.bd_seq == 7  # a rebirth: same bdSeq
    s, _ = step(s, Event(Kind.LOST, 2))
    s, _ = step(s, Event(Kind.CONNECTED, 3, bd_seq=next_bd_seq(s.bd_seq)))
    assert s.bd_seq == 8


@pytest.mark.parametrize("previous,want", [(None, 0), (0, 1), (254, 255), (255, 0)])
def test_bd_seq_counts_connections_mod_256(previous, want):
    assert next_bd_seq(previous) == want


def test_a_flapping_primary_host_gets_a_bounded_number_of_births():
    s = Session(primary=True, max_births=6)
    s, _ = step(s, Event(Kind.CONNECTED, 0))
    births, t = 0, 0.0
    for i in range(200):  # online/offline every 0.1 s for 20 s
        t += 0.1
        kind = Kind.HOST_ONLINE if i % 2 == 0 else Kind.HOST_OFFLINE
        s, actions = step(s, Event(kind, t, host_ts=i))
        births += actions.count(B)
    assert births == 6
    # the host settles online: the held birth goes out once the window allows, not before
    s, _ = step(s, Event(Kind.HOST_ONLINE, t, host_ts=1000))
    assert s.phase == Phase.BIRTH_DUE and not may_publish_data(s)
    s, actions = step(s, Event(Kind.TICK, t + 1))
    assert actions == N
    s, actions = step(s, Event(Kind.TICK, 0.1 + BIRTH_WINDOW_S))
    assert actions == (B,) and may_publish_data(s)


def test_data_flows_only_when_born():
    for phase in Phase:
        assert may_publish_data(Session(phase=phase)) == (phase == Phase.BORN)
