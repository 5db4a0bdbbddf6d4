"""Command replies at the coordinator (runtime/coordinator/commander.py): a reply counts only
for the command it answers and the device that command went to."""

from __future__ import annotations

import collections
import json
import logging
import threading
import time

import pytest

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator import fleet
from runtime.coordinator.commander import Commander, Refused
from runtime.wire import commands
from runtime.wire.quarantine import RateLimitedLog


def test_a_reply_from_another_device_does_not_answer_a_waiting_command(tmp_path):
    """A waiting command (`fleet send`, POST .../commands) took the first verified reply
    carrying its id, from whichever device's reply topic it came: device b, its own key on
    file, signed {id: <a's command id>, device: "b"} with that key and its reply counted as
    a's, `verified: true` (the reply's `device` was checked against the topic, not against
    the device the command went to). An id is a uuid4 only the broker's ACL keeps from b;
    an awaited rollout command already checked the device. Now the waiting one does too:
    b's reply is refused (quarantined), a's own still answers."""
    keys = tmp_path / "keys"
    keys.mkdir()
    commands.generate_keypair(tmp_path / "coord.key", tmp_path / "coord.pub")
    for d in ("a", "b"):
        commands.generate_keypair(tmp_path / f"{d}.key", keys / f"{d}.pub")
    cfg = CoordinatorConfig(fleet="f", store=str(tmp_path / "c.db"),
                            signing_key=str(tmp_path / "coord.key"), device_keys=str(keys))
    sent: list[dict] = []
    views = {d: fleet.DeviceView(d, status="online", online=True) for d in ("a", "b")}
    commander = Commander(cfg, lambda topic, body: sent.append(json.loads(body)), views.get,
                          collections.Counter(), RateLimitedLog(logging.getLogger("t")),
                          lambda *a: None, lambda *a: None)
    answer: list = []
    waiting = threading.Thread(target=lambda: answer.append(
        commander.send_command("a", "ping", wait_s=10)))
    waiting.start()
    deadline = time.monotonic() + 10
    while not sent and time.monotonic() < deadline:
        time.sleep(0.01)
    (cmd,) = sent

    def reply(device: str) -> dict:
        return commands.sign_reply(commands.load_private_key(tmp_path / f"{device}.key"), {
            "v": 1, "id": cmd["id"], "ok": True, "status": "done", "t": time.time(),
            "device": device})

    try:
        with pytest.raises(Refused, match="sent to a"):
            commander.on_reply("b", reply("b"))
        commander.on_reply("a", reply("a"))
    finally:
        waiting.join(15)
    assert answer and answer[0]["device"] == "a" and answer[0]["verified"] is True


def test_an_awaited_replys_deadline_is_on_the_commanders_clock(tmp_path):
    """Awaited replies expire on the clock the commander is given (the coordinator's
    `mono`, stepped in tests), the clock `expire_pending` is called with: a deadline taken
    from another clock expired at once or never, whichever way the two differ. The clock
    here reads far from time.monotonic(), so a deadline taken from it is caught."""
    commands.generate_keypair(tmp_path / "coord.key", tmp_path / "coord.pub")
    cfg = CoordinatorConfig(fleet="f", store=str(tmp_path / "c.db"),
                            signing_key=str(tmp_path / "coord.key"))
    views = {"a": fleet.DeviceView("a", status="online", online=True)}
    mono = [1e9]
    commander = Commander(cfg, lambda topic, body: None, views.get, collections.Counter(),
                          RateLimitedLog(logging.getLogger("t")), lambda *a: None,
                          lambda *a: None, clock=lambda: mono[0])
    commander.send_async("a", "ping", {}, wait_s=30.0)
    assert len(commander.pending) == 1
    commander.expire_pending(mono[0] + 29.0)
    assert len(commander.pending) == 1  # its wait is not over
    commander.expire_pending(mono[0] + 31.0)
    assert len(commander.pending) == 0 and commander.pending.expired == 1


@pytest.mark.parametrize("status, online, says", [
    ("offline", False, ["line1 is offline (last seen", "connection lost",
                        "send it again once line1 is online"]),
    ("stale", True, ["line1 has been silent 45 s", "send it again once line1 is online"]),
    ("online", True, ["line1 is online", "fleet show line1"]),
])
def test_no_reply_says_what_became_of_the_command(status, online, says):
    """Outside run 2026-12-07: `fleet send line1 set_rate fps=5` to a stopped device answered
    `no reply from the device in time (HTTP 504)` after 10 s, not that the device was offline,
    nor that the command would never be carried out (the device came back with a new session
    and never saw it). The answer now says which, and what to do."""
    from runtime.coordinator.commander import no_reply

    now = 1_796_677_000.0
    view = fleet.DeviceView("line1", online=online, status=status, last_seen=now - 45.0,
                            reason="connection lost" if not online else "")
    text = no_reply(view, "set_rate", wait_s=10.0, ttl_s=60.0, now=now)
    assert text.startswith("no reply from line1 to set_rate in 10 s"), text
    for s in says:
        assert s in text, text
    assert "expires 60 s after it was sent" in text
