"""Bounded command lifetime: a signed command living longer than the device's cap is refused
(runtime/wire/commands.py), and the replay record keeps no id past that bound
(runtime/telemetry/sidecar.py). Tables over the pure functions, then the real sidecar file."""

from __future__ import annotations

import json
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from runtime.config.telemetry import TelemetryConfig
from runtime.telemetry.sidecar import Sidecar, prune
from runtime.wire import commands, payloads

NOW = 1_800_000_000.0
KEY = Ed25519PrivateKey.generate()
TRUSTED = {commands.key_id(KEY.public_key()): KEY.public_key()}
DAY = 86400.0
CENTURY = 3.15e9  # the lifetime of issue 25's command


def _verify(ttl_s: float, max_ttl_s: float | None = None, issued: float = NOW):
    env = commands.sign(KEY, "dev1", "ping", {}, ttl_s=ttl_s, now=issued)
    payloads.check("cmd", env)
    kw = {} if max_ttl_s is None else {"max_ttl_s": max_ttl_s}
    return commands.verify(env, "dev1", TRUSTED, NOW, 300, lambda cid, exp: True, **kw)


@pytest.mark.parametrize("ttl_s, max_ttl_s, accepted", [
    (60, None, True),  # the coordinator's usual command
    (DAY, None, True),  # exactly the default cap
    (DAY + 1, None, False),
    (CENTURY, None, False),
    (3600, 600, False),  # a device configured tighter
    (600, 600, True),
    (7 * DAY, commands.lifetime_cap(DAY, 7 * DAY), True),  # a sleeper's queued command
    (7 * DAY + 3601, commands.lifetime_cap(DAY, 7 * DAY), False),
])
def test_lifetime_cap_table(ttl_s, max_ttl_s, accepted):
    if accepted:
        assert _verify(ttl_s, max_ttl_s).name == "ping"
    else:
        with pytest.raises(commands.CommandRefused, match="lifetime .* over this device's cap"):
            _verify(ttl_s, max_ttl_s)


def test_lifetime_is_judged_before_the_id_is_remembered():
    """A refused long-lived command does not cost a slot in the replay record."""
    asked = []
    env = commands.sign(KEY, "dev1", "ping", {}, ttl_s=CENTURY, now=NOW)
    with pytest.raises(commands.CommandRefused):
        commands.verify(env, "dev1", TRUSTED, NOW, 300, lambda c, e: asked.append(c) or True)
    assert asked == []


@pytest.mark.parametrize("configured, session, cap", [
    (DAY, 0, DAY),  # no sleep: the configured cap
    (600, 0, 600),
    (DAY, 3600, DAY),  # a short session: the configured cap still rules
    (DAY, 7 * DAY, 7 * DAY + commands.SLEEP_MARGIN_S),  # a week's sleep: the session wins
])
def test_lifetime_cap_of_a_sleeper(configured, session, cap):
    assert commands.lifetime_cap(configured, session) == cap


@pytest.mark.parametrize("seen, now, keep, kept", [
    ({"a": 10.0, "b": 20.0}, 15.0, 100.0, {"b"}),  # expired ids go
    ({"a": 50.0, "b": 200.0}, 15.0, 100.0, {"a"}),  # past the bound: go
    ({"a": 115.0}, 15.0, 100.0, {"a"}),  # exactly at the bound: kept
    ({"a": CENTURY + NOW}, NOW, DAY + 300, set()),  # the century command's id
    ({"a": float("nan")}, 15.0, 100.0, set()),
])
def test_prune_table(seen, now, keep, kept):
    assert set(prune(seen, now, keep)) == kept


def test_memory_bound_covers_every_command_verify_accepts():
    """The bound is sound: the latest-expiring command verify accepts (issued at the edge of
    the allowed skew, living the whole cap) expires exactly at now + memory_bound."""
    cap, skew = DAY, 300.0
    env = commands.sign(KEY, "dev1", "ping", {}, ttl_s=cap, now=NOW + skew)
    commands.verify(env, "dev1", TRUSTED, NOW, skew, lambda c, e: True, max_ttl_s=cap)
    assert env["expires_at"] == NOW + commands.memory_bound(cap, skew)


def test_sidecar_drops_ids_past_the_bound_and_refuses_new_ones(tmp_path):
    """An older version remembered a century; once bounded, the file holds only ids that can
    still matter (pruned by the first id remembered against a synced clock: at start the
    clock may read 1970), and an id claiming to expire later is not written."""
    path = tmp_path / "outbox.db.keep.json"
    now = time.time()
    path.write_text(json.dumps({"evicted_total": 3, "not_before": 0.0, "seen_commands": {
        "old-century": now + CENTURY, "live": now + 60, "expired": now - 1}}))
    side = Sidecar(path, lost_history=False)
    # nothing guessed before the bound, nothing dropped by a clock not yet known good
    assert set(side.seen) == {"old-century", "live", "expired"}
    side.bound(commands.memory_bound(DAY, 300))
    assert side.remember("new", now + 3600) and not side.remember("new", now + 3600)
    assert set(side.seen) == {"live", "new"}
    assert set(json.loads(path.read_text())["seen_commands"]) == {"live", "new"}
    with pytest.raises(commands.CommandRefused, match="remembers ids for"):
        side.remember("too-far", now + 2 * DAY)
    assert "too-far" not in json.loads(path.read_text())["seen_commands"]
    again = Sidecar(path, lost_history=False)  # what was bounded stays bounded after a restart
    assert set(again.seen) == {"live", "new"}


@pytest.mark.parametrize("value, ok", [(86400.0, True), (60.0, True), (30 * DAY, True),
                                       (59.0, False), (30 * DAY + 1, False)])
def test_max_command_ttl_config(value, ok):
    why = TelemetryConfig(max_command_ttl_s=value).validate()
    assert (why is None) == ok, why
    if not ok:
        assert why[0] == "max_command_ttl_s"
