"""A model per source under one budget (runtime/choice/joint.py, docs/sources.md): `edgerun serve`
with the bundled classifier on one camera and the bundled defect detector (tiled) on another,
results at a coordinator through Mosquitto naming source and model, the box stepping down
under heat; a tiled [model] on one source; tiles counted per inference; config errors."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from support.daemon_harness import ZONE, Serve, fp32_variant, last_health, write_config
from support.waiting import wait

from models import bundled
from runtime.config import (
    ConfigError,
    ModelConfig,
    from_dict,
    load,
)
from runtime.config.source import SourceConfig
from runtime.engine.manifest import configured_model
from runtime.frames.multisource import lanes
from runtime.frames.pipeline import Active, Pipeline
from runtime.frames.sources import open_source

pytestmark = pytest.mark.skipif(
    not ((bundled() / "manifest.json").exists() and (bundled("defects") / "manifest.json")
         .exists()), reason="bundled models not built")

def set_temp(root: Path, celsius: float) -> None:
    """The fake sysfs zone's temperature, replaced atomically."""
    tmp = root / ZONE / ".temp.tmp"
    tmp.write_text(f"{round(celsius * 1000)}\n")
    tmp.replace(root / ZONE / "temp")


TWO = ('[[sources]]\nname = "cls"\nrate_hz = 10\nsize = 64\n'
       '[[sources]]\nname = "det"\nrate_hz = 5\nsize = 192\nseed = 1\n'
       'model = "defects"\ntiling = true\n')


def _two_models(tmp_path: Path, extra: str = "") -> Path:
    cfg = write_config(tmp_path, tmp_path / "cache", source='kind = "synthetic"',
                       latency_ms=100.0, extra=extra)
    # no accuracy floor: each model's automatic one (its best minus 0.02)
    cfg.write_text(cfg.read_text().replace('[source]\nkind = "synthetic"\n', TWO)
                   .replace("accuracy_floor = 0.99\n", ""))
    return cfg


def test_two_sources_on_two_models_reach_the_coordinator_and_share_one_budget(tmp_path):
    """The classifier's camera and the tiled detector's camera, each result naming both; the
    detector's per-inference target counts its 9 tiles; health shows each model's rung and
    the box's; heat steps the box down (one model at a time) and the results follow."""
    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.service import Coordinator
    from runtime.wire.broker import Mosquitto

    broker = Mosquitto(tmp_path).start()
    coord = Coordinator(CoordinatorConfig(fleet="t", broker=broker.coordinator("t"),
                                          store=str(tmp_path / "coord.db")))
    coord.start()
    d = None
    try:
        assert coord.connected.wait(30)
        creds = broker.device("t", "box1")
        cfg = _two_models(tmp_path, f'[telemetry.broker]\nhost = "127.0.0.1"\nport = '
                          f'{broker.port}\nusername = "{creds.username}"\npassword_file = '
                          f'"{creds.password_file}"\n')
        cfg.write_text(cfg.read_text().replace("[daemon]\n",
                                               "[daemon]\nreprofile_temp_delta_c = 1000.0\n"))
        d = Serve(tmp_path, cfg)

        def both() -> bool:
            got = {r["source"] for r in coord.store.results("box1", 0, 100_000)}
            return got == {"cls", "det"}

        wait(both, 120, "results of both sources", d)
        wait(lambda: coord.views["box1"].health.get("pipeline", {}).get("sources", {}).get(
            "det", {}).get("results", 0) >= 3, 30, "health after the detector's results", d)
        stored = coord.store.results("box1", 0, 100_000)
        h = coord.views["box1"].health
        n_top = coord.store.counts()["box1"]
        set_temp(tmp_path / "sysfs", 95.0)  # past the passive (80) and hot (90) trips
        top = {m["model"]: m["rung"] for m in h["models"]}

        def stepped() -> bool:  # the box's rung is decided at once, a model's rung is
            # reported once its new variant is installed (seconds on a loaded box)
            hh = coord.views["box1"].health
            return hh["box"]["rung"] < hh["box"]["rungs"] and any(
                m["rung"] < top[m["model"]] for m in hh["models"])

        wait(stepped, 60, "the box stepping down, a model's rung with it", d)
        wait(lambda: coord.store.counts()["box1"] > n_top + 20, 30, "more results", d)
        hot = coord.views["box1"].health
        events = coord.store.events("box1")
    finally:
        if d is not None:
            assert d.stop() == 0
        coord.stop()
        broker.stop()
    for r in stored:  # each result names its camera and the model that inspected it
        assert (r["source"], r["model"]) in (("cls", "inspection"), ("det", "defects")), r
        assert r["variant"].startswith(r["model"] + "/")
    assert all("counts" in r and "boxes" in r for r in stored if r["source"] == "det")
    assert all("boxes" not in r for r in stored if r["source"] == "cls")
    srcs = h["pipeline"]["sources"]
    assert srcs["det"]["model"] == "defects" and srcs["det"]["tiles"] == 9
    assert srcs["cls"]["model"] == "inspection" and srcs["cls"]["tiles"] == 1
    models = {m["model"]: m for m in h["models"]}
    assert models["inspection"]["sources"] == ["cls"] and models["defects"]["sources"] == [
        "det"]
    # 100 ms per stream, 2 streams: 50 ms per frame; the detector's frame is 9 inferences
    assert models["inspection"]["target_ms"] == pytest.approx(50.0)
    assert models["defects"]["target_ms"] == pytest.approx(50.0 / 9, rel=1e-3)
    assert "cuts each frame into 9 tiles" in models["defects"]["reason"]
    assert models["defects"]["infer_hz"] == pytest.approx(45.0)  # 5 frames/s x 9 tiles
    assert h["box"]["rung"] == h["box"]["rungs"] >= 2  # every model on its top rung
    # hot: the box stepped down, one model's rung at a time (a rung_changed naming it)
    hm = {m["model"]: m for m in hot["models"]}
    assert sum(hm[k]["rung"] < models[k]["rung"] for k in hm) >= 1, hot["models"]
    assert any(e["type"] == "rung_changed" for e in events)


