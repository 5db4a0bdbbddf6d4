"""Review findings on bundles over MQTT, the store's shelf and the canary clock (issue 15):
each test failed before its fix."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time

import pytest
from support.bundle_api import Coord, StoreShelf, fetch
from support.model_dirs import big_bundle

from runtime.coordinator.canary_clock import MAX_SLEEP_S
from runtime.wire.bundle_chunks import OK, encode_chunk


def test_a_lost_head_chunk_does_not_pull_the_bundle_into_memory(tmp_path, broker):
    """The answer to the first request is lost (the broker, a flooded coordinator): the
    chunks after it wait in memory until it is asked again. The device must not keep
    asking for more meanwhile: what it holds unwritten stays within window x chunk bytes
    (it asked for the whole bundle within the re-request timeout before)."""
    s = StoreShelf(tmp_path / "shelf")
    b = big_bundle(tmp_path, 400_000)
    with b.open("rb") as f:
        held = s.receive(f, b.stat().st_size)
    c = Coord(broker, s)
    answer = c.server.answer
    lock = threading.Lock()
    head = {"answered": False, "dropped": 0, "furthest": 0}

    def losing_the_head(device: str, raw: bytes) -> bytes:
        req = json.loads(raw)
        with lock:
            if req["offset"] == 0 and not head["dropped"]:
                head["dropped"] = 1  # lost: a chunk of no bundle, which the device ignores
                return encode_chunk(OK, "other@1", 0, 1, b"x")
            if not head["answered"]:
                head["furthest"] = max(head["furthest"], req["offset"] + req["length"])
            out = answer(device, raw)
            if req["offset"] == 0:
                head["answered"] = True
            return out

    c.server.answer = losing_the_head
    chunk, window = 16 * 1024, 4
    try:
        got = fetch(tmp_path, broker, held, chunk=chunk, window=window, timeout_s=1.0)
        assert got.read_bytes() == b.read_bytes()
        assert head["dropped"] == 1
        # asked no further than one window past the missing head
        assert head["furthest"] <= window * chunk, head
    finally:
        c.close()
        s.close()


# -- canary clock: hostile or late sleeps ------------------------------------------------------

T, M = 100.0, 60.0  # rollout_timeout_s, wake_margin_s


def test_overdue_believes_the_longest_sleep_and_no_more():
    from runtime.coordinator.canary_clock import MAX_SLEEP_S, overdue

    far = 1e10 - 1  # the latest wake_at a state message may carry (payloads.T_MAX)
    # a wake far ahead: asleep on purpose for the longest sleep believed, then failed
    assert overdue(0, MAX_SLEEP_S, T, [[10, 10 + MAX_SLEEP_S]], far, M, 10) is None
    why = overdue(0, 10 + MAX_SLEEP_S + M + 1, T, [[10, 10 + MAX_SLEEP_S]], far, M, 10)
    assert why is not None and "not believed" in why, why
    # a plausible wake is unchanged
    assert overdue(0, 400, T, [[10, 500]], 500.0, M, 10) is None
    # fell asleep after 150 s awake without a verdict: held while asleep, failed at its wake
    assert overdue(0, 160, T, [[150, 5000]], 5000.0, M, 150) is None
    why = overdue(0, 5001, T, [[150, 5000]], None, M)
    assert why is not None and "no verdict within 100 s" in why, why


def test_a_canary_announcing_a_wake_in_the_year_2286_does_not_hold_its_rollout(
        tmp_path, store_url):
    """Old code: a canary whose state said `wake_at` = 1e10 (a clock gone wrong, or hostile)
    held its rollout's canary stage until then; now its sleep is believed for a week."""
    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.service import Coordinator
    from runtime.wire import payloads

    coord = Coordinator(CoordinatorConfig(fleet="f", store=store_url, rollout_timeout_s=T,
                                          wake_margin_s=M, bundles_dir=str(tmp_path / "b")))
    args = {"name": "m", "version": "2", "url": "http://x/api/v1/bundles/m@2", "size": 1,
            "sha256": "0" * 64, "token": "t"}
    coord.rollouts._send = lambda d, c, a: None
    coord.rollouts._deploy_args = lambda b: args

    def state(device, online, t, at, **extra):
        coord._ingest([(payloads.topic("f", device, "state"), payloads.encode("state", {
            "v": 1, "online": online, "boot": "b", "t": t, **extra}), at)])

    try:
        t0 = time.time()
        for d in ("sun1", "grid1"):
            state(d, True, t0, t0)
        coord.rollouts.set_group("g", ["sun1", "grid1"])
        r = coord.rollouts.start("m@2", "g", 50)
        assert r["canary"] == ["grid1"]
        state("grid1", False, t0 + 1, t0 + 1, asleep=True, wake_at=1e10 - 1)
        coord.rollouts.tick(t0 + 3600)
        assert coord.rollouts.get(r["id"])["state"] == "canary"  # asleep: clock stopped
        coord.rollouts.tick(t0 + MAX_SLEEP_S + M + 10)
        got = coord.rollouts.get(r["id"])
        assert got["state"] == "halted" and "not believed" in got["reason"], got["reason"]

    finally:
        coord.store.close()
        coord.shelf.close()


