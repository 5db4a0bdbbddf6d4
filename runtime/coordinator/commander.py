"""Commands out, their replies in: signing, the sleeper's held command, the replies awaited.

The coordinator hands a `Commander` the few things it needs: how to publish, how to look up a
device's view, its counters and rate-limited log, and where a reply's consequences go (the
rollouts). A command sent with `send_command` blocks its caller (an API request) until the
reply or the wait ends; one sent with `send_async` (a rollout's, a re-send) is remembered in
a bounded table until its reply or its expiry, and no thread waits for it. A reply counts as
the device's only when it carries a valid signature of the device's key
(`device_keys/<device>.pub`); one with a bad signature is refused (quarantined).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator import fleet
from runtime.coordinator.canary_clock import MAX_SLEEP_S
from runtime.coordinator.replies import Awaited, PendingReplies
from runtime.wire import commands, payloads
from runtime.wire.quarantine import RateLimitedLog

log = logging.getLogger("edgerun.coordinator")


class UnknownDevice(KeyError):
    """A command was addressed to a device the coordinator has never heard from."""


class Refused(Exception):
    """An inbound message is not admitted; the text is the quarantine reason."""


# (device, command name, its args): an accepted setting, kept as the device's desired state
OnSetting = Callable[[str, str, dict[str, Any]], None]
# (device, command name, reply): a reply to a command sent without waiting
OnReply = Callable[[str, str, dict[str, Any]], None]


def no_reply(view: fleet.DeviceView | None, name: str, wait_s: float, ttl_s: float,
             now: float) -> str:
    """What the API answers when `name` to a device got no reply within `wait_s`: what the
    coordinator knows of the device and what became of the command (it stays valid for
    `ttl_s` from its sending, and no longer: a device back later never carries it out)."""
    device = view.device if view is not None else "the device"
    head = f"no reply from {device} to {name} in {wait_s:g} s"
    expiry = f"the command expires {ttl_s:g} s after it was sent"
    if view is None or view.status == "online":
        return (f"{head}: {device} is online (busy, or its reply was lost), so it may still "
                f"carry it out until then ({expiry}): `edgerun fleet show {device}` shows "
                "its events")
    if view.status == "offline":
        seen = (time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(view.last_seen))
                if view.last_seen else "never")
        why = f", {view.reason}" if view.reason else ""
        return (f"{head}: {device} is offline (last seen {seen}{why}); {expiry} and is not "
                f"kept for its return: send it again once {device} is online")
    return (f"{head}: {device} has been silent {now - view.last_seen:.0f} s ({view.status}); "
            f"{expiry} and is not kept for later: send it again once {device} is online "
            f"(`edgerun fleet ls`)")


class Commander:
    """One coordinator's commands (see module docstring)."""

    def __init__(self, cfg: CoordinatorConfig, publish: Callable[[str, bytes], Any],
                 view_of: Callable[[str], fleet.DeviceView | None],
                 counters: collections.Counter, rlog: RateLimitedLog,
                 on_setting: OnSetting, on_reply: OnReply,
                 clock: Callable[[], float] = time.monotonic):
        """`clock`: the coordinator's monotonic clock (awaited replies' deadlines are on it,
        `expire_pending` is called with its readings)."""
        self.cfg = cfg
        self._clock = clock
        self._publish = publish
        self._view_of = view_of  # under the coordinator's views lock
        self._counters = counters
        self._rlog = rlog
        self._on_setting = on_setting
        self._on_reply_of = on_reply
        self._key = commands.load_private_key(cfg.signing_key) if cfg.signing_key else None
        self._device_keys: dict[str, tuple[float, Any]] = {}  # device -> (mtime, key or None)
        # command id -> (answered, the reply, the device it was sent to)
        self._waiters: dict[str, tuple[threading.Event, list, str]] = {}
        # Bounded work per message: a command sent without waiting is remembered until its
        # reply or its expiry (no thread waits for it)
        self.pending = PendingReplies(cfg.max_pending_replies)

    def on_reply(self, device: str, reply: dict) -> None:
        """Hand a command reply to its waiter when it is proven to come from `device`."""
        waiter = self._waiters.get(reply["id"] or "")
        pending = self.pending.get(reply["id"] or "")
        if waiter is None and pending is None and self.cfg.share_group:
            return  # every coordinator of the group sees every reply: not our command
        if waiter is not None and waiter[2] != device:
            # its signature proves only who sent it: device b signing a reply to a's
            # command (its id seen on an open broker) answered a's waiter, verified
            raise Refused(f"cmd/reply for command {str(reply['id'])[:64]}: the command was "
                          f"sent to {waiter[2]}, not to {device}")
        key = self.device_key(device)
        verified = (key is not None and reply.get("device") == device
                    and commands.reply_signed_by(reply, key))
        if key is not None and not verified:
            raise Refused(f"cmd/reply for command {str(reply['id'])[:64]}: not signed by "
                          f"{device}'s key (forged or from another device)")
        if pending is not None and pending.device == device:
            self.pending.pop(reply["id"])
            self._on_async_reply(pending, reply, verified)
            return
        if waiter is None or waiter[0].is_set():
            return  # a late, repeated or unrequested reply
        if not verified:
            # No key on file for this device: nothing can be proven, so never report success.
            reply = {**reply, "ok": False, "status": "unverified", "device_status":
                     reply["status"], "reason": f"reply not verified: no {device}.pub in "
                     f"coordinator.device_keys; the device said: {reply['status']}: "
                     f"{reply.get('reason', '')}"}
        waiter[1].append({**reply, "verified": verified})
        waiter[0].set()

    def device_key(self, device: str) -> Any:
        """The device's reply-signing public key from `device_keys/<device>.pub` (re-read when
        the file changes, so enrolling needs no restart), or None."""
        if not self.cfg.device_keys:
            return None
        path = Path(self.cfg.device_keys).expanduser() / f"{device}.pub"
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            return None
        cached = self._device_keys.get(device)
        if cached and cached[0] == mtime:
            return cached[1]
        try:
            key = commands.load_public_key(path)
        except ValueError as e:
            # not cached: a file being copied in reads short once and whole a moment later,
            # possibly with the same mtime (the clock's granularity)
            self._rlog.log(f"key-{device}", "device key %s unusable: %s; replies from %s stay "
                           "unverified until it is", path, e, device, level=logging.ERROR)
            return None
        self._device_keys[device] = (mtime, key)
        return key

    def send_async(self, device: str, name: str, args: dict[str, Any],
                   ttl_s: float = 60.0, wait_s: float = 30.0) -> None:
        """Send a command for a rollout or a returning device without blocking the caller
        (the ingest thread) and without a thread: its reply, when it comes within `wait_s`,
        goes to the rollouts from the ingest thread (on_reply, then _on_async_reply). At most
        max_pending_replies are awaited; past that the oldest is forgotten (counted)."""
        args = commands.check_args(name, args or {})  # CommandRefused: never sent
        if self._view_of(device) is None:
            raise UnknownDevice(device)
        env = self._publish_command(device, name, args, ttl_s)
        if env is None:
            return  # held by the broker for a sleeper: its events give the verdict
        self._counters["commands_sent_async"] += 1
        # a monotonic deadline: a wall clock stepped forward forgot every awaited reply at
        # once, one stepped back kept them for as long as the step
        self.pending.add(env["id"], Awaited(device, name, args, self._clock() + wait_s))

    def expire_pending(self, now: float) -> None:
        """Forget the awaited replies whose wait is over (a device that never answers);
        `now` is the monotonic clock."""
        self.pending.expire(now)

    def _on_async_reply(self, pending: Awaited, reply: dict, verified: bool) -> None:
        """A reply to a command sent by send_async: to the rollouts, and a verified
        accepted setting kept as desired (as send_command does)."""
        device, name, args = pending.device, pending.name, pending.args
        if not verified:
            reply = {**reply, "ok": False, "status": "unverified",
                     "device_status": reply["status"]}
        reply = {**reply, "verified": verified}
        if reply.get("ok") and verified:
            self._on_setting(device, name, args or {})
        try:
            self._on_reply_of(device, name, reply)
        except Exception:
            log.exception("rollout bookkeeping for the %s reply of %s failed", name, device)

    def _publish_command(self, device: str, name: str, args: dict[str, Any] | None,
                         ttl_s: float) -> dict[str, Any] | None:
        """Sign and publish a command to an awake device and return its envelope; None when
        the device is asleep (the command, made to outlive the sleep, is then held by the
        broker in the device's session and delivered at its next wake)."""
        view = self._commandable(device)
        if view.asleep and view.status == "asleep":
            self._publish_for_sleeper(view, name, args, ttl_s)
            return None
        env = commands.sign(self._key, device, name, args, ttl_s)
        self._publish(payloads.topic(self.cfg.fleet, device, "cmd"),
                           payloads.encode("cmd", env))
        return env

    def _commandable(self, device: str) -> fleet.DeviceView:
        """The view of a device this coordinator may command: PermissionError without a
        signing key, UnknownDevice for a device it has never heard from."""
        if self._key is None:
            raise PermissionError("no signing_key configured: this coordinator cannot command")
        view = self._view_of(device)
        if view is None:
            raise UnknownDevice(device)
        return view

    def _publish_for_sleeper(self, view: fleet.DeviceView, name: str,
                             args: dict[str, Any] | None, ttl_s: float) -> dict[str, Any]:
        """Publish a command for a device asleep on purpose; returns the `queued` reply."""
        # The broker holds the command in the device's persistent session and delivers it at
        # the next wake. It must outlive the sleep. (a wake believed a week ahead at most:
        # canary_clock.MAX_SLEEP_S; a `wake_at` in 2286 made a command valid, and remembered
        # by the device, for centuries)
        now, device = time.time(), view.device
        wake = min(view.wake_at, now + MAX_SLEEP_S)
        ttl = max(ttl_s, wake - now + self.cfg.wake_margin_s + ttl_s)
        env = commands.sign(self._key, device, name, args, ttl)
        self._publish(payloads.topic(self.cfg.fleet, device, "cmd"),
                           payloads.encode("cmd", env))
        return {"v": payloads.VERSION, "id": env["id"], "ok": True, "status": "queued",
                "deliver_at": view.wake_at, "expires_at": env["expires_at"],
                "reason": f"{device} is asleep until {fleet.clock(view.wake_at)}: the "
                          "broker holds the command and delivers it at its next wake "
                          f"(it expires at {fleet.clock(env['expires_at'])})",
                "t": now, "verified": False}

    def send_command(self, device: str, name: str, args: dict[str, Any] | None = None,
                     ttl_s: float = 60.0, wait_s: float = 10.0) -> dict[str, Any] | None:
        """Sign and publish a command; returns the device's reply, or None on timeout.

        The reply has `verified: True` when it carries a valid signature of the device's key
        (`device_keys/<device>.pub`); replies with a bad signature are quarantined and never
        returned. Without a key on file the first reply comes back with `verified: False`,
        `ok: False` and `status: "unverified"` (the device's own status in `device_status`).
        Arguments every device would refuse raise CommandRefused (commands.check_args, the
        devices' own gate) before anything is signed or sent."""
        commands.check_args(name, args or {})
        view = self._commandable(device)
        if view.asleep and view.status == "asleep":
            return self._publish_for_sleeper(view, name, args, ttl_s)
        env = commands.sign(self._key, device, name, args, ttl_s)
        event, box = threading.Event(), []
        self._waiters[env["id"]] = (event, box, device)
        try:
            self._publish(payloads.topic(self.cfg.fleet, device, "cmd"),
                               payloads.encode("cmd", env))
            event.wait(wait_s)
        finally:
            self._waiters.pop(env["id"], None)
        reply = box[0] if box else None
        if reply and reply.get("ok") and reply.get("verified"):
            self._on_setting(device, name, args or {})  # desired state
        return reply
