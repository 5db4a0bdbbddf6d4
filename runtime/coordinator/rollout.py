"""Staged model rollouts and each device's desired state, held durably by the coordinator.

`edgerun fleet deploy BUNDLE --to GROUP|all --canary N%`:

1. The group's devices (sorted, so the choice repeats) are split: the first ceil(N% of them)
   are the canary (at least one when N > 0), the rest wait.
2. Each canary device's desired state becomes the bundle's version and it is sent a signed
   `deploy`; its events drive the rollout: `model_probation_passed` (passed),
   `model_rolled_back` / `model_deploy_failed` or a `rejected` reply (failed).
3. Any canary failing halts the rollout for the group (the rest are never sent it; the
   canary's desired state goes back to what it was). All canary passing sends it to the rest.

Desired state (model version and operator settings) is kept per device in the store; a device
that comes back online (its birth) reporting another model version is sent `deploy` again, and
its operator settings are re-sent. The decisions (`split`, `advance`) are pure functions.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runtime.coordinator.canary_clock import believed_wake, note_sleep, overdue
from runtime.wire.events import MODEL_EVENTS, EventType

if TYPE_CHECKING:
    from runtime.coordinator.store import Store

log = logging.getLogger("edgerun.rollout")

# device states within a rollout
WAITING, SENT, SWAPPED, PASSED, FAILED = "waiting", "sent", "swapped", "passed", "failed"
SETTINGS = {"set_latency_target": "ms", "set_accuracy_floor": "value", "set_rate": "fps"}


class _Conflict(Exception):
    """Another coordinator sharing the store changed the rollout since it was read."""


def split(devices: list[str], canary_pct: float) -> tuple[list[str], list[str]]:
    """(canary, rest): the first ceil(pct% of the sorted devices), at least one when pct > 0;
    pct 0 or 100 makes every device canary (no second stage)."""
    ordered = sorted(set(devices))
    if canary_pct <= 0 or canary_pct >= 100:
        return ordered, []
    n = max(1, math.ceil(len(ordered) * canary_pct / 100))
    return ordered[:n], ordered[n:]


@dataclass(frozen=True)
class Step:
    """What `advance` decided: the rollout's new state and the devices to send it to now."""

    state: str  # canary | rolling | done | halted
    send: tuple[str, ...] = ()
    reason: str = ""


def advance(r: dict[str, Any]) -> Step:
    """The next step of rollout `r` from its devices' states (pure)."""
    st = r["devices"]
    if r["state"] in ("done", "halted"):
        return Step(r["state"])
    canary = r["canary"]
    if r["state"] == "canary":
        bad = [d for d in canary if st[d]["state"] == FAILED]
        if bad:
            why = "; ".join(f"{d}: {st[d].get('reason', '')}" for d in bad)
            return Step("halted", (), f"canary failed: {why}"[:2000])
        if all(st[d]["state"] == PASSED for d in canary):
            if not r["rest"]:
                return Step("done")
            return Step("rolling", tuple(r["rest"]))
        return Step("canary")
    if all(st[d]["state"] in (PASSED, FAILED) for d in r["rest"]):
        failed = [d for d in r["rest"] if st[d]["state"] == FAILED]
        return Step("done", (), f"{len(failed)} of {len(r['rest'])} failed after the canary "
                    f"passed: {', '.join(failed)}" if failed else "")
    return Step("rolling")