def test_a_tiled_model_on_one_source_plans_per_inference(tmp_path):
    """One source, the detector as [model] with tiling: a 192-pixel frame is 9 tiles of the
    96-pixel input, so each inference must take 1/9 of the frame's target and the box's
    power counts 9 inferences per frame (it used to count one)."""
    cfg = write_config(tmp_path, tmp_path / "cache",
                       source='kind = "synthetic"\nrate_hz = 5\nsize = 192', latency_ms=90.0,
                       extra=f'[model]\npath = "{bundled("defects")}"\ntiling = true\n')
    cfg.write_text(cfg.read_text().replace("accuracy_floor = 0.99\n", ""))
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: (h := last_health(d.outbox)) and h["pipeline"].get("results", 0) >= 5,
             120, "results", d)
        h = last_health(d.outbox)
    finally:
        assert d.stop() == 0
    (m,) = h["models"]
    assert m["model"] == "defects" and m["target_ms"] == pytest.approx(10.0)
    assert "source main cuts each frame into 9 tiles" in h["choice_reason"]
    assert h["pipeline"]["sources"]["main"]["tiles"] == 9
    assert m["infer_hz"] == pytest.approx(45.0)


def test_live_energy_counts_every_tile_as_an_inference(tmp_path):
    """The pipeline's inference count (what live energies divide the CPU time by) is per
    inference: a 9-tile frame is 9 of them, not 1 (energy per inference was 9x too high)."""
    m = configured_model(bundled("defects"), ModelConfig(tiling=True))
    v, backend = fp32_variant(m)
    out: list[dict] = []
    p = Pipeline(lanes([SourceConfig(name="big", rate_hz=20, size=192)],
                       lambda c, i: open_source(c, tmp_path / "state")), m,
                 lambda rs: out.extend(rs) or list(range(len(rs))), lambda e: None)
    p.start(Active(0, v.id, backend.load(v), v.model.input_shape))
    try:
        wait(lambda: len(out) >= 5, 30, "results")
        time.sleep(0.2)
    finally:
        p.stop()
    n, cpu = p.take_infer_cpu()[v.id]
    assert n == 9 * len(out) and cpu > 0
    assert p.lanes[0].tiles == 9 and all(r["model"] == "defects" for r in out)


