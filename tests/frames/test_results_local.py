"""Local results (issue 14, item 5): `serve --print`, a rotated JSONL file, snapshots of
non-ok frames with retention, per-label counters in health. Real files, a real `serve`."""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from support.daemon_harness import Serve, last_health, result_seqs, results, write_config
from support.waiting import wait

from models import bundled
from runtime import config as config_mod
from runtime.config.schema import ConfigError
from runtime.frames.frame import Frame
from runtime.frames.results_local import (
    MAX_PENDING_IMAGES,
    QUEUE_GROUPS,
    Jsonl,
    JsonlConfig,
    LocalResults,
    ResultsConfig,
    SnapshotConfig,
    Snapshots,
    print_line,
    snapshot_labels,
)

LABELS = ("ok", "scratch", "dent", "stain", "missing_part")
LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (\S+) (\S+) (\d\.\d{4}) (\S+) "
                  r"rung (\d+)$")


def _result(i: int, label: str = "scratch", t: float | None = None) -> dict:
    return {"t": time.time() - 100 + i if t is None else t, "ref": f"part-{i}", "label": label,
            "score": 0.9, "variant": "fp32", "rung": 2, "latency_ms": 1.0, "e2e_ms": 2.0}


def _frame(i: int) -> Frame:
    return Frame(np.full((24, 32, 3), i % 256, np.uint8), f"part-{i}")


# -- units ----------------------------------------------------------------------------------

def test_print_line_is_one_line_of_six_fields_whatever_the_ref():
    r = {**_result(1, t=1_700_000_001.0), "ref": "a b\nc\td.png"}
    line = print_line(r)
    assert "\n" not in line
    m = LINE.match(line)
    assert m, line
    assert m.groups() == (r"a\x20b\x0ac\x09d.png", "scratch", "0.9000", "fp32", "2")
    assert line.startswith("2023-11-14T22:13:21.000Z ")


def test_config_is_validated():
    cfg = config_mod.from_dict({"results": {"print": True, "jsonl": {"path": "/x/r.jsonl"},
                                            "snapshots": {"dir": "/x/s", "labels": ["dent"]}}})
    assert cfg.results.print and cfg.results.snapshots.labels == ("dent",)
    assert config_mod.from_dict({}).results.enabled is False
    for bad, key in (({"jsonl": {"max_bytes": 10}}, "results.jsonl.max_bytes"),
                     ({"jsonl": {"keep": -1}}, "results.jsonl.keep"),
                     ({"snapshots": {"keep": 0}}, "results.snapshots.keep"),
                     ({"snapshots": {"max_age_h": -1}}, "results.snapshots.max_age_h"),
                     ({"snapshots": {"quality": 0}}, "results.snapshots.quality"),
                     ({"snapshots": {"colour": 1}}, "results.snapshots.colour")):
        with pytest.raises(ConfigError, match=re.escape(key)):
            config_mod.from_dict({"results": bad})


def test_snapshot_labels_default_to_all_but_the_first(caplog):
    want = snapshot_labels(SnapshotConfig(), LABELS)
    assert [x for x in LABELS if want(x)] == list(LABELS[1:])
    want = snapshot_labels(SnapshotConfig(labels=("dent",)), LABELS)
    assert [x for x in LABELS if want(x)] == ["dent"]
    want = snapshot_labels(SnapshotConfig(), ())  # no labels: results carry class indices
    assert not want("0") and want("3")
    snapshot_labels(SnapshotConfig(labels=("dent", "dnet")), LABELS)  # a typo is reported
    assert "['dnet'] not among the model's labels" in caplog.text


def test_jsonl_rotates_by_size_and_keeps_n_files(tmp_path):
    path = tmp_path / "r" / "results.jsonl"
    j = Jsonl(JsonlConfig(path=str(path), max_bytes=4096, keep=2))
    n = 400
    for i in range(0, n, 7):
        j.write([{**_result(k), "seq": k + 1} for k in range(i, min(i + 7, n))])
    j.close()
    files = sorted(p.name for p in path.parent.iterdir())
    assert files == ["results.jsonl", "results.jsonl.1", "results.jsonl.2"]
    seqs = []
    for name in ("results.jsonl.2", "results.jsonl.1", "results.jsonl"):
        f = path.parent / name
        assert 0 < f.stat().st_size <= 4096
        seqs += [json.loads(line)["seq"] for line in f.read_text().splitlines()]
    assert seqs == list(range(seqs[0], n + 1))  # the newest, contiguous, oldest files gone
    j = Jsonl(JsonlConfig(path=str(path), max_bytes=4096, keep=2))  # a restart appends
    j.write([{**_result(n), "seq": n + 1}])
    j.close()
    assert json.loads(path.read_text().splitlines()[-1])["seq"] == n + 1


