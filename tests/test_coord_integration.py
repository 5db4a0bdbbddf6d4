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
    coordinator was started in. It goes next to the default state instead (as the API token)."""
    from runtime.coordinator.config import CoordinatorConfig
    from runtime.coordinator.service import Coordinator

    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HOME", str(home))
    c = Coordinator(CoordinatorConfig(store=store_url))
    try:
        assert c.shelf.dir.is_absolute()
        assert list(cwd.iterdir()) == []
        if "://" in store_url:
            assert c.shelf.dir == home / ".local/state/edgerun/bundles"
        else:
            assert c.shelf.dir == Path(store_url).parent / "bundles"
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