@pytest.mark.parametrize(("toml", "expected"), [
    ('[[sources]]\nname = "a"\n\n[[sources]]\nname = "b"\nmodel = "defect"\n',
     r":6: key 'sources.\[1\].model': 'defect': no model there .* bundled models: defects, "
     r"inspection"),
    ('[[sources]]\nname = "a"\ntiling = true\n',
     r":3: key 'sources.\[0\].tiling': tiles a model named in this entry"),
    ('[[sources]]\nname = "a"\nmodel = "defects"\ntiling = true\n'
     '[[sources]]\nname = "b"\nmodel = "defects"\n',
     r"key 'sources': a and b both use model 'defects' but tile it differently"),
    ('[[sources]]\nname = "a"\nmodel = "defects"\ntile_overlap = 0.9\n',
     r":4: key 'sources.\[0\].tile_overlap': must be within 0..0.75"),
    # hostile strings: a control character, a path longer than PATH_MAX, a name longer
    # than a file name may be (it used to end in an OSError traceback)
    ('[[sources]]\nname = "a"\nmodel = "defects\\n"\n',
     r":3: key 'sources.\[0\].model': must be .* no control characters, got 'defects\\n'"),
    ('[[sources]]\nname = "a"\nmodel = "' + "x" * 5000 + '"\n',
     r":3: key 'sources.\[0\].model': must be a model's name or path of at most 4096"),
    ('[[sources]]\nname = "a"\nmodel = "' + "x" * 300 + '"\n',
     r":3: key 'sources.\[0\].model': 'x+': cannot look there: File name too long"),
])
def test_bad_source_models_are_refused_with_file_line_and_key(tmp_path, toml, expected):
    f = tmp_path / "e.toml"
    f.write_text(toml)
    with pytest.raises(ConfigError, match=expected):
        load(f)


def test_a_source_may_name_a_model_by_path_or_bundled_name(tmp_path):
    cfg = from_dict({"sources": [
        {"name": "a", "model": "defects", "tiling": True, "tile_size": 128},
        {"name": "b", "model": str(bundled("inspection") / "fp32.onnx")}]})
    assert cfg.sources[0].model == "defects" and cfg.sources[0].tile_size == 128


def test_choose_model_is_refused_when_every_source_has_its_own_model(tmp_path):
    """OTA swaps the [model] section's model; with no source using it, a choose_model or
    deploy would change nothing: it is refused, saying why."""
    from types import SimpleNamespace

    from runtime.device import commands
    from runtime.device.rung_switch import RungSwitch
    from runtime.device.source_plan import SourcePlan
    from runtime.wire.commands import Command

    cfg = from_dict({"daemon": {"state_dir": str(tmp_path / "state")}, "sources": [
        {"name": "a", "model": "defects"}, {"name": "b", "model": "defects"}]})
    # what the handlers read of what is served: the sources' plan and the rung switch
    serving = SimpleNamespace(plan=SourcePlan(lambda: cfg, tmp_path / "state"),
                              switch=RungSwitch(lambda *a, **kw: None))
    deploy = {"name": "other", "version": "2", "url": "http://127.0.0.1:9/b",
              "size": 1, "sha256": "0" * 64, "token": ""}  # well-formed: past the args gate
    for name, args in (("choose_model", {"name": "other"}), ("deploy", deploy)):
        with pytest.raises(ValueError, match="every \\[\\[sources\\]\\] entry names its own "
                                             "model, which cannot be swapped over the air"):
            commands.handle(serving, None, Command("c" * 8, name, args))


def test_a_cameras_tiles_are_learnt_from_its_frames_and_re_planned(tmp_path):
    """A folder's frame size is known only from its files: planned as one tile, a 192-pixel
    image is 9 tiles of the detector's input, so the targets and ladders are re-planned."""
    import cv2

    from models.synthetic import samples

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for i, s in enumerate(samples(seed=3, count=4, size=192)):
        cv2.imwrite(str(inbox / f"p{i}.png"), s.image)
    old = time.time() - 10
    for f in inbox.iterdir():  # settled files (the folder source waits 1 s otherwise)
        os.utime(f, (old, old))
    cfg = write_config(tmp_path, tmp_path / "cache",
                       source=f'kind = "folder"\npath = "{inbox}"\nwatch = true',
                       latency_ms=90.0,
                       extra=f'[model]\npath = "{bundled("defects")}"\ntiling = true\n')
    cfg.write_text(cfg.read_text().replace("accuracy_floor = 0.99\n", ""))
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: "re-planned" in d.text(), 60, "the re-planning", d)
        wait(lambda: (h := last_health(d.outbox)) and h["models"][0]["target_ms"] < 90, 10,
             "health after the re-planning", d)
        h = last_health(d.outbox)
    finally:
        assert d.stop() == 0
    assert "source main: 9 tiles per frame, planned 1" in d.text()
    assert h["models"][0]["target_ms"] == pytest.approx(10.0)
    assert "source main cuts each frame into 9 tiles" in h["choice_reason"]


