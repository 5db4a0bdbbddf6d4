"""Integration of the coordinator's features with each other (a PostgreSQL store, several
coordinators on one store, rollouts, bundles, sleepers, alerts): what each feature's own tests
did not combine."""

from __future__ import annotations

import time
from pathlib import Path


def test_bundles_of_a_postgres_coordinator_are_not_kept_under_the_working_directory(
        tmp_path, monkeypatch, store_url):
    """With a PostgreSQL URL as the store and no bundles_dir, the shelf went to
    `Path(url).parent / "bundles"`: a directory `postgresql:/...` under whatever directory the
    coordinator was started in. The shelf is in the store now: no directory at all."""
    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.service import Coordinator

    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HOME", str(home))
    c = Coordinator(CoordinatorConfig(store=store_url))
    try:
        assert list(cwd.iterdir()) == [] and list(home.iterdir()) == []
        if "://" not in store_url:
            assert not (Path(store_url).parent / "bundles").exists()
    finally:
        c.store.close()
        c.shelf.close()


def test_a_rollout_advances_on_the_coordinator_that_does_not_hold_the_bundle(store_url):
    """Two coordinators on one store (share_group): the operator uploaded the bundle to the
    first and started the rollout there; the canary's verdict event lands on the second (the
    shared subscription sends each message to one of them). The second must send the rest
    the model (the stored deploy arguments point at the first's download URL); it used to
    ask its own shelf, fail ('no bundle held'), and leave the rollout `rolling` for ever
    with the rest never sent."""
    from runtime.coordinator.rollout import Rollouts
    from runtime.coordinator.store import Store

    args = {"name": "m", "version": "2", "url": "http://one/api/v1/bundles/m@2", "size": 1,
            "sha256": "0" * 64, "token": "t"}
    sent1, sent2 = [], []

    def not_held(bundle):
        raise ValueError(f"no bundle {bundle!r} held by this coordinator")

    s1, s2 = Store(store_url), Store(store_url)
    try:
        one = Rollouts(s1, lambda d, c, a: sent1.append((d, c, a)), lambda b: args,
                       lambda: ["a", "b", "c"])
        two = Rollouts(s2, lambda d, c, a: sent2.append((d, c, a)), not_held,
                       lambda: ["a", "b", "c"])
        one.set_group("g", ["a", "b", "c"])
        r = one.start("m@2", "g", 10)
        assert r["canary"] == ["a"] and [d for d, _, _ in sent1] == ["a"]
        assert two.get(r["id"])["state"] == "canary"  # the second sees it (shared store)
        two.on_event("a", {"type": "model_probation_passed", "version": "m@2"})
        got = two.get(r["id"])
        assert got["state"] == "rolling", got
        assert sorted(d for d, _, _ in sent2) == ["b", "c"]
        assert all(c == "deploy" and a == args for _, c, a in sent2)
        assert two.desired("b")["model"] == args
        for d in ("b", "c"):
            one.on_event(d, {"type": "model_probation_passed", "version": "m@2"})
        assert two.get(r["id"])["state"] == "done"
    finally:
        s1.close()
        s2.close()


def test_an_asleep_view_survives_the_store_round_trip(store_url):
    """A sleeper's view written by one coordinator and read back by another (Store.views):
    asleep, wake_at and status `asleep` come back, so a coordinator that only reads the
    shared table does not show or alert it as offline."""
    from runtime.coordinator import fleet
    from runtime.coordinator.store import Inbound, Store

    now = time.time()
    s1, s2 = Store(store_url), Store(store_url)
    try:
        s1.ingest([Inbound("d1", "state", {"v": 1, "online": False, "boot": "b", "t": now,
                                           "reason": "sleep", "asleep": True,
                                           "wake_at": now + 600})])
        v = s2.views()["d1"]
        assert (v.asleep, v.wake_at, v.status) == (True, now + 600, "asleep")
        cfg = fleet.FleetConfig(stale_after_s=1, offline_after_s=2)
        got = fleet.refresh(s2.views(), now + 60, cfg)["d1"]
        assert got.status == "asleep" and got.alerts == ()
    finally:
        s1.close()
        s2.close()


def _publisher(port: int):
    import paho.mqtt.client as mqtt

    cli = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                      client_id="probe-integration", protocol=mqtt.MQTTv5)
    cli.connect("127.0.0.1", port)
    cli.loop_start()
    return cli