def test_a_second_download_of_the_same_bundle_does_not_write_into_the_first_ones_part(
        tmp_path, broker):
    """Two downloads of one bundle into one downloads directory at once (the daemon's
    deploy over MQTT and `edgerun models install`, say): old code let both append to the
    same `.part`, each at the offset it believed, and the file was neither's (sha256
    mismatch: both discarded). Now the second is refused at once and the first completes."""
    from runtime.ota.download import DownloadError

    s = StoreShelf(tmp_path / "shelf")
    b = big_bundle(tmp_path, 300_000)
    with b.open("rb") as f:
        held = s.receive(f, b.stat().st_size)
    c = Coord(broker, s)
    answer = c.server.answer

    def slow(device: str, raw: bytes) -> bytes:
        time.sleep(0.03)
        return answer(device, raw)

    c.server.answer = slow
    first: dict = {}

    def run() -> None:
        try:
            first["got"] = fetch(tmp_path, broker, held, chunk=8 * 1024, window=2)
        except Exception as e:  # reported by the assertion below
            first["error"] = e

    t = threading.Thread(target=run)
    t.start()
    part = tmp_path / "dl" / "b.edgerun.part"
    try:
        deadline = time.monotonic() + 20
        while not (part.exists() and part.stat().st_size > 0) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert part.exists(), "the first transfer never started"
        with pytest.raises(DownloadError, match="another download of this bundle"):
            fetch(tmp_path, broker, held, chunk=8 * 1024, window=2, timeout_s=1.0)
        t.join(60)
        assert "error" not in first, first
        assert first["got"].read_bytes() == b.read_bytes()
        assert not list((tmp_path / "dl").glob("*.lock"))
    finally:
        t.join(60)
        c.close()
        s.close()


# -- the shelf in the store --------------------------------------------------------------------