def test_probation_compares_only_the_frames_of_the_model_it_swapped(tmp_path):
    """OTA swaps the [model]'s model and compares a sample of its frames with the old one
    (the shadow). A source on its own model (here the detector) is not what was swapped:
    its frames must not be compared with the old classifier (they disagreed on every
    frame, dragging the new model's agreement down until probation rolled it back)."""
    cls = configured_model(bundled("inspection"), ModelConfig())
    det = configured_model(bundled("defects"), ModelConfig())
    vc, bc = fp32_variant(cls)
    vd, bd = fp32_variant(det)
    out: list[dict] = []
    srcs = [SourceConfig(kind="synthetic", name="cls", rate_hz=50, size=64),
            SourceConfig(kind="synthetic", name="det", rate_hz=50, size=96, seed=1,
                         model="defects")]
    p = Pipeline(lanes(srcs, lambda c, i: open_source(c, tmp_path / "state"),
                       lambda s: s.model), cls,
                 lambda rs: out.extend(rs) or list(range(len(rs))), lambda e: None)
    p.shadow.begin(Active(0, vc.id, bc.load(vc), vc.model.input_shape, cls), 1)  # "the old"
    p.start(Active(0, vc.id, bc.load(vc), vc.model.input_shape, cls),
            {"defects": Active(0, vd.id, bd.load(vd), vd.model.input_shape, det,
                               det.preprocess.apply, key="defects")})
    try:
        wait(lambda: sum(r["source"] == "det" for r in out) >= 20
             and sum(r["source"] == "cls" for r in out) >= 20, 30, "results of both")
    finally:
        p.stop()
    n_cls = sum(r["source"] == "cls" for r in out)
    assert 0 < p.shadow.counts[0] <= n_cls
    assert p.shadow.counts[1] == p.shadow.counts[0]  # the same classifier agrees with itself


def test_one_model_spelt_three_ways_is_one_model(tmp_path):
    """A bundled name, its path and a symlink to it are one model: one key, so one
    measurement, one session and one ladder (they were three, each measured and loaded, their
    identical variant ids mixing their live energies)."""
    from runtime.device.source_plan import SourcePlan

    link = tmp_path / "mine"
    link.symlink_to(bundled("defects"))
    cfg = from_dict({"daemon": {"state_dir": str(tmp_path / "state")}, "sources": [
        {"name": "a", "model": "defects"}, {"name": "b", "model": str(bundled("defects"))},
        {"name": "c", "model": str(link)}, {"name": "d", "model": "inspection"},
        {"name": "e", "model": str(bundled("defects") / "fp32.onnx")}]})
    plan = SourcePlan(lambda: cfg, tmp_path / "state")
    keys = [plan.model_key(s) for s in cfg.sources]
    assert keys[:3] == ["defects"] * 3
    assert keys[3] == ""  # the [model]'s own (the bundled classifier): its session
    assert keys[4] == str(bundled("defects") / "fp32.onnx")  # a bare .onnx is another model
    assert {lane.model for lane in plan.lanes()} == {"", "defects", keys[4]}