def test_jsonl_keep_zero_keeps_only_the_current_file(tmp_path):
    path = tmp_path / "results.jsonl"
    j = Jsonl(JsonlConfig(path=str(path), max_bytes=4096, keep=0))
    j.write([{**_result(k), "seq": k} for k in range(200)])
    j.close()
    assert [p.name for p in tmp_path.iterdir()] == ["results.jsonl"]
    assert path.stat().st_size <= 4096


def test_an_unusable_path_is_a_config_error_naming_the_key(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="results.jsonl.path"):
        Jsonl(JsonlConfig(path=str(tmp_path / "file" / "r.jsonl")))
    with pytest.raises(ConfigError, match="results.snapshots.dir"):
        Snapshots(SnapshotConfig(dir=str(tmp_path / "file" / "snaps")))


def test_snapshot_retention_by_count_keeps_the_newest(tmp_path):
    s = Snapshots(SnapshotConfig(dir=str(tmp_path), keep=3))
    for i in range(5):
        s.save(_frame(i).image, {**_result(i, "dent"), "seq": i + 1})
    jpgs = sorted(p.name for p in tmp_path.glob("*.jpg"))
    assert len(jpgs) == 3 and len(list(tmp_path.glob("*.json"))) == 3
    assert [int(n.split("-")[1]) for n in jpgs] == [3, 4, 5]
    side = json.loads((tmp_path / jpgs[-1].replace(".jpg", ".json")).read_text())
    assert side["seq"] == 5 and side["label"] == "dent" and side["ref"] == "part-4"
    img = cv2.imread(str(tmp_path / jpgs[-1]))
    assert img.shape == (24, 32, 3) and abs(int(img.mean()) - 4) <= 2
    assert not list(tmp_path.glob(".*.tmp"))


def test_snapshot_retention_by_age_spares_other_files(tmp_path):
    old = Snapshots(SnapshotConfig(dir=str(tmp_path), max_age_h=0))
    old.save(_frame(1).image, {**_result(1, "stain", t=time.time() - 3 * 3600), "seq": 1})
    old.save(_frame(2).image, {**_result(2, "stain", t=time.time()), "seq": 2})
    (tmp_path / "operator-notes.txt").write_text("mine")
    (tmp_path / "photo.jpg").write_bytes(b"not ours")
    s = Snapshots(SnapshotConfig(dir=str(tmp_path), max_age_h=1))  # a restart applies it
    assert len(s) == 1
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "operator-notes.txt" in names and "photo.jpg" in names
    ours = [n for n in names if n.endswith(".jpg") and n != "photo.jpg"]
    assert [n.split("-")[1] for n in ours] == ["2"]


def test_snapshots_named_before_a_clock_sync_outlive_the_step(tmp_path):
    """A box a week behind names its snapshots by that clock; its NTP sync steps the wall
    clock a week ahead: age expiry (24 h) must not delete them all at once."""
    from runtime.wire.clock import SteadyWall

    week = 7 * 86400.0
    wall, mono = [time.time() - week], [100.0]
    s = Snapshots(SnapshotConfig(dir=str(tmp_path), max_age_h=24, keep=100))
    s._clock = SteadyWall(lambda: wall[0], lambda: mono[0])
    for q in range(3):
        s.save(_frame(q).image, {**_result(q, "stain", t=wall[0] + q), "seq": q})
    wall[0] += week  # the sync
    mono[0] += 1.0
    s.expire()
    assert len(s) == 3
    mono[0] += 25 * 3600  # a day later by the monotonic clock: now they are old
    wall[0] += 25 * 3600
    s.expire()
    assert len(s) == 0


