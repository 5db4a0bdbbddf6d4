"""The coordinator store on both backends (SQLite file, real PostgreSQL server): exactly once,
maintained counts and fleet views shared by several coordinators, versioned migrations,
PostgreSQL time partitions dropped by retention."""

from __future__ import annotations

import socket
import sqlite3
import threading
import time

import pytest

from runtime.coordinator.dialect import DAY
from runtime.coordinator.ingest import Ingest
from runtime.coordinator.store import Inbound, Store


def _batch(stream: str, seqs, floor: int = 1, boot: str = "b1") -> dict:
    return {"v": 1, "stream": stream, "boot": boot, "floor": floor,
            "results": [{"seq": s, "t": time.time(), "label": "ok"} for s in seqs]}


def _state(online: bool, t: float, boot: str = "b1") -> dict:
    return {"v": 1, "online": online, "boot": boot, "t": t,
            "versions": {"edgerun": "1.0"}, "reason": "" if online else "connection lost"}


def test_exactly_once_and_counts_without_group_by(store_url):
    store = Store(store_url)
    store.ingest([Inbound("d1", "result", _batch("s", range(1, 6)))])
    store.ingest([Inbound("d1", "result", _batch("s", range(3, 9))),  # 3..5 re-delivered
                  Inbound("d2", "result", _batch("s", [1, 2]))])
    assert store.counts() == {"d1": 8, "d2": 2}
    assert store.total_results() == 10
    assert [q for _, q in store.result_seqs("d1")] == list(range(1, 9))
    assert store.acks() == {("d1", "s"): 8, ("d2", "s"): 2}
    # the counts come from the maintained table, not from the rows
    with store._d.reader() as db:
        assert sorted(tuple(r) for r in db.execute("SELECT device, n FROM result_counts")
                      .fetchall()) == [("d1", 8), ("d2", 2)]
    done = store.prune_results(max_age_s=60, now=time.time() + 3600)
    assert done["results_by_age"] == 10 and store.counts() == {}
    store.close()


def test_two_coordinators_see_the_same_fleet_view(store_url):
    """The view lives in `devices`: what one coordinator stored, the other answers."""
    a, b = Store(store_url), Store(store_url)
    now = time.time()
    a.ingest([Inbound("d1", "state", _state(True, now))])
    b.ingest([Inbound("d1", "health", {"v": 1, "t": now + 1, "boot": "b1", "temp_c": 51.0})])
    # an older health arriving late at the first coordinator does not replace the newer one
    a.ingest([Inbound("d1", "health", {"v": 1, "t": now, "boot": "b1", "temp_c": 40.0})])
    va, vb = a.views()["d1"], b.views()["d1"]
    assert va == vb
    assert va.online and va.versions == {"edgerun": "1.0"} and va.health["temp_c"] == 51.0
    b.ingest([Inbound("d1", "state", _state(False, now))])  # the will, seen through b
    assert not a.views()["d1"].online
    a.close()
    b.close()


def test_concurrent_coordinators_store_each_result_once(store_url):
    """Two stores ingest the same stream at once, overlapping re-deliveries included:
    every seq once, and the ack ends at the top."""
    stores = [Store(store_url), Store(store_url)]
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            for start in range(1, 400, 20):
                # both send every batch (as after a re-delivery), each from a floor it has
                stores[k].ingest([Inbound("d", "result", _batch("s", range(start, start + 20),
                                                                floor=start)),
                                  Inbound(f"e{k}", "health", {"v": 1, "t": time.time(),
                                                              "boot": "b"})])
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert [q for _, q in stores[0].result_seqs("d")] == list(range(1, 401))
    assert stores[1].counts()["d"] == 400
    assert stores[0].acks() == {("d", "s"): 400}
    for s in stores:
        s.close()


def test_migrations_are_versioned_and_applied_once(store_url):
    first = Store(store_url)
    first.ingest([Inbound("d", "result", _batch("s", [1]))])
    first.close()
    again = Store(store_url)  # re-opening applies nothing twice and loses nothing
    with again._d.reader() as db:
        versions = [r[0] for r in db.execute("SELECT version FROM schema_version").fetchall()]
    assert versions == sorted(set(versions)) and versions
    assert again.counts() == {"d": 1}
    again.close()