def test_two_coordinators_on_postgres_serve_dashboard_sleepers_and_fleet_ls(
        tmp_path, postgres):
    """Two coordinator processes (one shared subscription group) on one PostgreSQL store, a
    real Mosquitto: a hot device's health and a sleeper. Both coordinators serve the
    dashboard's history, the report history and the alerts from the shared store; the sleeper
    is asleep at both (no offline/stale alert at the one that never took its traffic);
    `edgerun fleet ls` works over a PostgreSQL coordinator."""
    import json
    import subprocess
    import sys

    from support.fleet import CoordinatorProc, Receiver
    from support.under_test import ROOT
    from support.waiting import wait

    from runtime.wire import payloads
    from runtime.wire.broker import Mosquitto

    broker = Mosquitto(tmp_path, auth=False).start()
    url = postgres.create_database("integration")
    rx = Receiver([200])
    coords = [CoordinatorProc(tmp_path, f"c{k}", broker.port, url, fleet="test",
                              stale_after_s="2", offline_after_s="4",
                              webhook_url=f'"{rx.url}"').start() for k in (1, 2)]
    pub = _publisher(broker.port)
    try:
        now = time.time()

        def send(device, kind, msg, retain=False):
            pub.publish(payloads.topic("test", device, kind), payloads.encode(kind, msg),
                        qos=1, retain=retain).wait_for_publish(10)

        send("hot1", "state", {"v": 1, "online": True, "boot": "b1", "t": now}, retain=True)
        send("nap1", "state", {"v": 1, "online": True, "boot": "n1", "t": now}, retain=True)
        send("nap1", "state", {"v": 1, "online": False, "boot": "n1", "t": now + 0.1,
                               "reason": "sleep", "asleep": True, "wake_at": now + 3600},
             retain=True)
        for i in range(20):
            send("hot1", "health", {"v": 1, "t": now - 20 + i, "boot": "b1", "temp_c": 84.0,
                                    "passive_trip_c": 85.0, "rung": 2, "rungs": 3})
        for c in coords:
            wait(lambda c=c: {r["device"]: r["status"] for r in c.api("/api/v1/fleet")}
                  == {"hot1": "online", "nap1": "asleep"}, 30, f"{c.name}'s fleet view")
        for c in coords:
            wait(lambda c=c: len(c.api("/api/v1/devices/hot1/health")["health"]) == 20, 30,
                  f"{c.name}'s report history")
            hist = c.api("/api/v1/devices/hot1/history?window_s=600")
            assert max(hist["temp_c"]) == 84.0 and min(hist["rung"]) == 2, (c.name, hist)
            assert 0 < len(hist["t"]) <= 20
        # keep hot1 talking; nap1 stays silent past stale/offline: asleep, no alert anywhere
        deadline = time.time() + 6
        while time.time() < deadline:
            send("hot1", "health", {"v": 1, "t": time.time(), "boot": "b1", "temp_c": 84.0,
                                    "passive_trip_c": 85.0})
            time.sleep(0.5)
        for c in coords:
            view = {r["device"]: r for r in c.api("/api/v1/fleet")}
            assert view["nap1"]["status"] == "asleep" and view["nap1"]["alerts"] == []
            alerts = c.api("/api/v1/alerts")
            assert {(a["device"], a["alert"]) for a in alerts["active"]} == {("hot1", "hot")}
        ls = subprocess.run([sys.executable, "-m", "runtime.cli", "fleet", "ls", "--api",
                             f"http://127.0.0.1:{coords[1].http}", "--token-file",
                             str(coords[1].token_file)], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
        assert ls.returncode == 0, ls.stderr
        assert "hot1" in ls.stdout and "asleep (next wake" in ls.stdout, ls.stdout
        js = subprocess.run([sys.executable, "-m", "runtime.cli", "fleet", "ls", "--json",
                             "--api", f"http://127.0.0.1:{coords[0].http}", "--token-file",
                             str(coords[0].token_file)], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
        assert {r["device"] for r in json.loads(js.stdout)} == {"hot1", "nap1"}
        # the webhook: each coordinator computes alerts from the shared view (see the report)
        wait(lambda: any(b["device"] == "hot1" for b in rx.bodies()), 30, "the hot webhook")
        time.sleep(1.0)
        hot = [b for b in rx.bodies() if (b["device"], b["alert"]) == ("hot1", "hot")]
        assert [b["state"] for b in hot] == ["raised"], hot
    finally:
        pub.loop_stop()
        pub.disconnect()
        for c in coords:
            c.term()
        rx.close()
        broker.stop()


def test_alert_claims_let_one_of_several_coordinators_send_each_transition(store_url):
    """Store.claim on both backends: the same transition from a second coordinator
    is refused; a clear, a new raise, or the same state after the window is sent."""
    from runtime.coordinator.store import Store

    s1, s2 = Store(store_url), Store(store_url)
    try:
        assert s1.claim("d", "alert:hot", "raised", 100.0)
        assert not s2.claim("d", "alert:hot", "raised", 101.0)
        assert s2.claim("d", "alert:slo", "raised", 101.0)  # another code of the device
        assert s2.claim("d", "alert:hot", "cleared", 102.0)
        assert not s1.claim("d", "alert:hot", "cleared", 103.0)
        assert s1.claim("d", "alert:hot", "raised", 104.0)
        assert s2.claim("d", "alert:hot", "raised", 200.0)  # past the window: a new one
    finally:
        s1.close()
        s2.close()


def test_rollout_verdicts_on_two_coordinators_at_once_are_both_kept(store_url):
    """Two canary devices pass probation at about the same time (they were deployed
    together) and their events land on different coordinators. Each coordinator read the
    rollout, marked its device and wrote the whole rollout back: the later write undid the
    earlier one's verdict, the rollout never left `canary`, and at the timeout the lost
    device counted as failed and halted it. Here the second coordinator's verdict is
    committed exactly between the first's read and write."""
    from runtime.coordinator.rollout import Rollouts
    from runtime.coordinator.store import Store

    args = {"name": "m", "version": "2", "url": "http://one/api/v1/bundles/m@2", "size": 1,
            "sha256": "0" * 64, "token": "t"}
    sent = []
    s1, s2 = Store(store_url), Store(store_url)
    two = Rollouts(s2, lambda d, c, a: sent.append(d), lambda b: args, lambda: ["a", "b", "c"])

    class Interleaved:
        """Coordinator one's store: the other coordinator commits right after one's read."""

        def __init__(self, store):
            self.store, self.fired = store, False

        def read(self, sql, args=()):
            rows = self.store.read(sql, args)
            if "FROM rollouts" in sql and not self.fired:
                self.fired = True
                two.on_event("b", {"type": "model_probation_passed", "version": "m@2"})
            return rows

        def __getattr__(self, name):
            return getattr(self.store, name)

    try:
        one = Rollouts(s1, lambda d, c, a: sent.append(d), lambda b: args,
                       lambda: ["a", "b", "c"])
        one.set_group("g", ["a", "b", "c"])
        r = one.start("m@2", "g", 60)
        assert r["canary"] == ["a", "b"]
        one._store = Interleaved(s1)
        one.on_event("a", {"type": "model_probation_passed", "version": "m@2"})
        got = two.get(r["id"])
        assert {d: got["devices"][d]["state"] for d in "ab"} == {"a": "passed", "b": "passed"}
        assert got["state"] == "rolling" and sent.count("c") == 1, (got, sent)
    finally:
        s1.close()
        s2.close()


def test_a_returning_device_is_sent_its_desired_model_once_by_two_coordinators(
        tmp_path, store_url):
    """Every coordinator of a share_group gets every birth (states are not shared). A device
    back with another model than its desired one was sent `deploy` by each; the device
    refuses the second ("busy: another model install is running"), and that rejection failed
    its part of the rollout. Two coordinators on one store, the real admission path."""
    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.service import Coordinator
    from runtime.wire import payloads

    args = {"name": "m", "version": "2", "url": "http://one/api/v1/bundles/m@2", "size": 1,
            "sha256": "0" * 64, "token": "t"}
    sent = []
    coords = [Coordinator(CoordinatorConfig(fleet="f", store=store_url, share_group="g",
                                            client_id=f"c{k}", resend_window_s=0,
                                            bundles_dir=str(tmp_path / f"b{k}")))
              for k in (1, 2)]
    try:
        for c in coords:
            c.rollouts._send = lambda d, cmd, a, c=c: sent.append((c.cfg.client_id, d, cmd))
        coords[0].rollouts._set_desired("d1", {"model": args,
                                              "settings": {"set_rate": {"fps": 2}}})
        now = time.time()
        birth = (payloads.topic("f", "d1", "state"), payloads.encode("state", {
            "v": 1, "online": True, "boot": "b1", "t": now, "model_version": "m@1"}), now)
        for c in coords:
            c._ingest([birth])
        assert sorted(cmd for _, _, cmd in sent) == ["deploy", "set_rate"], sent
        assert len({who for who, _, _ in sent}) == 1
        sent.clear()
        later = (birth[0], payloads.encode("state", {  # a reconnect of the same boot: its
            "v": 1, "online": True, "boot": "b1", "t": now + 5, "model_version": "m@1"}),
            now + 5)  # re-send was made (one a boot: issue 25, bounded work per message)
        for c in coords:
            c._ingest([later])
        assert sent == []
        reboot = (birth[0], payloads.encode("state", {  # the next boot: again, once
            "v": 1, "online": True, "boot": "b2", "t": now + 6, "model_version": "m@1"}),
            now + 6)
        for c in coords:
            c._ingest([reboot])
        assert sorted(cmd for _, _, cmd in sent) == ["deploy", "set_rate"], sent
        assert len({who for who, _, _ in sent}) == 1
    finally:
        for c in coords:
            c.store.close()
            c.shelf.close()


def test_two_coordinators_retention_dropping_the_same_day_partition(postgres):
    """Both coordinators on one PostgreSQL store run retention; the second listed the day
    partitions before the first dropped one, then tried it: 'relation does not exist'
    failed its whole retention pass (every day, as both passes run at the same times)."""
    from runtime.coordinator.store import Inbound, Store

    url = postgres.create_database("dropsame")
    s1, s2 = Store(url), Store(url)
    try:
        s1.ingest([Inbound("d", "result", {
            "v": 1, "stream": "s", "boot": "b", "floor": 1,
            "results": [{"seq": q, "t": time.time(), "boot": "b"} for q in range(1, 11)]})])
        later = time.time() + 3 * 86400
        with s2._d.reader() as db:
            stale = s2._d._partitions(db, "results")  # read before the other one drops
        assert s1.prune_results(max_age_s=86400, now=later)["results_by_age"] == 10
        for name, end in stale:
            if end <= later - 86400:
                with s2._d.transaction() as db:
                    assert s2._d._drop(db, "results", name, end, True) is None
        assert s2.counts() == {} and s2.prune_results(max_age_s=86400, now=later)[
            "results_by_age"] == 0
    finally:
        s1.close()
        s2.close()


def test_dashboard_timeline_buckets_are_the_same_on_both_backends(tmp_path, store_url):
    """The history endpoint's buckets: PostgreSQL's CAST to INTEGER rounds where SQLite's
    truncates, so on PostgreSQL every bucket was shifted by half a width (the first one half
    as wide) and the same data plotted differently by backend."""
    from runtime.coordinator.store import Inbound, Store

    s = Store(store_url)
    try:
        now = 1_000_000.0
        s.ingest([Inbound("d", "health", {"v": 1, "t": now - 600 + i * 0.5, "boot": "b",
                                          "temp_c": float(i)}) for i in range(1200)])
        rows = s.health_series("d", now - 600, now, [("temp_c", "MAX"), ("temp_c", "MIN")], 10)
        assert [(r[1], r[2]) for r in rows] == [(k * 120 + 119.0, k * 120.0) for k in range(10)]
    finally:
        s.close()


def test_metrics_of_an_asleep_device(tmp_path, store_url):
    """/metrics knew online, stale and offline only: a sleeper had no status sample set, the
    fleet's devices-by-status did not add up, and its last health before the sleep was
    exported as a current reading (its temperature an hour ago shown as now)."""
    from support.web import TOKEN, dev, samples, scrape

    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.api import serve
    from runtime.coordinator.service import Coordinator
    from runtime.wire import payloads

    coord = Coordinator(CoordinatorConfig(fleet="f", store=store_url,
                                          bundles_dir=str(tmp_path / "b")))
    server = serve(coord, "127.0.0.1", 0, token=TOKEN, timeout_s=2)
    try:
        now = time.time()
        topic = payloads.topic("f", "nap1", "state")
        coord._ingest([
            (topic, payloads.encode("state", {"v": 1, "online": True, "boot": "b", "t": now}),
             now),
            (payloads.topic("f", "nap1", "health"), payloads.encode("health", {
                "v": 1, "t": now, "boot": "b", "temp_c": 61.0}), now),
            (topic, payloads.encode("state", {"v": 1, "online": False, "boot": "b",
                                              "t": now + 0.1, "asleep": True,
                                              "wake_at": now + 3600}), now)])
        status, text = scrape(server.server_address[1])
        assert status == 200, text
        got = samples(text)
        assert got[dev("edgerun_device_status", "nap1", status="asleep")] == 1
        assert got[("edgerun_fleet_devices", frozenset({"status": "asleep"}.items()))] == 1
        assert dev("edgerun_device_temperature_celsius", "nap1") not in got
    finally:
        server.shutdown()
        coord.store.close()
        coord.shelf.close()


def test_a_busy_refusal_does_not_fail_a_device_of_the_rollout(store_url):
    """A canary asleep (or offline) at the rollout's start gets the broker-held `deploy` at
    its wake, and its birth makes the coordinator re-send its desired model: the device
    refuses that second one as "busy: another model install is running" (installing this
    very model). That refusal failed the device and halted the rollout."""
    from runtime.coordinator.rollout import Rollouts
    from runtime.coordinator.store import Store

    args = {"name": "m", "version": "2", "url": "http://one/api/v1/bundles/m@2", "size": 1,
            "sha256": "0" * 64, "token": "t"}
    s = Store(store_url)
    try:
        ro = Rollouts(s, lambda d, c, a: None, lambda b: args, lambda: ["a", "b"])
        ro.set_group("g", ["a", "b"])
        r = ro.start("m@2", "g", 50)
        ro.on_reply("a", "deploy", {"status": "rejected",
                                    "reason": "busy: another model install is running"})
        ro.on_event("a", {"type": "model_deploy_failed", "reason": "model m@2 deployed",
                          "error": "another model install is running"})  # the same, later
        got = ro.get(r["id"])
        assert got["state"] == "canary" and got["devices"]["a"]["state"] == "sent", got
        ro.on_event("a", {"type": "model_probation_passed", "version": "m@2"})
        assert ro.get(r["id"])["state"] == "rolling"
        ro.on_reply("b", "deploy", {"status": "rejected", "reason": "model m@2 was rolled "
                                    "back on this device: crash"})  # a real refusal still fails
        assert ro.get(r["id"])["devices"]["b"]["state"] == "failed"
    finally:
        s.close()


def test_claim_many_decides_as_claim_does_in_one_transaction(store_url):
    """Store.claim_many (a refresh's alert transitions at once) on both backends: the same
    answers as claim one by one, a key repeated in one call decided after its predecessor."""
    from runtime.coordinator.store import Store

    s1, s2 = Store(store_url), Store(store_url)
    try:
        assert s1.claim_many([]) == []
        assert s1.claim_many([("d", "alert:hot", "raised", 100.0),
                              ("e", "alert:hot", "raised", 100.0)]) == [True, True]
        assert s2.claim_many([("e", "alert:hot", "raised", 101.0),  # another's duplicates
                              ("d", "alert:slo", "raised", 101.0),  # another code
                              ("d", "alert:hot", "raised", 101.0)]) == [False, True, False]
        assert s2.claim_many([("d", "alert:hot", "cleared", 102.0),
                              ("d", "alert:hot", "raised", 103.0),  # back in the same call
                              ("d", "alert:hot", "raised", 103.5)]) == [True, True, False]
        assert s1.claim_many([("d", "alert:hot", "raised", 200.0)]) == [True]  # past the window
        assert not s2.claim("d", "alert:hot", "raised", 201.0)  # claim is claim_many of one
    finally:
        s1.close()
        s2.close()


def test_two_coordinators_claiming_overlapping_batches_send_each_once(store_url):
    """Two stores (two coordinators) claim the same 600 transitions at the same time, in
    batches in opposite orders: every transition is won by exactly one of them (no
    deadlock: rows are taken in key order; none lost, none twice)."""
    import threading

    from runtime.coordinator.store import Store

    items = [(f"d{i:04d}", f"alert:{code}", "raised", 100.0)
             for i in range(200) for code in ("hot", "stale", "slo")]
    stores = [Store(store_url), Store(store_url)]
    won: list[list[tuple]] = [[], []]

    def run(k: int) -> None:
        mine = items if k == 0 else items[::-1]
        for j in range(0, len(mine), 50):
            batch = mine[j:j + 50]
            won[k] += [it for it, w in zip(batch, stores[k].claim_many(batch), strict=True)
                       if w]

    try:
        threads = [threading.Thread(target=run, args=(k,)) for k in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        assert not set(won[0]) & set(won[1])
        assert sorted(won[0] + won[1]) == sorted(items)
    finally:
        for s in stores:
            s.close()