def test_local_results_sinks_together_and_a_failing_one_does_not_stop_the_others(tmp_path):
    out, events = io.StringIO(), []
    cfg = ResultsConfig(print=True, jsonl=JsonlConfig(path=str(tmp_path / "r.jsonl")),
                        snapshots=SnapshotConfig(dir=str(tmp_path / "snaps")))
    lr = LocalResults(cfg, events.append, stdout=out)
    lr.start()
    labels = ("ok", "dent")
    group = [_result(0, "ok"), _result(1, "dent"), _result(2, "ok")]
    lr.submit([_frame(i) for i in range(3)], group, [11, 12, 13], labels)
    wait(lambda: lr.stats()["snapshots_saved"] == 1, 10, "a snapshot")
    (tmp_path / "snaps").rename(tmp_path / "gone")  # the snapshot directory disappears
    lr.submit([_frame(3)], [_result(3, "dent")], [14], labels)
    lr.stop()
    lines = out.getvalue().splitlines()
    assert [LINE.match(x).group(1) for x in lines] == ["part-0", "part-1", "part-2", "part-3"]
    assert [json.loads(x)["seq"] for x in (tmp_path / "r.jsonl").read_text().splitlines()] \
        == [11, 12, 13, 14]
    assert [p.name.split("-")[1] for p in (tmp_path / "gone").glob("*.jpg")] == ["12"]
    assert lr.stats()["snapshots_errors"] == 1
    assert events and events[0]["type"] == "local_results_failed" \
        and events[0]["sink"] == "snapshots"


def test_a_closed_stdout_stops_printing_only(tmp_path):
    class Closed(io.StringIO):
        def write(self, s):
            raise BrokenPipeError(32, "Broken pipe")

    events = []
    lr = LocalResults(ResultsConfig(print=True,
                                    jsonl=JsonlConfig(path=str(tmp_path / "r.jsonl"))),
                      events.append, stdout=Closed())
    lr.start()
    for i in range(3):
        lr.submit([_frame(i)], [_result(i)], [i + 1], LABELS)
    lr.stop()
    assert lr.stats()["print_errors"] == 1  # once: printing is then off
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 3
    assert "closed by its reader" in events[0]["error"]


def test_submit_never_blocks_and_bounds_what_it_holds(tmp_path):
    # The sink thread is not started: nothing is taken off the queue.
    lr = LocalResults(ResultsConfig(snapshots=SnapshotConfig(dir=str(tmp_path))),
                      lambda e: None)
    t0 = time.perf_counter()
    for i in range(QUEUE_GROUPS + 10):
        lr.submit([_frame(i)], [_result(i, "dent")], [i + 1], LABELS)
    assert time.perf_counter() - t0 < 2.0
    st = lr.stats()
    assert st["snapshots_skipped"] == QUEUE_GROUPS + 10 - MAX_PENDING_IMAGES
    assert st["local_dropped"] == 10
    lr.stop()


# -- a real `edgerun serve` -------------------------------------------------------------------

@pytest.mark.skipif(not (bundled() / "manifest.json").exists(), reason="bundled model not built")
def test_serve_prints_writes_jsonl_keeps_snapshots_and_counts_labels(tmp_path):
    jsonl, snaps = tmp_path / "out" / "results.jsonl", tmp_path / "snaps"
    cfg = write_config(tmp_path, tmp_path / "cache",
                       source='kind = "synthetic"\nrate_hz = 60\ndefect_rate = 0.5\nsize = 64',
                       extra=f'[results.jsonl]\npath = "{jsonl}"\nmax_bytes = 4096\nkeep = 2\n'
                             f'[results.snapshots]\ndir = "{snaps}"\nkeep = 5\n')
    stdout = tmp_path / "stdout.txt"
    # `-v` after the subcommand is accepted (it used to be a usage error, exit 2)
    d = Serve(tmp_path, cfg, args=("--print", "-v"), stdout=stdout)
    try:
        wait(lambda: Path(f"{jsonl}.2").exists() and len(result_seqs(d.outbox)) > 80, 120,
             "two JSONL rotations", d)
        wait(lambda: (h := last_health(d.outbox)) is not None
             and h["pipeline"].get("snapshots_saved", 0) > 5, 20, "more than 5 snapshots", d)
    finally:
        assert d.stop() == 0
    stored = results(d.outbox)
    seqs = result_seqs(d.outbox)
    # --print: every stored result, one line each, in order
    lines = stdout.read_text().splitlines()
    parsed = [LINE.match(x) for x in lines]
    assert all(parsed), [x for x, m in zip(lines, parsed, strict=True) if not m][:3]
    assert [(m.group(1), m.group(2), m.group(4), int(m.group(5))) for m in parsed] == [
        (r["ref"], r["label"], r["variant"], r["rung"]) for r in stored]
    assert {m.group(2) for m in parsed} <= set(LABELS) and len({m.group(2) for m in parsed}) > 1
    # JSONL: rotated at 4 KiB, 2 old files kept, the newest lines contiguous up to the last
    assert sorted(p.name for p in jsonl.parent.iterdir()) == [
        "results.jsonl", "results.jsonl.1", "results.jsonl.2"]
    got = []
    for f in (Path(f"{jsonl}.2"), Path(f"{jsonl}.1"), jsonl):
        assert f.stat().st_size <= 4096
        got += [json.loads(x) for x in f.read_text().splitlines()]
    assert [r["seq"] for r in got] == seqs[-len(got):]
    by_seq = dict(zip(seqs, stored, strict=True))
    assert all(by_seq[r["seq"]]["ref"] == r["ref"] and by_seq[r["seq"]]["label"] == r["label"]
               for r in got)
    # snapshots: only non-ok labels, the newest 5, each a decodable JPEG with its result
    jpgs = sorted(snaps.glob("*.jpg"))
    assert len(jpgs) == 5 and len(list(snaps.glob("*.json"))) == 5
    for j in jpgs:
        side = json.loads(j.with_suffix(".json").read_text())
        assert side["label"] != "ok" and side["label"] in LABELS
        assert by_seq[side["seq"]]["ref"] == side["ref"]
        assert cv2.imread(str(j)).shape == (64, 64, 3)
    defects = [s for s, r in zip(seqs, stored, strict=True) if r["label"] != "ok"]
    assert [int(j.name.split("-")[1]) for j in jpgs] == defects[-5:]
    # health: per-label counts (the coordinator admits them: last_health checks the schema)
    h = last_health(d.outbox)
    labels = h["pipeline"]["labels"]
    assert set(labels) <= set(LABELS) and labels.get("ok", 0) > 0
    assert sum(labels.values()) == h["pipeline"]["results"]
    assert h["pipeline"]["local_dropped"] == 0 and h["pipeline"]["snapshots_errors"] == 0