def test_a_legacy_bundle_damaged_on_disk_is_not_imported(tmp_path):
    """Old code imported a bundles_dir file under the sha256 its old index recorded without
    hashing it: a file damaged since was served under that sha256, and every device fetched
    all of it to refuse it at the end (again at each return). Now it is left out, and a
    sound one next to it is imported."""
    import hashlib

    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.service import Coordinator

    old = tmp_path / "coord" / "bundles"
    old.mkdir(parents=True)
    db = sqlite3.connect(old / "index.db")
    db.execute("CREATE TABLE bundles (id TEXT PRIMARY KEY, body TEXT)")
    for bid, damaged in (("m@1", True), ("m@2", False)):
        (tmp_path / bid).mkdir()
        data = big_bundle(tmp_path / bid, 50_000).read_bytes()
        body = {"id": bid, "name": "m", "version": bid[2:], "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(), "token": "tok", "created": 1.0}
        if damaged:  # one byte flipped on disk, same size
            data = data[:1000] + bytes([data[1000] ^ 1]) + data[1001:]
        (old / f"{bid}.edgerun").write_bytes(data)
        db.execute("INSERT INTO bundles VALUES (?, ?)", (bid, json.dumps(body)))
    db.commit()
    db.close()
    c = Coordinator(CoordinatorConfig(store=str(tmp_path / "coord" / "c.db")))
    try:
        assert c.shelf.get("m@1") is None
        held = c.shelf.get("m@2")
        assert held is not None and c.shelf.read(held, 0, held.size) == \
            (old / "m@2.edgerun").read_bytes()
    finally:
        c.store.close()
        c.shelf.close()


def test_uploading_a_bundle_again_mends_rows_lost_from_the_store(tmp_path, store_url):
    """A chunk row gone from the store (a partial restore, a hand-made DELETE): reading says
    "upload the bundle again". Old code answered that upload 200 from the bundle's row
    without looking at its rows, and the bundle stayed broken for good; now the upload
    writes the rows again and the bundle reads whole."""
    from runtime.coordinator.bundles import BundleRefused, Shelf
    from runtime.coordinator.store import Store

    st = Store(store_url)
    try:
        shelf = Shelf(st, 64 << 20)
        shelf.chunk_bytes = 16 * 1024
        b = big_bundle(tmp_path, 100_000)
        data = b.read_bytes()
        with b.open("rb") as f:
            held = shelf.receive(f, len(data))
        st.write("DELETE FROM bundle_chunks WHERE sha256=? AND idx=?", [(held.sha256, 2)])
        with pytest.raises(BundleRefused, match="upload the bundle again"):
            shelf.read(held, 0, held.size)
        with b.open("rb") as f:
            again = shelf.receive(f, len(data))
        assert again.token == held.token  # the same bundle: devices' tokens still open it
        assert shelf.read(again, 0, again.size) == data
    finally:
        st.close()


def test_a_wrong_token_does_not_tell_which_bundles_exist(tmp_path):
    """Over HTTP a bad token gets 401 for a held bundle and an unknown one alike. Over MQTT
    old code answered "forbidden" for a held bundle and "not found" for an unknown one, so
    any enrolled device could list the shelf by guessing names with a bad token."""
    from support.bundle_api import answer

    s = StoreShelf(tmp_path / "shelf")
    b = big_bundle(tmp_path, 20_000)
    with b.open("rb") as f:
        held = s.receive(f, b.stat().st_size)
    try:
        real = answer(s, {"bundle": held.id, "offset": 0, "length": 10, "token": "guess"})
        none = answer(s, {"bundle": "nope@1", "offset": 0, "length": 10, "token": "guess"})
        assert (real.status, real.total, real.reason.replace(held.id, "X")) == \
            (none.status, none.total, none.reason.replace("nope@1", "X"))
        # the right token still reads it
        ok = answer(s, {"bundle": held.id, "offset": 0, "length": 10, "token": held.token})
        assert ok.status == OK and ok.body == b.read_bytes()[:10]
    finally:
        s.close()


def test_a_far_wake_from_a_clock_running_ahead_is_noted_once_and_still_ends():
    """The sleep's start is the device's own stamp when this coordinator has not heard it
    since it started (service._sleep_of), which a fast device clock puts in the future: the
    believed wake must not move with each tick (a new sleep noted, and written, every
    second; never overdue)."""
    from runtime.coordinator.canary_clock import MAX_SLEEP_S, believed_wake, note_sleep, overdue

    since, wake_at = 1e6 + 7200, 1e10 - 1  # its clock 2 h ahead; a wake in 2286
    sleeps: list[list[float]] = []
    noted = [note_sleep(sleeps, since, believed_wake(since, wake_at), now)
             for now in (1e6, 1e6 + 1, 1e6 + 2)]
    assert noted == [True, False, False] and len(sleeps) == 1
    end = since + MAX_SLEEP_S + M + 1
    why = overdue(1e6 - 10, end, T, sleeps, wake_at, M, since)
    assert why is not None and "not believed" in why, why


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs (root only: skipped where mounting is not allowed)."""
    import subprocess

    where = tmp_path / "small"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield where
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_disk_filling_mid_transfer_fails_saying_so_and_the_next_attempt_resumes(
        tmp_path, broker, small_disk):
    """Old code: the full disk's OSError left the MQTT transfer bare ("[Errno 28] No space
    left on device", no file, no progress, not a DownloadError: unlike the HTTP route). Now
    it says where and how far, the part stays a prefix, and once there is room the next
    attempt resumes from it."""
    from runtime.ota.bundle_mqtt import fetch_over_mqtt
    from runtime.ota.download import DownloadError

    s = StoreShelf(tmp_path / "shelf")
    b = big_bundle(tmp_path, 150_000)
    with b.open("rb") as f:
        held = s.receive(f, b.stat().st_size)
    c = Coord(broker, s)
    answer = c.server.answer

    def slow(device: str, raw: bytes) -> bytes:
        time.sleep(0.02)
        return answer(device, raw)

    c.server.answer = slow
    dest = small_disk / "dl" / "b.edgerun"
    part = dest.with_name("b.edgerun.part")
    filler = small_disk / "filler"

    def fill() -> None:  # another writer takes the rest of the disk mid-transfer
        deadline = time.monotonic() + 20
        while not (part.exists() and part.stat().st_size > 20_000) \
                and time.monotonic() < deadline:
            time.sleep(0.005)
        with contextlib.suppress(OSError), filler.open("wb", buffering=0) as f:
            while True:
                f.write(b"\0" * 4096)

    def get():
        return fetch_over_mqtt(dest, broker.device("t", "box1"), "t", "box1", held.id,
                               held.size, held.sha256, held.token, 64 << 20, 0,
                               chunk=8 * 1024, window=2, timeout_s=2.0)

    filling = threading.Thread(target=fill, daemon=True)
    filling.start()
    try:
        with pytest.raises(DownloadError, match=r"cannot write .*b\.edgerun\.part after \d+ "
                                                r"of \d+ bytes .*No space left.*resumes"):
            get()
        filling.join(20)
        data = b.read_bytes()
        have = part.read_bytes()
        assert 0 < len(have) < len(data) and data[:len(have)] == have  # a prefix
        filler.unlink()
        assert get().read_bytes() == data
    finally:
        c.close()
        s.close()


def test_a_command_for_a_sleeper_with_a_far_wake_expires_within_a_day(tmp_path):
    """Old code signed a command for a device asleep "until 2286" to expire then: valid (and
    kept in the device's replay record) for centuries. Now it lives a week past the send at
    most, plus the margin and the usual ttl."""
    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.service import Coordinator
    from runtime.wire import payloads
    from runtime.wire.commands import generate_keypair

    generate_keypair(tmp_path / "c.pem", tmp_path / "c.pub")
    coord = Coordinator(CoordinatorConfig(fleet="f", store=str(tmp_path / "c.db"),
                                          signing_key=str(tmp_path / "c.pem"),
                                          wake_margin_s=M))
    try:
        now = time.time()
        coord._ingest([(payloads.topic("f", "sun1", "state"), payloads.encode("state", {
            "v": 1, "online": False, "boot": "b", "t": now, "asleep": True,
            "wake_at": 1e10 - 1}), now)])
        reply = coord.send_command("sun1", "ping", {}, ttl_s=60)
        assert reply is not None and reply["status"] == "queued", reply
        assert reply["expires_at"] <= time.time() + MAX_SLEEP_S + M + 60, reply
    finally:
        coord.store.close()
        coord.shelf.close()
        coord._conn.stop(1.0)


# -- rollouts ------------------------------------------------------------------------------------

def test_a_tick_does_not_read_finished_rollouts_again(store_url):
    """Each coordinator ticks the rollouts every second on its ingest thread. Old code read
    and decoded every rollout ever made at each tick (240-350 ms a tick with 50 finished
    rollouts of 5000 devices on SQLite); a finished rollout (done, halted) never becomes
    active again, so after one look it is not read again. The active one still times out."""
    import uuid

    from runtime.coordinator.rollout import Rollouts
    from runtime.coordinator.store import Store

    st = Store(store_url)
    try:
        bodies: list[str] = []
        read = st.read

        def counting(sql, args=()):
            rows = read(sql, args)
            bodies.extend(str(c) for row in rows for c in row if str(c).startswith("{"))
            return rows

        st.read = counting
        r = Rollouts(st, lambda *a: None, lambda b: {"name": "m", "version": "1"},
                     lambda: [], timeout_s=T)
        rows = []
        for k, state in enumerate(("done", "halted", "done", "canary")):
            rid = uuid.uuid4().hex[:12]
            rows.append((rid, float(k), json.dumps({
                "id": rid, "bundle": "m@1", "group": "g", "canary_pct": 50, "canary": ["a"],
                "rest": [], "state": state, "reason": "", "created": float(k),
                "version": "m@1", "args": {},
                "devices": {"a": {"state": "sent" if state == "canary" else "passed",
                                  "sent": 1000.0}}})))
        st.write("INSERT INTO rollouts VALUES (?,?,?)", rows)
        active = rows[-1][0]
        r.tick(1010.0)
        bodies.clear()
        r.tick(1020.0)
        assert [json.loads(b)["id"] for b in bodies] == [active]  # the active one only
        r.tick(1000.0 + T + 1)  # the canary timed out: halted
        assert r.get(active)["state"] == "halted"
        bodies.clear()
        r.tick(1000.0 + T + 2)
        assert bodies == []
    finally:
        st.close()


def test_sending_the_rest_of_a_group_is_a_few_statements_not_two_a_device(store_url):
    """When the canary passes, the rest of the group is sent from the event's thread (the
    ingest thread). Old code read and wrote each device's desired state in a transaction of
    its own (0.77 s for 5000 devices on SQLite, a round trip each on PostgreSQL); now it is
    a few statements whatever the group's size, and each device's desired state is kept."""
    from runtime.coordinator.rollout import Rollouts
    from runtime.coordinator.store import Store

    st = Store(store_url)
    try:
        devs = [f"d{i:04d}" for i in range(400)]
        sent: list[tuple] = []
        args = {"name": "m", "version": "1", "size": 1, "sha256": "0" * 64, "token": "t",
                "url": "http://x/api/v1/bundles/m@1"}
        r = Rollouts(st, lambda *a: sent.append(a), lambda b: dict(args), lambda: devs)
        r.set_group("g", devs)
        r.record_setting("d0399", "set_rate", {"hz": 2.0})  # kept beside the model
        calls = {"write": 0, "read": 0}
        for name in calls:
            orig = getattr(st, name)

            def counted(*a, _orig=orig, _name=name):
                calls[_name] += 1
                return _orig(*a)

            setattr(st, name, counted)
        ro = r.start("m@1", "g", 1)  # canary: 1 % of 400
        for d in ro["canary"]:
            r.on_event(d, {"type": "model_probation_passed", "version": "m@1"})
        assert r.get(ro["id"])["state"] == "rolling"
        assert len(sent) == 400
        assert calls["write"] < 20 and calls["read"] < 40, calls
        assert r.desired("d0399") == {"model": args, "settings": {"set_rate": {"hz": 2.0}}}
    finally:
        st.close()
