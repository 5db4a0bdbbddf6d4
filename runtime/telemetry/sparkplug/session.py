"""The Sparkplug B 3.0 edge node's session: every rule about births, deaths, `seq`, `bdSeq`,
the primary host's STATE and rebirths lives in this file (h11 style), as a table.

Pure: `step(session, event) -> (session', actions)`; the MQTT I/O (runtime/telemetry/
sparkplug/node.py) feeds it events and carries out its actions. Phases:

    OFFLINE       no MQTT connection
    WAITING_HOST  connected; the primary host is not (known to be) online: data is held
    BIRTH_DUE     connected, a birth is wanted but waits for the births' rate bound or for
                  the first health snapshot (what a birth is made of); data is held
    BORN          NBIRTH and the DBIRTHs are out: data flows

Rules the table and its guards encode:
- `bdSeq` (0-255) is fixed per MQTT connection: the NDEATH will set at CONNECT carries it,
  and every NBIRTH of that connection (rebirths too) carries the same value.
- `seq` (0-255, wrapping) is on every message but NDEATH: NBIRTH is 0, each later message
  (DBIRTH, NDATA, DDATA) the previous one's + 1 mod 256.
- 3.0 primary host: with `primary_host_id` set, no birth while its STATE is not online;
  a STATE older (timestamp) than the last one accepted is stale and ignored; going offline
  holds the data (no new births, no data), coming online (again) asks for a birth.
- Births are bounded: at most `max_births` within BIRTH_WINDOW_S, whatever asks (a host
  flapping its STATE, NCMD rebirths); one asked for beyond the bound waits (BIRTH_DUE).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum


class Phase(StrEnum):
    """Where the session is (see module docstring)."""

    OFFLINE = "offline"
    WAITING_HOST = "waiting_host"
    BIRTH_DUE = "birth_due"
    BORN = "born"


class Kind(StrEnum):
    """What happened."""

    CONNECTED = "connected"  # CONNACK accepted (the will carried `bd_seq`)
    LOST = "lost"  # the connection dropped or was closed
    HOST_ONLINE = "host_online"  # STATE {"online": true}
    HOST_OFFLINE = "host_offline"  # STATE {"online": false}
    REBIRTH = "rebirth"  # NCMD Node Control/Rebirth = true
    TICK = "tick"  # time passed (the connection's thread, at least every 0.1 s)


class Action(StrEnum):
    """What the I/O must do after a step."""

    BIRTH = "birth"  # publish NBIRTH (seq 0) then every DBIRTH, now
    STALE_STATE = "stale_state"  # a STATE older than the last accepted: ignored (counted)


# (phase, event) -> the phase wanted. BIRTH_DUE is wanted only where the primary host allows
# a birth: `_host_ok` turns it into WAITING_HOST otherwise. A pair not in the table leaves
# the phase as it is (e.g. a REBIRTH while waiting for the host: no birth until it is back).
TABLE: dict[tuple[Phase, Kind], Phase] = {
    (Phase.OFFLINE, Kind.CONNECTED): Phase.BIRTH_DUE,
    (Phase.WAITING_HOST, Kind.HOST_ONLINE): Phase.BIRTH_DUE,
    (Phase.BIRTH_DUE, Kind.HOST_OFFLINE): Phase.WAITING_HOST,
    (Phase.BORN, Kind.HOST_OFFLINE): Phase.WAITING_HOST,
    # a host that says online again may have restarted and lost our birth: born again
    (Phase.BORN, Kind.HOST_ONLINE): Phase.BIRTH_DUE,
    (Phase.BORN, Kind.REBIRTH): Phase.BIRTH_DUE,
    **{(p, Kind.LOST): Phase.OFFLINE for p in Phase},
}

BIRTH_WINDOW_S = 60.0  # max_births are allowed within this window


@dataclass(frozen=True)
class Session:
    """The session's state; `primary` says whether a primary host gates births."""

    primary: bool = False
    max_births: int = 6
    phase: Phase = Phase.OFFLINE
    bd_seq: int = 0  # the bdSeq of the current connection (its will's)
    seq: int = 0  # the seq the next message after a birth gets
    host_online: bool = False  # the primary host's last accepted STATE
    host_ts: int = -1  # its timestamp (ms); older ones are stale
    births: tuple[float, ...] = ()  # times of the births within the window (oldest first)


@dataclass(frozen=True)
class Event:
    """One input: its kind, the time (monotonic s), and what it carries."""

    kind: Kind
    now: float
    bd_seq: int = 0  # CONNECTED
    host_ts: int = 0  # HOST_ONLINE / HOST_OFFLINE: the STATE's timestamp (ms)
    ready: bool = True  # TICK and the others: a health snapshot exists to birth from


def next_bd_seq(previous: int | None) -> int:
    """The bdSeq of the next connection: the previous one's + 1 mod 256 (0 for the first)."""
    return 0 if previous is None else (previous + 1) % 256


def take_seq(s: Session) -> tuple[Session, int]:
    """The seq of the next data or DBIRTH message, and the session after it."""
    return replace(s, seq=(s.seq + 1) % 256), s.seq


def step(s: Session, e: Event) -> tuple[Session, tuple[Action, ...]]:
    """The session after event `e`, and what to do now (see module docstring)."""
    if e.kind in (Kind.HOST_ONLINE, Kind.HOST_OFFLINE):
        if e.host_ts < s.host_ts:
            return s, (Action.STALE_STATE,)
        s = replace(s, host_online=e.kind == Kind.HOST_ONLINE, host_ts=e.host_ts)
    if e.kind == Kind.CONNECTED:
        # a new connection: its own bdSeq, and the host's state is learnt again from its
        # retained STATE (what we knew may have changed while we were away)
        s = replace(s, bd_seq=e.bd_seq, host_online=False, host_ts=-1)
    phase = TABLE.get((s.phase, e.kind), s.phase)
    if phase == Phase.BIRTH_DUE and not _host_ok(s):
        phase = Phase.WAITING_HOST
    s = replace(s, phase=phase)
    if s.phase == Phase.BIRTH_DUE and e.ready and _birth_allowed(s, e.now):
        recent = tuple(t for t in s.births if e.now - t < BIRTH_WINDOW_S)
        return replace(s, phase=Phase.BORN, seq=1, births=(*recent, e.now)), (Action.BIRTH,)
    return s, ()


def _host_ok(s: Session) -> bool:
    """A birth may go out: no primary host gates it, or it is online."""
    return not s.primary or s.host_online


def _birth_allowed(s: Session, now: float) -> bool:
    """Fewer than max_births within the last BIRTH_WINDOW_S."""
    return sum(1 for t in s.births if now - t < BIRTH_WINDOW_S) < s.max_births


def may_publish_data(s: Session) -> bool:
    """Data (NDATA/DDATA, a new device's DBIRTH) may go out now; otherwise it is held."""
    return s.phase == Phase.BORN