class Rollouts:
    """Groups, desired state and rollouts in the coordinator's store (its tables
    device_groups, desired, rollouts: on SQLite or PostgreSQL, so coordinators sharing a store
    share them). `send(device, cmd, args)` publishes a signed command without waiting."""

    def __init__(self, store: Store, send: Callable[[str, str, dict], Any],
                 deploy_args: Callable[[str], dict], known: Callable[[], list[str]],
                 timeout_s: float = 3600.0,
                 sleeping: Callable[[str], tuple[float, float] | None] = lambda d: None,
                 wake_margin_s: float = 300.0, settle: Callable[[str], Any] | None = None):
        # waits for a delete of a bundle under way (bundles.held_now), so that reading it
        # again says whether it is still held
        self._settle = settle
        self.timeout_s = timeout_s  # a device sent a model without a verdict this long: failed
        # (since, wake_at) of a device the fleet view says sleeps now, else None: its sleep
        # does not count against timeout_s (canary_clock.py)
        self._sleeping, self.wake_margin_s = sleeping, wake_margin_s
        self._store = store
        self._lock = threading.RLock()
        self._send, self._deploy_args, self._known = send, deploy_args, known
        # rollout id -> its body as last read or written here: a write replaces only that
        # body (compare and swap), so coordinators sharing the store never undo each other
        self._bodies: dict[str, str] = {}
        self._finished: set[str] = set()  # rollouts done or halted (never active again)

    # -- groups and desired state -----------------------------------------------------------

    def set_group(self, group: str, devices: list[str]) -> None:
        """Put `devices` in `group` (a device is in one group)."""
        with self._lock:
            self._store.write("INSERT INTO device_groups VALUES (?, ?) ON CONFLICT(device) "
                              "DO UPDATE SET grp = excluded.grp", [(d, group) for d in devices])

    def groups(self) -> dict[str, list[str]]:
        """Group -> devices."""
        out: dict[str, list[str]] = {}
        with self._lock:
            for d, g in self._store.read("SELECT device, grp FROM device_groups ORDER BY 1"):
                out.setdefault(g, []).append(d)
        return out

    def members(self, group: str) -> list[str]:
        """The devices of `group`; `all`: every device the coordinator knows."""
        if group == "all":
            return sorted(self._known())
        return self.groups().get(group, [])

    def desired(self, device: str) -> dict[str, Any]:
        """The device's desired state: {"model": {...deploy args...}, "settings": {...}}."""
        with self._lock:
            rows = self._store.read("SELECT body FROM desired WHERE device=?", (device,))
        return json.loads(rows[0][0]) if rows else {}

    def _set_desired(self, device: str, doc: dict[str, Any]) -> None:
        with self._lock:
            self._store.write("INSERT INTO desired VALUES (?, ?) ON CONFLICT(device) DO UPDATE "
                              "SET body = excluded.body", [(device, json.dumps(doc))])

    def record_setting(self, device: str, cmd: str, args: dict[str, Any]) -> None:
        """An operator setting the device accepted: kept as desired, re-sent on return."""
        if cmd in SETTINGS:
            doc = self.desired(device)
            doc.setdefault("settings", {})[cmd] = args
            self._set_desired(device, doc)

    # -- rollouts -----------------------------------------------------------------------------

    def start(self, bundle_id: str, group: str, canary_pct: float) -> dict[str, Any]:
        """Begin a rollout (ValueError for an empty group or unknown bundle)."""
        args = self._deploy_args(bundle_id)  # ValueError when the bundle is not held
        devices = self.members(group)
        if not devices:
            raise ValueError(f"group {group!r} has no devices (`edgerun fleet group`)")
        canary, rest = split(devices, canary_pct)
        before = self._desired_of(devices)
        r = {"id": uuid.uuid4().hex[:12], "bundle": bundle_id, "group": group,
             "canary_pct": canary_pct, "canary": canary, "rest": rest, "state": "canary",
             "reason": "", "created": time.time(), "version": f"{args['name']}@"
             f"{args['version']}", "args": args,
             "devices": {d: {"state": WAITING, "before": before.get(d, {}).get("model")}
                         for d in devices}}
        with self._lock:
            self._save(r)
            # the bundle was read before the rollout was visible: a `Shelf.delete` (here or on
            # another coordinator) may have removed it in between, having seen no rollout.
            # Now that the rollout is stored, any later delete sees it and is refused; so one
            # read (after a delete under way has ended) says whether the bundle is still there.
            if self._settle is not None:
                self._settle(bundle_id)
            try:
                self._deploy_args(bundle_id)
            except ValueError:
                r["state"], r["reason"] = "halted", "the bundle was deleted as it started"
                self._save(r)
                raise ValueError(f"bundle {bundle_id!r} was deleted while the rollout was "
                                 f"being created (rollout {r['id']} halted, nothing sent)"
                                 ) from None
            self._deploy(r, canary)
            self._save(r)
            self._send_all(canary, args)
        log.info("rollout %s of %s to %s: canary %s, then %d more", r["id"], bundle_id, group,
                 ", ".join(canary), len(rest))
        return r

    def _save(self, r: dict[str, Any]) -> None:
        """Write `r`; _Conflict when another coordinator changed it since this one read it."""
        body, old = json.dumps(r), self._bodies.get(r["id"])
        if old is None:  # a new rollout
            self._store.write("INSERT INTO rollouts VALUES (?, ?, ?) ON CONFLICT(id) DO "
                              "UPDATE SET body = excluded.body", [(r["id"], r["created"], body)])
        elif not self._store.update("UPDATE rollouts SET body = ? WHERE id = ? AND body = ?",
                                    (body, r["id"], old)):
            self._bodies.pop(r["id"], None)
            raise _Conflict(r["id"])
        self._bodies[r["id"]] = body
        if r["state"] in ("done", "halted"):
            self._finished.add(r["id"])

    def _retrying(self, what: Callable[[], None]) -> None:
        """Run a read-modify-write of rollouts again (from a fresh read) when another
        coordinator wrote one of them in between."""
        for _ in range(10):
            try:
                return what()
            except _Conflict:
                continue
        log.error("rollouts: gave up after 10 conflicting writes by other coordinators")

    def get(self, rollout_id: str) -> dict[str, Any] | None:
        """One rollout."""
        with self._lock:
            rows = self._store.read("SELECT body FROM rollouts WHERE id=?", (rollout_id,))
            if rows:
                self._bodies[rollout_id] = rows[0][0]
        return json.loads(rows[0][0]) if rows else None

    def list(self) -> list[dict[str, Any]]:
        """Every rollout, newest first."""
        with self._lock:
            rows = self._store.read("SELECT body FROM rollouts ORDER BY created DESC")
            out = [json.loads(b) for (b,) in rows]
            self._bodies.update((r["id"], b) for r, (b,) in zip(out, rows, strict=True))
            return out

    def _active(self) -> list[dict[str, Any]]:
        """The rollouts in progress, newest first (as `list`). Called every second (tick)
        and at every event: a finished rollout (done, halted: never active again) is
        remembered and not read again — reading and decoding every rollout ever made took
        240-350 ms a tick with 50 finished rollouts of 5000 devices, on the ingest thread."""
        with self._lock:
            ids = [i for (i,) in self._store.read("SELECT id FROM rollouts ORDER BY created DESC")
                   if i not in self._finished]
            out = []
            for k in range(0, len(ids), 500):
                part = ids[k:k + 500]
                rows = self._store.read(
                    f"SELECT id, body FROM rollouts WHERE id IN ({','.join('?' * len(part))}) "
                    "ORDER BY created DESC", part)
                for rid, body in rows:
                    r = json.loads(body)
                    if r["state"] in ("canary", "rolling"):
                        self._bodies[rid] = body
                        out.append(r)
                    else:
                        self._finished.add(rid)
                        self._bodies.pop(rid, None)
            return out

    def _deploy(self, r: dict[str, Any], devices: list[str] | tuple[str, ...]
                ) -> dict[str, Any]:
        """Mark `devices` sent (desired state, rollout) and return the deploy arguments; the
        caller sends them once the rollout is saved (a conflicting save sends nothing)."""
        args = self._fresh_args(r["bundle"], r.get("args"))
        docs = self._desired_of(devices)
        rows = []
        for d in devices:
            doc = docs.get(d, {})
            doc["model"] = args
            rows.append((d, json.dumps(doc)))
            r["devices"][d]["state"] = SENT
            r["devices"][d]["sent"] = time.time()
        # one transaction for all (the rest of a group is sent from the ingest thread when
        # its canary passes: two statements a device held it for seconds on a big group)
        with self._lock:
            self._store.write("INSERT INTO desired VALUES (?, ?) ON CONFLICT(device) DO "
                              "UPDATE SET body = excluded.body", rows)
        return args

    def _desired_of(self, devices: list[str] | tuple[str, ...]) -> dict[str, dict[str, Any]]:
        """The desired state of each of `devices` that has one (a few queries in all)."""
        out: dict[str, dict[str, Any]] = {}
        devices = list(devices)
        with self._lock:
            for k in range(0, len(devices), 500):
                part = devices[k:k + 500]
                for d, body in self._store.read(
                        f"SELECT device, body FROM desired WHERE device IN "
                        f"({','.join('?' * len(part))})", part):
                    out[d] = json.loads(body)
        return out

    def _fresh_args(self, bundle_id: str, stored: dict[str, Any] | None) -> dict[str, Any]:
        """The deploy arguments with this coordinator's download URL (the shelf is in the
        store, so every coordinator on it serves the bundle; a device is sent the address of
        the coordinator that is up now). The stored ones when this coordinator cannot make
        them (no public URL, or a bundle from before the shared shelf)."""
        try:
            return self._deploy_args(bundle_id)
        except ValueError:
            if stored is None:
                raise
            return stored

    def _send_all(self, devices: list[str] | tuple[str, ...], args: dict[str, Any]) -> None:
        for d in devices:
            self._try_send(d, "deploy", args)

    def _try_send(self, device: str, cmd: str, args: dict) -> None:
        try:
            self._send(device, cmd, args)
        except Exception as e:  # unknown (never seen) or offline: re-sent when it returns
            log.info("%s to %s not sent now (%s); it is sent when the device comes back",
                     cmd, device, e)

    # -- what devices report --------------------------------------------------------------------

    def on_event(self, device: str, ev: dict[str, Any]) -> None:
        """Advance rollouts from a device's model events."""
        kind = ev.get("type")
        if kind not in MODEL_EVENTS:
            return
        self._retrying(lambda: self._on_event(device, EventType(kind), ev))

    def _on_event(self, device: str, kind: EventType, ev: dict[str, Any]) -> None:
        with self._lock:
            for r in self._active():
                st = r["devices"].get(device)
                if st is None or st["state"] not in (SENT, SWAPPED):
                    continue
                version = r["version"]
                if kind == EventType.MODEL_SWAPPED and ev.get("to") == version:
                    st["state"] = SWAPPED
                elif kind in (EventType.MODEL_PROBATION_PASSED, EventType.MODEL_DEPLOYED) and \
                        ev.get("version") == version:
                    st["state"] = PASSED
                elif kind == EventType.MODEL_ROLLED_BACK and ev.get("version") == version:
                    st.update(state=FAILED, reason=f"rolled back: {ev.get('reason', '')}")
                elif kind == EventType.MODEL_DEPLOY_FAILED and _failed_deploy_of(ev, version):
                    st.update(state=FAILED, reason=f"deploy failed at "
                              f"{ev.get('step', '?')}: {ev.get('error', '')}")
                else:
                    continue
                self._step(r)

    def on_reply(self, device: str, cmd: str, reply: dict[str, Any] | None) -> None:
        """A `deploy` answered `rejected` fails that device's part of active rollouts."""
        if cmd != "deploy" or not reply or reply.get("status") != "rejected":
            return
        if str(reply.get("reason", "")).startswith("busy:"):
            # installing already: the broker-held deploy of a device back from sleep or
            # offline, then our re-send at its birth; its events give the verdict
            log.info("deploy to %s: %s (its events decide)", device, reply.get("reason"))
            return
        self._retrying(lambda: self._on_reply(device, reply))

    def _on_reply(self, device: str, reply: dict[str, Any]) -> None:
        with self._lock:
            if "rolled back on this device" in str(reply.get("reason", "")):
                # the device will never take it: stop re-sending it on each return
                doc = self.desired(device)
                if doc.pop("model", None) is not None:
                    doc["model_rejected"] = str(reply.get("reason", ""))[:500]
                    self._set_desired(device, doc)
            for r in self._active():
                st = r["devices"].get(device)
                if st is not None and st["state"] == SENT:
                    st.update(state=FAILED, reason=f"rejected: {reply.get('reason', '')}")
                    self._step(r)

    def _step(self, r: dict[str, Any]) -> None:
        s = advance(r)
        if s.state != r["state"]:
            (log.warning if s.state == "halted" else log.info)(
                "rollout %s of %s to %s: %s -> %s%s", r["id"], r["bundle"], r["group"],
                r["state"], s.state, f" ({s.reason})" if s.reason else "")
        r["state"], r["reason"] = s.state, s.reason or r["reason"]
        if s.state == "halted":
            for d in r["canary"]:  # back to what they had: never re-send a failed version
                doc = self.desired(d)
                before = r["devices"][d].get("before")
                if before:
                    doc["model"] = before
                else:
                    doc.pop("model", None)
                self._set_desired(d, doc)
        args = self._deploy(r, s.send) if s.send else None
        self._save(r)
        if args is not None:
            self._send_all(s.send, args)

    def tick(self, now: float | None = None) -> None:
        """A device that was sent the model `timeout_s` ago and has not reported a verdict
        counts as failed (offline, stuck): a canary that never answers halts the rollout
        instead of holding it for ever. Time a device spent in an announced sleep is not
        counted; a sleeper that missed its wake fails (canary_clock.py)."""
        now = time.time() if now is None else now
        self._retrying(lambda: self._tick(now))

    def _tick(self, now: float) -> None:
        with self._lock:
            for r in self._active():
                noted, late = False, []
                for d, st in r["devices"].items():
                    if st["state"] not in (SENT, SWAPPED):
                        continue
                    sleep = self._sleeping(d)
                    if sleep is not None:
                        # a wake announced days ahead is credited a day (canary_clock.py),
                        # from the sleep's own start (constant while it sleeps: noted once)
                        noted |= note_sleep(st.setdefault("sleeps", []), sleep[0],
                                            believed_wake(sleep[0], sleep[1]), now)
                    why = overdue(st.get("sent", now), now, self.timeout_s,
                                  st.get("sleeps", []), None if sleep is None else sleep[1],
                                  self.wake_margin_s, None if sleep is None else sleep[0])
                    if why is not None:
                        late.append((d, why))
                for d, why in late:
                    r["devices"][d].update(state=FAILED, reason=why)
                if late:
                    self._step(r)
                elif noted:
                    self._save(r)

    def on_online(self, device: str, model_version: str | None) -> None:
        """A device came back (birth): re-send its desired model when it reports another
        version, and its operator settings (`on_online_many` of one)."""
        self.on_online_many([(device, model_version)])

    def on_online_many(self, births: list[tuple[str, str | None]]) -> None:
        """`on_online` for (device, model_version) births in order, with the desired state
        of all of them read in one query per 500 devices: a fleet's start brings every
        device's retained birth at once, and a query per birth was half their cost. A
        device whose bookkeeping fails is logged and costs only its own re-send."""
        if not births:
            return
        docs = self._desired_bodies(sorted({d for d, _ in births}))
        fresh: dict[str, dict[str, Any] | None] = {}  # bundle -> deploy arguments
        for device, model_version in births:
            try:
                self._resend(device, model_version, docs.get(device), fresh)
            except Exception:
                log.exception("re-sending %s its desired model and settings failed", device)

    def _desired_bodies(self, devices: list[str], chunk: int = 500) -> dict[str, str]:
        """device -> its stored desired body (JSON text), for those of `devices` with one."""
        out: dict[str, str] = {}
        with self._lock:
            for i in range(0, len(devices), chunk):
                part = devices[i:i + chunk]
                out.update(self._store.read_in("SELECT device, body FROM desired WHERE device",
                                               part))
        return out

    def _resend(self, device: str, model_version: str | None, body: str | None,
                fresh: dict[str, dict[str, Any] | None]) -> None:
        """One birth's decision from its desired body (`desired` read it the same way)."""
        doc = json.loads(body) if body is not None else {}
        want = doc.get("model")
        if want and model_version is not None \
                and model_version != f"{want['name']}@{want['version']}":
            log.info("device %s is back with model %s, desired %s@%s: deploying again",
                     device, model_version or "configured", want["name"], want["version"])
            bundle = f"{want['name']}@{want['version']}"
            if bundle not in fresh:  # the shelf is read once per bundle a batch
                try:
                    fresh[bundle] = self._deploy_args(bundle)
                except ValueError:  # not made here (_fresh_args): this device's stored ones
                    fresh[bundle] = None
            got = fresh[bundle] or want
            # the same bundle (size, sha256, token) only: never another file under its name
            if all(got.get(k) == want.get(k) for k in ("size", "sha256", "token")):
                want = got
            self._try_send(device, "deploy", want)
        for cmd, args in (doc.get("settings") or {}).items():
            self._try_send(device, cmd, args)


def _failed_deploy_of(ev: dict[str, Any], version: str) -> bool:
    """Whether a `model_deploy_failed` event ends `version`'s deploy on its device: the
    event's own `version` field; a device of an older release names it only inside its
    `reason` text, and says "busy" (another install running, this one not started, it is
    asked again) only by the error's wording."""
    if "version" in ev:
        return ev["version"] == version and ev.get("busy") is not True
    return (version in str(ev.get("reason", ""))
            and ev.get("error") != "another model install is running")