def test_label_counters_are_bounded_and_admitted_by_the_health_schema():
    from runtime.engine.manifest import Manifest, Preprocess
    from runtime.frames.pipeline import MAX_LABELS, OTHER_LABEL, Active, Inferred, Pipeline
    from runtime.wire import payloads

    n = MAX_LABELS + 44
    m = Manifest(Path("."), "many", tuple(f"class{i}" for i in range(n)), Preprocess(),
                 "probabilities", (), "labels", 0)
    p = Pipeline(lambda: None, m, lambda rs: list(range(1, len(rs) + 1)), lambda e: None)
    active = Active(0, "v", None, (1, 3, 8, 8))
    batch = [Inferred(_frame(i), np.eye(n, dtype=np.float32)[i:i + 1], active, 1.0, 1, 0.0,
                      False) for i in range(n)]
    p._store(batch[:10])
    p._store(batch)  # the first 10 labels twice, the rest once
    labels = p.stats()["labels"]
    assert len(labels) == MAX_LABELS + 1 and labels[OTHER_LABEL] == 44
    assert labels["class0"] == 2 and sum(labels.values()) == n + 10
    stats = p.stats()
    stats.pop("slo")  # health moves it to the top level
    payloads.check("health", {"v": 1, "t": time.time(), "boot": "b", "pipeline": stats})
    stats["labels"]["one_too_many"] = 1
    with pytest.raises(payloads.PayloadError, match="labels"):
        payloads.check("health", {"v": 1, "t": time.time(), "boot": "b", "pipeline": stats})


def test_a_symlink_planted_at_a_snapshots_temporary_name_is_not_written_through(tmp_path):
    """A snapshot is written to `.<name>.tmp` and renamed; the temporary name is known in
    advance (time, seq, label), and it was opened with a plain write: a link planted there
    by anyone who can write to the snapshot directory (often a share) had the daemon
    overwrite the file it named. The temporary file is made new (O_EXCL|O_NOFOLLOW), so the
    link is replaced, the target untouched, and the snapshot written."""
    snaps = Snapshots(SnapshotConfig(dir=str(tmp_path / "snaps")))
    image = np.zeros((8, 8, 3), np.uint8)
    r = {"t": time.time(), "seq": 7, "label": "dent", "ref": "a.png"}
    snaps.save(image, r)
    names = sorted(p.name for p in snaps.dir.iterdir())
    for name in names:
        (snaps.dir / name).unlink()
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    for name in names:
        (snaps.dir / f".{name}.tmp").symlink_to(victim)
    snaps.save(image, r)
    assert victim.read_bytes() == b"keep me\n"  # was: the JPEG
    assert sorted(p.name for p in snaps.dir.iterdir()) == names
    assert json.loads((snaps.dir / names[1]).read_text())["seq"] == 7