def test_an_sqlite_store_from_before_the_counts_table_is_migrated(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE results (device TEXT NOT NULL, stream TEXT NOT NULL, seq INTEGER NOT NULL,
            boot TEXT NOT NULL, t REAL NOT NULL, received REAL NOT NULL, body TEXT NOT NULL,
            PRIMARY KEY (device, stream, seq)) WITHOUT ROWID;
        CREATE TABLE streams (device TEXT NOT NULL, stream TEXT NOT NULL,
            acked INTEGER NOT NULL, PRIMARY KEY (device, stream)) WITHOUT ROWID;
        INSERT INTO results VALUES ('d', 's', 1, 'b', 1, 1, '{}'), ('d', 's', 2, 'b', 1, 1, '{}');
        INSERT INTO streams VALUES ('d', 's', 2);
    """)
    db.close()
    store = Store(path)
    assert store.counts() == {"d": 2}  # back-filled once by migration 2
    assert store.acks() == {("d", "s"): 2}
    store.ingest([Inbound("d", "result", _batch("s", [3], floor=3))])
    assert store.counts() == {"d": 3}
    store.close()


def _partitions(store: Store, table: str) -> list[str]:
    with store._d.reader() as db:
        return sorted(r[0] for r in db.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = ?", (table,)).fetchall())


def test_postgres_retention_drops_whole_acked_day_partitions(postgres):
    store = Store(postgres.create_database("partitions"))
    today = f"results_p{time.strftime('%Y%m%d', time.gmtime())}"
    assert today in _partitions(store, "results")  # made ahead at start
    assert "results_default" in _partitions(store, "results")
    store.ingest([Inbound("d", "result", _batch("s", range(1, 51)))])
    store.ingest([Inbound("e", "result", _batch("s", range(2, 5)))])  # e's seq 1 never came
    with store._d.reader() as db:
        in_today = db.execute(f"SELECT COUNT(*) FROM {today}").fetchone()[0]
    assert in_today == 53
    # three days on: today's partition still holds e's unacked rows, so it is not dropped;
    # d's acked rows are deleted by row, e's kept
    later = time.time() + 3 * DAY
    done = store.prune_results(max_age_s=DAY, now=later)
    assert done["results_by_age"] == 50 and today in _partitions(store, "results")
    assert store.counts() == {"e": 3}
    # once e's seq 1 arrives everything is acked: the whole day goes with one DROP
    store.ingest([Inbound("e", "result", _batch("s", [1]))])
    assert store.acks()[("e", "s")] == 4
    done = store.prune_results(max_age_s=DAY, now=later)
    assert done["results_by_age"] == 4 and today not in _partitions(store, "results")
    assert store.counts() == {}
    with store._d.reader() as db:  # the keys went with the partition
        assert db.execute("SELECT COUNT(*) FROM result_keys").fetchone()[0] == 0
    store.maintain()  # the day is made again for new rows (none were in the default)
    assert today in _partitions(store, "results")
    store.close()


def test_postgres_health_partitions_dropped_by_prune(postgres):
    store = Store(postgres.create_database("healthparts"))
    old = time.time() - 30 * DAY  # a device clock far behind: lands in the default partition
    store.ingest([Inbound("d", "health", {"v": 1, "t": old, "boot": "b"}),
                  Inbound("d", "health", {"v": 1, "t": time.time(), "boot": "b"})])
    store.prune(keep_health_s=DAY, keep_events_s=DAY)
    assert [h["t"] > old for h in store.latest_health().values()] == [True]
    with store._d.reader() as db:
        assert db.execute("SELECT COUNT(*) FROM health").fetchone()[0] == 1
    store.close()


def test_a_health_claimed_days_ahead_does_not_stop_that_days_partition(postgres):
    """A device's unsynced health may claim any time up to 2100 (a claim, placed later):
    one stamped five days ahead went into the default partition, and when that day came
    CREATE TABLE health_pYYYYMMDD PARTITION OF health failed ("updated partition constraint
    for default partition would be violated"): that day's partition was never made, so the
    whole fleet's health of that day went into the default, where retention can only
    delete rows (no partition to drop, no space given back). One device a day ahead could
    do it to every day. Now the day's rows are moved out of the default into the new
    partition."""
    store = Store(postgres.create_database("claimsahead"))
    ahead = time.time() + 5 * DAY
    day = f"health_p{time.strftime('%Y%m%d', time.gmtime(ahead))}"
    clk = {"sync": False, "boot_id": "k1", "bt": 100.0}
    store.ingest([Inbound("evil", "health", {"v": 1, "t": ahead, "boot": "b", "clk": clk})])
    usage = store.read("SELECT device, pool, bytes FROM pool_usage ORDER BY 1, 2")
    store._d.maintain(now=ahead)  # five days on: the retention pass makes that day
    assert day in _partitions(store, "health")
    store.ingest([Inbound("good", "health", {"v": 1, "t": ahead + 60, "boot": "g"})])
    where = store.read("SELECT device, tableoid::regclass::text FROM health ORDER BY 1")
    assert where == [("evil", day), ("good", day)]
    # moved, not copied: the shares' byte counts and the row count are as before
    assert store.read("SELECT device, pool, bytes FROM pool_usage WHERE device = 'evil' "
                      "ORDER BY 1, 2") == usage
    store.close()


@pytest.mark.parametrize("server", ["refusing", "silent"])
def test_unreachable_server_is_an_error_not_a_hang(server):
    """A port that refuses, and a server that accepts and never says a word (a half-dead
    host, a firewall that blackholes after the handshake): both are an error within the
    configured connect timeout plus one bounded attempt still in flight (libpq's
    connect_timeout, the same seconds), and no pool thread is left behind."""
    from runtime.coordinator.dialect import PostgresDialect

    timeout_s = 2
    silent = socket.socket()
    try:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the handshake; nobody ever reads or writes
        port = silent.getsockname()[1] if server == "silent" else 1
        before = set(threading.enumerate())
        t0 = time.monotonic()
        with pytest.raises(ConnectionError, match=f"within {timeout_s} s"):
            PostgresDialect(f"postgresql://nobody@127.0.0.1:{port}/none",
                            connect_timeout_s=timeout_s)
        elapsed = time.monotonic() - t0
        left = [t.name for t in set(threading.enumerate()) - before if t.is_alive()]
    finally:
        silent.close()
    # the pool's wait, then the attempt in flight; 3 s for a loaded host (was 9 s for a
    # silent server: 5 s more waiting for the hung worker thread, which then stayed hung)
    assert elapsed < 2 * timeout_s + 3, elapsed
    assert left == [], left


class _ExactAcks(Ingest):
    """The reference: every stream's ack computed by the per-stream queries of `_acks`."""

    def _acks_batch(self, db, floors, tops):
        return {k: self._acks(db, *k, fl, tops[k]) for k, fl in floors.items()}


def _reference_store(path: str) -> Store:
    """A store whose ingest room computes acks with `_ExactAcks` (same dialect, same budget)."""
    store = Store(path)
    store._ingest = _ExactAcks(store._d, store._budget)
    return store


def test_batched_acks_equal_the_per_stream_reference(store_url, tmp_path):
    """Random batches with re-sends, gaps, evictions (floor jumps), forged floors and runs
    longer than the 512-seq window: the batched acks equal the exact per-stream ones."""
    import random

    rng = random.Random(7)
    fast = Store(store_url)
    ref = _reference_store(str(tmp_path / "reference.db"))
    held = {s: 1 for s in ("a", "b")}  # each stream's floor (lowest seq the device holds)
    top = {s: 0 for s in held}
    for _ in range(60):
        batch = []
        for _ in range(rng.randint(1, 4)):
            s = rng.choice(list(held))
            choice = rng.random()
            if choice < 0.1:  # eviction: the device's floor jumps past a gap
                held[s] = top[s] + rng.randint(2, 5)
                top[s] = held[s] - 1
            if choice < 0.05:
                batch.append(Inbound("d", "result", _batch(s, [10**9], floor=10**9)))  # forged
            lo = rng.randint(held[s], top[s] + 1) if rng.random() < 0.3 else top[s] + 1
            n = rng.choice([1, 5, 40, 600])
            loss = 0.05 if rng.random() < 0.3 else 0.0  # some batches lose a few
            seqs = [q for q in range(lo, lo + n) if rng.random() >= loss]
            if seqs:
                batch.append(Inbound("d", "result", _batch(s, seqs, floor=held[s])))
                top[s] = max(top[s], seqs[-1])
        got, _ = fast.ingest(batch)
        want, _ = ref.ingest(batch)
        assert got == want
        for (_, s), acks in got.items():  # the device deletes what its acks cover...
            for a in acks if rng.random() < 0.7 else ():  # ...unless the ack was lost
                if a.first <= held[s]:
                    held[s] = max(held[s], a.seq + 1)
    assert fast.acks() == ref.acks()
    fast.close()
    ref.close()


def test_health_timeline_and_history_on_both_backends(store_url):
    """The dashboard's bucketed timeline (health_points) and `edgerun report`'s history are
    stored and read the same on both backends, by the batch and the per-message paths, and
    pruned with the health they came from."""
    store = Store(store_url)
    t0 = time.time() - 100

    def health(i: int, temp) -> dict:
        return {"v": 1, "t": t0 + i, "boot": "b1", "temp_c": temp, "rung": 1 + i % 3,
                "rungs": 3, "power_w": 2.0, "pipeline": {"rate_hz": 5.0,
                                                         "latency_ms": {"p95": 1.0 + i}}}

    store.ingest([Inbound("d1", "health", health(i, 40.0 + i)) for i in range(50)])
    # a batch with one refused message goes the per-message way: its health still lands
    store.ingest([Inbound("d1", "health", health(50, float("nan"))),
                  Inbound("d1", "result", _batch("s", [0]))])  # seq 0: refused
    rows = store.health_series("d1", t0, t0 + 60, [("temp_c", "MAX"), ("rung", "MIN"),
                                                   ("p95_ms", "MAX")], max_points=10)
    assert 9 <= len(rows) <= 11
    assert max(r[1] for r in rows if r[1] is not None) == 89.0
    assert min(r[2] for r in rows) == 1.0
    last = store.health_series("d1", t0 + 50, t0 + 50, [("temp_c", "MAX")])
    assert last and last[0][1] is None  # NaN stored as a gap, not an error
    hist = store.health_history("d1", t0, t0 + 60, 1000)
    assert len(hist) == 51 and hist[0]["temp_c"] == 40.0
    store.prune(keep_health_s=1, keep_events_s=1)
    assert store.health_series("d1", t0, t0 + 60, [("temp_c", "MAX")]) == []
    store.close()


def test_bodies_with_every_awkward_character_come_back_as_sent(store_url):
    """The batch's JSON bodies go to PostgreSQL as binary text arrays (dialect.sql: `%b`):
    quotes, backslashes, braces, commas, the word NULL, non-ASCII and control characters in
    labels, states and health come back byte for byte on both backends."""
    odd = ['say "hi"', "back\\slash", "{brace},comma", "NULL", "", "é ü 中 😀", "tab\tnew\nline",
           "\\u0000 not an escape", "\x01"]
    batch = {"v": 1, "stream": "s", "boot": "b1", "floor": 1,
             "results": [{"seq": i + 1, "t": 1.0, "label": label} for i, label in
                         enumerate(odd)]}
    health = {"v": 1, "t": time.time(), "boot": "b1", "choice": odd[0] + odd[1] + odd[5],
              "sensor_problems": odd}
    state = {**_state(True, time.time()), "reason": odd[2] + odd[6]}
    store = Store(store_url)
    try:
        store.ingest([Inbound("d1", "result", batch), Inbound("d1", "health", health),
                      Inbound("d1", "state", state)])
        assert [r["label"] for r in store.results("d1")] == odd
        assert store.latest_health()["d1"] == health
        assert store.states()["d1"] == state
        view = store.views()["d1"]
        assert view.health == health and view.choice == health["choice"]
    finally:
        store.close()


def test_changed_views_decodes_each_row_once_per_change(store_url):
    """A refresh read every row changed in the last 3 s on every call (6,000 rows a second
    at 10,000 devices). Store.changed_views skips rows whose `updated` stamp was already
    merged, and Store.ingest's `written` hands the writer its own rows' stamps and views."""
    s1, s2 = Store(store_url), Store(store_url)
    try:
        written: dict = {}
        s1.ingest([Inbound("d1", "state", _state(True, time.time())),
                   Inbound("d2", "state", _state(True, time.time()))], written)
        assert sorted(written) == ["d1", "d2"] and written["d1"][1].online
        mine = {d: u for d, (u, _) in written.items()}
        assert s1.changed_views(None, mine) == {}  # the writer's own rows: nothing to decode
        seen: dict = {}
        got = s2.changed_views(None, seen)
        assert sorted(got) == ["d1", "d2"] and got["d1"] == written["d1"][1]
        assert s2.changed_views(None, seen) == {}  # unchanged since: not decoded again
        s1.ingest([Inbound("d2", "state", _state(False, time.time()))])
        again = s2.changed_views(None, seen)
        assert list(again) == ["d2"] and not again["d2"].online
    finally:
        s1.close()
        s2.close()


class _FullAtCommit:
    """An SQLite connection whose next COMMIT meets a full disk: SQLite then rolls the
    transaction back itself (SQLITE_FULL), as it did on a 4 MB tmpfs in the attack run."""

    def __init__(self, db: sqlite3.Connection):
        self._db, self.full = db, True

    def execute(self, sql: str, *args):
        if sql == "COMMIT" and self.full:
            self.full = False
            self._db.execute("ROLLBACK")
            raise sqlite3.OperationalError("database or disk is full")
        return self._db.execute(sql, *args)

    def __getattr__(self, name: str):
        return getattr(self._db, name)


def test_a_commit_refused_by_a_full_disk_raises_that_error_and_the_store_goes_on(tmp_path):
    """SQLite rolls a transaction back itself when its COMMIT meets a full disk; the
    dialect then ran ROLLBACK, which raised 'cannot rollback - no transaction is active'
    and hid the disk-full error (the coordinator logged that, twice chained, for every
    batch). Now the original error is raised, and the next batch stores."""
    store = Store(str(tmp_path / "c.db"))
    try:
        store._d.db = _FullAtCommit(store._d.db)
        batch = [Inbound("a", "result", {"v": 1, "stream": "s", "boot": "b", "floor": 1,
                                         "results": [{"seq": 1, "t": time.time()}]})]
        with pytest.raises(sqlite3.OperationalError, match="disk is full"):
            store.ingest(batch)
        _, refused = store.ingest(batch)  # space again: stored once
        assert refused == [] and store.acks() == {("a", "s"): 1}
    finally:
        store._d.db = store._d.db._db
        store.close()


def test_a_store_that_refuses_every_batch_is_logged_once_a_minute(tmp_path, caplog):
    """A full store disk fails every batch: each failure was logged with its traceback,
    so the coordinator's log grew as fast as devices sent (462 tracebacks, 300 KB, in 45 s
    of the attack run), on a box whose disk is already full. Once a minute now, with the
    error and how many more there were; every failure is still counted."""
    import logging

    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.service import Coordinator

    # no group commit: each message its own batch, so each failure is one
    coord = Coordinator(CoordinatorConfig(fleet="f", store=str(tmp_path / "c.db"),
                                          ingest_window_s=0.0))

    def full(*a, **k):
        raise sqlite3.OperationalError("database or disk is full")

    coord.store.ingest = full
    body = b'{"v":1,"stream":"s","boot":"b","floor":1,"results":[{"seq":1,"t":%f}]}' % time.time()
    loop = threading.Thread(target=coord._ingest_loop)
    try:
        with caplog.at_level(logging.ERROR, logger="edgerun.coordinator"):
            loop.start()
            for _ in range(50):
                coord._inbox.put(("edgerun/v1/f/a/result", body, time.time()))
                deadline = time.monotonic() + 10
                while coord._inbox.qsize() and time.monotonic() < deadline:
                    time.sleep(0.005)
            deadline = time.monotonic() + 10
            while coord.counters["ingest_errors"] < 50 and time.monotonic() < deadline:
                time.sleep(0.01)
    finally:
        coord._stop.set()
        loop.join(10)
        coord.store.close()
    assert coord.counters["ingest_errors"] >= 50
    lines = [r for r in caplog.records if "storing a batch" in r.getMessage()]
    assert len(lines) == 1 and "disk is full" in lines[0].getMessage()


def test_a_key_twice_in_a_batch_is_stored_once_on_both_paths(store_url):
    """A seq repeated inside one message and across messages of one batch is stored once,
    on the fast path and on the savepoints path (a refused message in the batch)."""
    store = Store(store_url)
    _, refused = store.ingest([Inbound("d", "result", _batch("s", [1, 2, 2, 3])),
                                  Inbound("d", "result", _batch("s", [3, 4], floor=3))])
    assert refused == [] and store.counts() == {"d": 4}
    _, refused = store.ingest([Inbound("d", "result", _batch("s", [4, 5, 5], floor=4)),
                                  Inbound("d", "result", _batch("s", [0], floor=6)),
                                  Inbound("d", "result", _batch("s", [5, 6, 1], floor=5))])
    assert [i for i, _ in refused] == [1]
    assert [q for _, q in store.result_seqs("d")] == [1, 2, 3, 4, 5, 6]
    assert store.counts() == {"d": 6}
    store.close()


def test_a_store_failing_a_batch_still_hears_its_devices_and_their_replies(tmp_path):
    """The coordinator's store failing is not its devices falling silent. On a full store
    disk (the attack run: a real coordinator, a 3 MB tmpfs filled for 10 s, a device at
    50/s) the device that was sending all along went `online -> stale -> offline` with both
    alerts raised (webhooks would have told the operator the whole fleet was down), and a
    command's reply that arrived meanwhile never reached the operator waiting for it. Now
    a failed batch still updates the fleet view and hands its replies to their waiters;
    its results are not acked (the device re-sends them)."""
    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.service import Coordinator

    coord = Coordinator(CoordinatorConfig(fleet="f", store=str(tmp_path / "c.db"),
                                          device_keys=str(tmp_path / "keys")))

    def full(*a, **k):
        raise sqlite3.OperationalError("database or disk is full")

    coord.store.ingest = full
    waiter = (threading.Event(), [], "a")  # command c1, sent to a, awaits its reply
    coord.commander._waiters["c1"] = waiter
    now = time.time()
    batch = [("edgerun/v1/f/a/result",
              b'{"v":1,"stream":"s","boot":"b","floor":1,"results":[{"seq":1,"t":%f}]}' % now,
              now),
             ("edgerun/v1/f/a/cmd/reply",
              b'{"v":1,"id":"c1","ok":true,"status":"done","t":%f}' % now, now)]
    try:
        with pytest.raises(sqlite3.OperationalError, match="disk is full"):
            coord._ingest(batch)
        view = coord.views.get("a")
        assert view is not None and view.status == "online" and view.last_seen >= now
        assert waiter[0].is_set() and waiter[1][0]["device_status"] == "done"
    finally:
        coord.store.close()


def test_reads_answer_while_a_write_transaction_hangs(store_url):
    """A store whose disk stops answering writes (the attack run: `fsfreeze` on the loop
    ext4 holding a real coordinator's SQLite store for 12 s, a device at 50/s) hung every
    API request, /metrics and /api/v1/stats included, for as long as the freeze lasted: on
    SQLite every read took the one connection's lock, which the ingest thread held inside
    its stalled commit, so the operator's monitoring lost the coordinator exactly when it
    was needed. Reads now have their own connection (WAL lets them read the last commit
    beside a writer), as the PostgreSQL pool always gave them."""
    store = Store(store_url)
    store.ingest([Inbound("a", "result", _batch("s", range(1, 4)))])
    holding, release = threading.Event(), threading.Event()

    def stalled_commit():
        with store._d.transaction() as db:
            db.execute("INSERT INTO result_counts VALUES ('b', 1) ON CONFLICT (device) "
                       "DO UPDATE SET n = 1")
            holding.set()
            release.wait(30)

    writer = threading.Thread(target=stalled_commit)
    writer.start()
    try:
        assert holding.wait(10)
        got: list = []
        reader = threading.Thread(target=lambda: got.append((store.counts(),
                                                             store.used_bytes() > 0)))
        reader.start()
        reader.join(10)
        assert got == [({"a": 3}, True)], "a read waited for the stalled write"
    finally:
        release.set()
        writer.join(10)
    assert store.counts() == {"a": 3, "b": 1}  # the commit, once done, is read
    store.close()