def test_a_corrupt_source_model_costs_its_source_not_the_daemon(tmp_path):
    """A source's own model that cannot be loaded at start (here a corrupt .onnx) costs
    that source: an error line naming source and model, a critical event, its health
    state failed; the daemon serves the other sources (it used to exit at start-up)."""
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\x08\x07not an onnx model" * 10)
    cfg = _two_models(tmp_path)
    cfg.write_text(cfg.read_text().replace('model = "defects"\ntiling = true\n',
                                           f'model = "{bad}"\n'))
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: (h := last_health(d.outbox)) and h["pipeline"]["sources"]["cls"].get(
            "results", 0) >= 5, 60, "results of the other source", d)
        h = last_health(d.outbox)
    finally:
        assert d.stop() == 0
    assert f"source det not inspected: model '{bad}'" in d.text()
    assert h["pipeline"]["sources"]["det"]["state"] == "failed"
    assert h["pipeline"]["sources"]["det"].get("results", 0) == 0
    assert [m["key"] for m in h["models"]] == [""]  # the broken one is in no budget
    assert h["models"][0]["sources"] == ["cls"]
    assert h["models"][0]["target_ms"] == pytest.approx(100.0)  # one stream inspected


def test_two_models_with_the_same_variant_ids_keep_their_own_live_energies(tmp_path):
    """Two different models in files of the same name (every YOLO export is best.onnx) have
    the same manifest name, so the same variant ids. Their live energies (CPU time per
    inference on this traffic) must stay each its own: they were kept by variant id, so
    the detector's and the classifier's were one figure, averaged and billed to both."""
    import shutil

    for d, src in (("det", bundled("defects") / "fp32.onnx"),
                   # small: the bundled classifier's cheapest (its 96 px mid costs half the
                   # detector's a frame; the check below wants the two far apart)
                   ("cls", bundled("inspection") / "small-fp32.onnx")):
        (tmp_path / d).mkdir()
        shutil.copy(src, tmp_path / d / "best.onnx")
    cfg = write_config(tmp_path, tmp_path / "cache", source='kind = "synthetic"',
                       latency_ms=200.0)
    cfg.write_text(cfg.read_text().replace('[source]\nkind = "synthetic"\n', (
        f'[[sources]]\nname = "a"\nrate_hz = 40\nsize = 96\nmodel = "{tmp_path}/det/best.onnx"\n'
        f'[[sources]]\nname = "b"\nrate_hz = 40\nsize = 96\nmodel = "{tmp_path}/cls/best.onnx"\n'
        '[[sources]]\nname = "c"\nrate_hz = 1\nsize = 64\n'))
        .replace("accuracy_floor = 0.99\n", ""))
    d = Serve(tmp_path, cfg)
    try:
        # 150 results each: three live updates (LIVE_MIN_INFERENCES 50) of each model; one
        # shared figure shows at the first (400, 10 s at 40 Hz, showed nothing more)
        wait(lambda: (h := last_health(d.outbox)) and min(
            h["pipeline"]["sources"][s].get("results", 0) for s in "ab") >= 150, 90,
            "live energies of both", d)
        h = last_health(d.outbox)
    finally:
        assert d.stop() == 0
    m = {x["sources"][0]: x for x in h["models"] if x["key"]}
    assert m["a"]["model"] == m["b"]["model"] == "best"
    assert m["a"]["choice"] == m["b"]["choice"]  # the same variant id
    # a bare .onnx: accuracy unknown, said as null (its rung takes it as 1.0)
    assert m["a"]["accuracy"] is None and "accuracy unknown" in m["a"]["reason"]
    assert h["models"][0]["accuracy"] == pytest.approx(h["accuracy"])  # the bundled one's
    # the detector costs several times the classifier per inference, live as profiled
    assert m["a"]["rung_energy_mj"] > 2 * m["b"]["rung_energy_mj"], m


def test_64_sources_on_64_models_plan_in_milliseconds_not_seconds(tmp_path):
    """The budget asks for every source's model key many times a tick (targets per model,
    loads, health): each key resolves paths, so with 64 sources on 64 models a health
    message took seconds and a SIGTERM waited for minutes of re-planning. Keys are
    remembered: what health does (65 x the streams) stays well under a second."""
    import shutil

    from runtime.device.source_plan import SourcePlan

    srcs = []
    for i in range(64):
        (tmp_path / f"m{i}").mkdir()
        shutil.copy(bundled("inspection") / "fp32.onnx", tmp_path / f"m{i}" / "model.onnx")
        srcs.append({"name": f"cam{i}", "rate_hz": 1,
                     "model": str(tmp_path / f"m{i}" / "model.onnx")})
    cfg = from_dict({"daemon": {"state_dir": str(tmp_path / "state")}, "sources": srcs})
    plan = SourcePlan(lambda: cfg, tmp_path / "state")
    t0 = time.perf_counter()
    for _ in range(65):
        streams = plan.streams()
    took = time.perf_counter() - t0
    assert len({s.model for s in streams}) == 64
    assert took < 2.0, f"65 x the streams of 64 sources took {took:.2f} s"


def test_health_of_64_sources_on_64_models_fits_what_a_coordinator_admits():
    """65 models (the [model] and 64 sources' own) with paths as a factory names them and long
    reasons (a tiled detector's target explained, the box's share) and 64 sources' health:
    under the 64 KiB a coordinator admits (each reason took up to 4000 characters)."""
    import json

    from runtime.device.model_ladder import share_reasons
    from runtime.wire import payloads

    models = [{"key": "" if i == 0 else f"/srv/edgerun/models/line-3/station-{i:02d}/"
               "yolov8n-scratches-v2/best.onnx",
               "model": "best", "choice": "best/int8@onnxruntime:CPU/t1,opt=all", "rung": 2,
               "rungs": 3, "accuracy": None, "rung_energy_mj": 1.2345, "target_ms": 1.7361,
               "infer_hz": 9.0, "power_w": 0.0111, "sources": [f"camera-{i:02d}"] if i else [],
               "reason": "best/int8@onnxruntime:CPU/t1,opt=all: lowest energy ... " * 18}
              for i in range(65)]
    sources = {f"camera-{i:02d}": {"state": "running", "rate_hz": 1.0, "e2e_p95_ms": 12.345,
                                   "backlog": 0, "model": "best", "tiles": 9,
                                   "variant": "best/int8@onnxruntime:CPU/t1,opt=all",
                                   "frames": 123456, "results": 123456, "dropped_stale": 12,
                                   "skipped_rate": 1234, "source_errors": 0}
               for i in range(64)}
    body = json.dumps({"models": share_reasons(models), "pipeline": {"sources": sources}})
    assert all(len(m["reason"]) <= 4096 for m in models)
    assert len(body.encode()) + 8_000 < payloads.MAX_BYTES["health"], len(body)  # + the rest
    assert models[1]["reason"].startswith("best/int8@onnxruntime:CPU/t1,opt=all: lowest")


def test_a_refused_sources_share_of_the_rate_cap_goes_to_the_others(tmp_path):
    """Two 10 Hz cameras, the second's own model failed at start: a combined cap is all
    the first's (it got half, the refused source's half lost)."""
    from runtime.device.source_plan import SourcePlan

    cfg = from_dict({"daemon": {"state_dir": str(tmp_path / "state")}, "sources": [
        {"name": "a", "rate_hz": 10}, {"name": "b", "rate_hz": 10, "model": "defects"}]})
    plan = SourcePlan(lambda: cfg, tmp_path / "state")
    assert [lane.share for lane in plan.lanes()] == [0.5, 0.5]
    plan.failed["defects"] = "model 'defects' cannot be used: ModelError: corrupt"
    a, b = plan.lanes()
    assert (a.share, b.share) == (1.0, 0.0) and b.refused.startswith("model 'defects'")
    assert [s.name for s in plan.streams()] == ["a"]


def test_a_new_model_measurement_keeps_the_other_models_live_energies(tmp_path):
    """Installing a new measurement of the [model]'s model (an OTA swap, a re-profile when
    the temperature moved) starts that model's live energies afresh; the sources' own models
    did not change, so theirs (learnt from live traffic) are kept (they were all cleared)."""
    from runtime.device.daemon import Daemon

    d = Daemon(load(_two_models(tmp_path)))
    d.start()
    try:
        def learnt() -> bool:
            d.control_tick()
            return any("\x00" in k for k in d.serving.energy.live) and any(
                "\x00" not in k for k in d.serving.energy.live)

        wait(learnt, 60, "live energies of both models")
        s = d.serving
        theirs = {k: v for k, v in s.energy.live.items() if "\x00" in k}
        s.install(s.measure(Path(s.box.model.manifest.root)))
        assert {k: v for k, v in s.energy.live.items() if "\x00" in k} == theirs
        assert not any("\x00" not in k for k in s.energy.live)  # the [model]'s: afresh
    finally:
        d.stop()
