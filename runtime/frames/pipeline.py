"""capture -> preprocess -> infer+store, on named threads with bounded queues.

- `capture` (runtime/frames/capture.py) reads (and decodes) frames from the source and crops
  its region of interest (runtime/frames/roi.py). Live sources drop the oldest queued frame
  when the pipeline is behind (counted); folder and trigger sources block instead (never
  dropped). A failing source is re-opened with backoff and reported; the other threads keep
  running. With several sources
  (runtime/frames/multisource.py) each has its own capture thread and its own lane in the raw queue,
  served in turn; one preprocess and one infer thread serve them all.
- `preprocess` makes the input tensor for the active variant's shape (CPU or OpenCL,
  whichever measured cheaper). Decoding and preprocessing in separate threads is what lets
  the pipeline beat a sequential loop: OpenCV, numpy and the engines release the GIL. (Making
  the tensor on the capture thread saves a thread handoff, ~12 % of the CPU a frame on a
  loaded 2-core box, but measured 0.83-0.93x a hand loop's throughput against 0.96-1.08x
  split, docs/benchmarks.md: the single decode+preprocess thread was the limit.)
- `infer` runs the active session, maps outputs to label and score and appends the results
  to the outbox with adaptive group commit: while more frames are on their way (queued,
  being preprocessed, or a backlog being read) it keeps inferring and stores the group in one
  transaction (up to 64, or after GROUP_WAIT_S); with nothing on its way it stores at once.
  Only after the commit is the source told the frames are done.

Idle fast path: a frame the capture thread had to wait for (so nothing is queued or in flight)
is preprocessed, inferred and stored by the capture thread itself, under the same `_work`
lock the infer thread takes: two thread wake-ups fewer, which is most of the latency on a
sub-millisecond model. A frame that was ready at once (a backlog) takes the queues, so the
stages overlap.

Switching variant: the caller loads and warms the new session first, then `switch()` hands it
over; the infer thread swaps between two frames and closes the old one. No frame waits for a
model load. Each result records the variant and rung that produced it.

Every stage's thread CPU time (capture, decode, crop, preprocess, infer, postprocess, persist)
is counted on whichever thread ran it, one clock read per stage boundary; `take_stage_cpu()`
hands the counts to the box's energy per frame (power/box_energy.py).

`alive()` feeds the systemd watchdog: the infer loop's heartbeat is fresh and no frame has
been in inference or store for too long, on either path.
"""

from __future__ import annotations

import collections
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from runtime.engine.backends.base import Session
from runtime.engine.manifest import Manifest, frame_result
from runtime.engine.sanity import Watch
from runtime.engine.tiling import infer_tiles, tiled
from runtime.frames.badframes import BadFrames
from runtime.frames.capture import Capture
from runtime.frames.done_marks import DoneMarks
from runtime.frames.frame import Frame, Source
from runtime.frames.model_counts import ModelCounts, ModelId, model_id
from runtime.frames.multisource import FairQueue, Lane
from runtime.frames.results_local import LocalResults
from runtime.frames.shadow import ShadowSample
from runtime.frames.slo_window import SloWindow
from runtime.frames.stage_cpu import StageCpu
from runtime.wire.events import EventType
from runtime.wire.quarantine import RateLimitedLog

log = logging.getLogger("edgerun.pipeline")

MAX_LABELS = 256  # per-label counters in health; further labels are counted together
OTHER_LABEL = "_other"


@dataclass
class Active:
    """The variant the infer thread runs."""

    rung: int
    variant_id: str
    session: Session
    input_shape: tuple[int, ...]
    # The model it belongs to, and that model's preprocessing: a model swap hands over a
    # session with its own, so no frame is ever preprocessed or labelled for another model.
    # None: the pipeline's (set_manifest).
    manifest: Manifest | None = None
    pre: Callable[[Any, tuple[int, ...]], Any] | None = None
    # "" for the [model] section's model; else the key of a source's own model
    # ([[sources]] model, runtime/choice/joint.py): the lanes of that key run on it
    key: str = ""


def live_id(key: str, variant_id: str) -> str:
    """What a variant's inferences are counted under (`take_infer_cpu`, the daemon's live
    energies): its id for the [model]'s model; for a source's own model its key too, as two
    models may have the same variant ids (two files named best.onnx)."""
    return f"{key}\x00{variant_id}" if key else variant_id


class Inferred(NamedTuple):
    """A frame through its model, on its way to `_store`."""

    frame: Frame
    out: Any  # the session's outputs (a tiled frame's, merged)
    active: Active  # the variant it ran on
    ms: float  # inference wall time
    tiles: int  # inferences it took
    spent: float  # inference CPU s
    alone: bool  # on the inline path: no other stage ran beside it (Tally.alone_ms)


def _join(threads: list[threading.Thread], lanes: list[Lane]) -> None:
    """Join the pipeline's threads: 2 s each, then as long as the sources' own timeouts for
    any still inside an open or read (FFmpeg, pylon), which comes back only when that call
    times out. Left there, it came back into a finalizing interpreter as `serve` exited:
    SIGSEGV (exit -11, 1 in 6 stops with a black-holed camera URL;
    tests/frames/test_capture_stop.py)."""
    for t in threads:
        t.join(2)
    until = time.monotonic() + max((lane.io_timeout_s for lane in lanes), default=0.0) + 1.0
    for t in threads:
        if t.is_alive():
            t.join(max(0.0, until - time.monotonic()))


class Pipeline:
    """See module docstring."""

    def __init__(self, open_source: Callable[[], Source] | list[Lane], manifest: Manifest,
                 sink: Callable[[list[dict[str, Any]]], list[int]],
                 on_event: Callable[[dict], None], queue_size: int = 4,
                 preprocess: Callable[[Any, tuple[int, ...]], Any] | None = None,
                 local: LocalResults | None = None,
                 durable: Callable[[], int] | None = None):
        # durable: the highest seq the sink holds on disk (the outbox's last_seq; DoneMarks)
        # one callable: a single source named "main"; a list of lanes: several sources
        self.lanes = [Lane("main", open_source)] if callable(open_source) else list(open_source)
        self._lane = {lane.name: lane for lane in self.lanes}
        self._manifest = manifest
        # (frame, input shape) -> tensor; the daemon passes a PreprocessChooser
        self._pre = tiled(preprocess or manifest.preprocess.apply, manifest)
        self._tilers: dict[int, tuple[Any, Any, Callable]] = {}  # see _pre_of
        self._sink = sink
        self._local = local  # print/JSONL/snapshots, after the outbox commit
        self._done = DoneMarks(durable)  # file frames done once their results are on disk
        self._event = on_event
        self._raw = FairQueue([lane.name for lane in self.lanes], queue_size)  # decoded frames
        self._frames: queue.Queue = queue.Queue(maxsize=queue_size)  # (frame, tensor, shape)
        self.preprocessing = False
        self._active: Active | None = None
        self._next: Active | None = None
        # sources with their own model: key -> running / pending Active (see Active.key)
        self._extra: dict[str, Active] = {}
        self._extra_next: dict[str, Active] = {}
        self._key = {lane.name: lane.model for lane in self.lanes}
        self._lock = threading.Lock()  # guards _active/_next
        self._work = threading.Lock()  # held while a frame is inferred and stored
        self._stop_capture = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.heartbeat = time.monotonic()
        self.busy_since: float | None = None  # set from taking a frame until its result is stored
        # Set by the control loop: math.inf = no cap; 0 = paused (minimum duty of 0 Hz).
        self.rate_cap_hz = math.inf
        self._infer_cpu: dict[str, tuple[int, float]] = {}  # variant -> (n, thread CPU s)
        # CPU seconds per stage of the frames stored since the last `take_stage_cpu` (the box's
        # energy per frame, power/box_energy.py)
        self._stage_cpu = StageCpu()
        self.counters: collections.Counter = collections.Counter()
        self.labels: collections.Counter = collections.Counter()  # results per label
        self.bad = BadFrames(on_event)  # refused frames by kind; rate-limited frame_bad events
        self.sight = Watch()  # each model's first frames judged: a model_blind event
        self._slo = SloWindow()  # rate, latency percentiles and SLO compliance in health
        # the same per model (results, errors, ms per inference): what probation judges a
        # swapped model by, not the box's totals (runtime/frames/model_counts.py)
        self.models = ModelCounts()
        self.shadow = ShadowSample()  # probation of a new model (runtime/device/ota.py)
        self._in_backlog = False  # the last frame read was ready at once (see _infer)
        self._store_log = RateLimitedLog(log)
        self._store_failing = False  # between a failed store and the next that works

    # -- control (any thread) -------------------------------------------------------------

    def start(self, active: Active, extra: dict[str, Active] | None = None) -> None:
        """Start the threads running `active` (and `extra`: the sessions of the models that
        sources name in `[[sources]] model`, by key)."""
        self._active = active
        self._extra = dict(extra or {})
        missing = {lane.model for lane in self.lanes if lane.model} - set(self._extra)
        if missing:
            raise ValueError(f"no session for the model(s) {sorted(missing)} of the sources")
        one = len(self.lanes) == 1
        work: list[tuple[str, Callable[[], None]]] = [
            ("capture" if one else f"capture-{lane.name}", Capture(
                lane, len(self.lanes), stop=self._stop_capture, cap_hz=lambda: self.rate_cap_hz,
                bad=self.bad, counters=self.counters, cpu=self._stage_cpu, event=self._event,
                hand_over=self._hand_over, idle=self._nothing_ready).run)
            for lane in self.lanes]
        for name, fn in (*work, ("preprocess", self._preprocess), ("infer", self._infer)):
            t = threading.Thread(target=fn, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    @property
    def source(self) -> Source | None:
        """The first (with one source: the) source, while it is open."""
        return self.lanes[0].source

    @property
    def active(self) -> Active | None:
        """The variant running now (the pending one once it has been swapped in)."""
        return self._active

    @property
    def target(self) -> Active | None:
        """The variant the pipeline is running or about to run (a pending switch included)."""
        with self._lock:
            return self._next or self._active

    def switch(self, new: Active) -> None:
        """Hand over an already loaded and warmed session; swapped between frames. One with a
        `key` replaces that source model's session (runtime/choice/joint.py), else the [model]'s."""
        with self._lock:
            if new.key:
                if (pending := self._extra_next.get(new.key)) is not None:
                    pending.session.close()
                self._extra_next[new.key] = new
                return
            if self._next is not None:  # superseded before it was swapped in
                self._next.session.close()
            self._next = new

    def begin_shadow(self, old: Active | None, every: int = 5,
                     forms: frozenset[str] = frozenset()) -> None:
        """A probation starts against `old` (runtime/frames/shadow.py `begin`), or ends (None),
        between two frames: the old sessions held before are closed, but for `old` and the
        running or pending session."""
        with self._work, self._lock:  # not while the infer thread is using them
            for held in self.shadow.sessions():
                if held is not old and held is not self._active and held is not self._next:
                    held.session.close()
            self.shadow.begin(old, every, forms)

    def add_shadow(self, old: Active) -> bool:
        """Another old session for the probation's shadow sample, between two frames
        (shadow.py `add`); False when none takes it (the caller closes it)."""
        with self._work, self._lock:
            return self.shadow.add(old)

    def target_of(self, key: str) -> Active | None:
        """The variant a model (by key, "" = the [model]'s) is running or about to run."""
        if not key:
            return self.target
        with self._lock:
            return self._extra_next.get(key) or self._extra.get(key)

    def _for(self, source: str) -> Active | None:
        """The Active a frame of `source` is to be preprocessed for (a pending one first)."""
        key = self._key.get(source, "")
        if not key:
            return self._next or self._active
        return self._extra_next.get(key) or self._extra.get(key)

    def _pre_of(self, a: Active) -> Callable[[Any, tuple[int, ...]], Any]:
        """The preprocessing of `a`'s model, tiled when that model tiles (one wrapper per
        model, so frames in flight are not preprocessed again at every rung change)."""
        if a.pre is None:
            return self._pre
        got = self._tilers.get(id(a.pre))
        if got is None or got[0] is not a.pre or got[1] is not a.manifest:
            got = (a.pre, a.manifest, tiled(a.pre, a.manifest or self._manifest))
            self._tilers = {**self._tilers, id(a.pre): got}  # replaced whole: thread-safe reads
        return got[2]

    def exclusive(self) -> threading.Lock:
        """The lock held while a frame is inferred and stored: whoever holds it runs between
        two frames, with no inference of the pipeline beside it (background profiling
        measures under it, in short chunks)."""
        return self._work

    def set_manifest(self, manifest: Manifest,
                     preprocess: Callable[[Any, tuple[int, ...]], Any] | None = None) -> None:
        """Use another model's pre/post-processing (call `switch` with its session next)."""
        self._manifest = manifest
        self._pre = tiled(preprocess or manifest.preprocess.apply, manifest)

    def stop(self, drain_timeout_s: float = 10.0) -> None:
        """Stop capturing, let queued frames finish (their results are stored), stop."""
        self._stop_capture.set()
        deadline = time.monotonic() + drain_timeout_s
        while time.monotonic() < deadline and (not self._raw.empty() or self.preprocessing
                                               or not self._frames.empty() or self.busy_since):
            time.sleep(0.02)
        self._stop.set()
        _join(self._threads, self.lanes)
        with self._lock:
            for a in {id(x): x for x in (self._active, self._next, *self.shadow.sessions(),
                                         *self._extra.values(), *self._extra_next.values())
                      if x is not None}.values():
                a.session.close()
        for lane in self.lanes:
            if lane.source is not None:
                lane.source.close()

    def alive(self, max_age_s: float) -> bool:
        """The infer loop is turning and no frame has been in inference/store for longer
        than `max_age_s` (covers a hang on either the queued or the inline path)."""
        now = time.monotonic()
        busy = self.busy_since
        return now - self.heartbeat < max_age_s and (busy is None or now - busy < max_age_s)

    def take_infer_cpu(self) -> dict[str, tuple[int, float]]:
        """(inferences, CPU seconds of the threads that ran them) per variant (by `live_id`)
        since the last call. The engines' own pool threads are not in it (see power.cputime)."""
        with self._work:
            out, self._infer_cpu = self._infer_cpu, {}
        return out

    def take_stage_cpu(self) -> tuple[int, dict[str, float | None]]:
        """(results stored, CPU seconds per stage) since the last call (the stages:
        runtime/frames/stage_cpu.py)."""
        return self._stage_cpu.take()

    def _cpu(self, stage: str, seconds: float) -> None:
        """Add CPU seconds to a stage (any thread)."""
        self._stage_cpu.add(stage, seconds)

    def set_slo(self, target_ms: float, end_to_end: bool) -> None:
        """The latency the SLO compliance is judged on: each frame's capture to durable result
        (`end_to_end`, the [constraints] end_to_end_ms target) or its inference."""
        self._slo.set(target_ms, end_to_end)

    def rate_hz(self) -> float:
        """Results per second over the last 30 s."""
        return self._slo.rate_hz()

    def stats(self) -> dict[str, Any]:
        """Counters, recent rate and latency percentiles, SLO compliance, per source."""
        return {
            **dict(self.counters),
            **(self._local.stats() if self._local else {}),
            "labels": dict(self.labels),
            "frames_bad": self.bad.counts(),
            **self._slo.stats(),  # rate_hz, latency_ms, slo
            # per source: state, rate, capture-to-result p95, frames waiting, counters
            "sources": {lane.name: {**lane.stats(self._raw.qsize(lane.name)),
                                    **self._model_of(lane)} for lane in self.lanes},
        }

    def _model_of(self, lane: Lane) -> dict[str, Any]:
        """A source's model, the variant it runs and its tiles per frame (for health)."""
        if lane.refused:  # its model failed at start: it runs none
            return {"model": "", "variant": "", "tiles": 0}
        a = self._extra.get(lane.model) if lane.model else self._active
        m = (a.manifest if a is not None else None) or self._manifest
        return {"model": m.name, "variant": a.variant_id if a else "", "tiles": lane.tiles}

    # -- threads -----------------------------------------------------------------------------

    def _hand_over(self, lane: Lane, frame: Frame, waited: bool) -> None:
        """A frame from a capture thread on to the next stage. One that had to be waited for
        arrived at an idle pipeline: run it inline. One that was ready at once is part of a
        backlog: queue it so stages overlap. A stream read by its own reader thread has no
        backlog (the reader keeps only the newest frame, decoding beside the pipeline):
        inline whenever the pipeline is idle, two thread hand-offs fewer in the frame's age.
        (Not a live synthetic camera at full rate: it would lose the stages' overlap.)"""
        # (a live source's next frame comes at the camera's pace: never waited for)
        self._in_backlog = not waited and not lane.source.live
        # (latest wins on a live source: its own oldest waiting frame is dropped)
        if not ((waited or frame.decoded_apart) and self._inline(frame)) and self._raw.put(
                lane.name, frame, lane.source.live, self._stop):
            self.counters["dropped_stale"] += 1
            lane.counters["dropped_stale"] += 1

    def _nothing_ready(self) -> None:
        """A capture thread found nothing ready at once: no backlog is being read."""
        self._in_backlog = False

    def _preprocess(self) -> None:
        while not self._stop.is_set():
            frame = self._raw.get(timeout=0.2)
            if frame is not None:
                self._tensor_to_infer(frame)

    def _tensor_to_infer(self, frame: Frame) -> None:
        """Preprocess a frame for the variant about to run and queue it for inference."""
        self.preprocessing = True
        made = self._tensor(frame)
        if made is not None:
            self._put(self._frames, (frame, *made))
        self.preprocessing = False

    def _tensor(self, frame: Frame) -> tuple[Any, Active] | None:
        """(tensor, the Active it was made for) for the variant about to run; a broken frame
        is counted, logged and skipped (None), never fatal."""
        target = self._for(frame.source)
        assert target is not None
        try:
            c0 = time.thread_time()
            tensor = self._pre_of(target)(frame.image, target.input_shape)
            self._cpu("preprocess", time.thread_time() - c0)
            lane = self._lane.get(frame.source)
            if lane is not None:  # a tiled frame is a batch of its tiles
                lane.tiles = _tiles(tensor)
            return tensor, target
        except Exception as e:
            self.bad.record("preprocess_failed", frame.ref, str(e))
            return None

    def _put(self, q: queue.Queue, item: Any) -> None:
        while not self._stop.is_set():
            try:
                q.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    GROUP_WAIT_S = 0.005  # longest the inference thread waits for the next frame before it
    # stores what it has (a frame on its way shares the commit)

    def _infer(self) -> None:
        pending: list[Inferred] = []  # inferred, not yet stored
        while not self._stop.is_set() or pending:
            self.heartbeat = time.monotonic()
            if pending and (len(pending) >= 64 or self._stop.is_set() or (
                    self._frames.empty() and not self._upstream_busy())):
                # Group commit: one outbox transaction for everything inferred while more
                # frames were on their way (queued, being preprocessed, or a folder's backlog
                # being read: the next is a fraction of a millisecond off, and a commit a
                # frame cost more than the frame's inference on a small model); with nothing
                # on its way, store at once (lowest latency).
                self._store_pending(pending)
                pending = []
                continue
            try:
                frame, tensor, made_for = self._frames.get(
                    timeout=self.GROUP_WAIT_S if pending else 0.2)
            except queue.Empty:
                if pending:  # the next frame did not come within GROUP_WAIT_S: store now
                    self._store_pending(pending)
                    pending = []
                continue
            self.busy_since = time.monotonic()  # first: the capture thread checks it
            with self._work:
                done = self._run(frame, tensor, made_for)
            if done is not None:
                pending.append(done)

    def _store_pending(self, pending: list[Inferred]) -> None:
        """Store a group of inferred frames under `_work` (see _store)."""
        with self._work:
            self._store(pending)

    def _upstream_busy(self) -> bool:
        """The next tensor is on its way: a frame is being preprocessed, decoded frames wait
        for it, or the last frame read was ready at once (a backlog being read)."""
        return self.preprocessing or not self._raw.empty() or self._in_backlog

    def _run(self, frame: Frame, tensor: Any, made_for: Active, alone: bool = False
             ) -> Inferred | None:
        """Infer one frame on the active variant (swapping in a pending one first); the caller
        holds `_work`; `alone`: on the inline path, no other stage running beside it. Returns
        what `_store` needs, or None after a reported failure."""
        key = self._key.get(frame.source, "")
        # a swap pending? read without the lock first (one landing just after: the next frame)
        if (self._extra_next if key else self._next is not None):
            with self._lock:
                if key and key in self._extra_next:  # a source's own model changes rung
                    old, self._extra[key] = self._extra.get(key), self._extra_next.pop(key)
                    if old is not None:
                        old.session.close()
                elif not key and self._next is not None:
                    old, self._active, self._next = self._active, self._next, None
                    if old is not None and old is not self.shadow.old:  # the shadow lives on
                        old.session.close()
        active = self._extra[key] if key else self._active
        assert active is not None
        self.busy_since = time.monotonic()
        try:
            if made_for is not active and (made_for.input_shape != active.input_shape
                                           or made_for.pre is not active.pre):
                # preprocessed for the variant just replaced (another size or model)
                c0 = time.thread_time()
                tensor = self._pre_of(active)(frame.image, active.input_shape)
                self._cpu("preprocess", time.thread_time() - c0)
            t0, c0 = time.perf_counter(), time.thread_time()
            out = infer_tiles(active.session, tensor)  # one tensor, or a tiled frame's
            spent = time.thread_time() - c0
            ms = (time.perf_counter() - t0) * 1e3
            lid = live_id(active.key, active.variant_id)
            n, cpu = self._infer_cpu.get(lid, (0, 0.0))
            # per inference: a tiled frame ran one per tile (live energies stay per inference)
            tiles = _tiles(tensor)
            self._infer_cpu[lid] = (n + tiles, cpu + spent)
        except Exception as e:
            self.busy_since = None
            self.counters["infer_errors"] += 1
            self.models.error(self._model_id(active), time.monotonic())
            log.error("inference failed on %s with %s: %s", frame.ref, active.variant_id, e)
            self._event({"type": EventType.INFERENCE_FAILED, "severity": "warning",
                         "variant": active.variant_id, "error": str(e)[:300]})
            return None
        if not key:  # what OTA swapped is the [model]'s model: a source's own is not sampled
            self.shadow.sample(frame, out, active)
        return Inferred(frame, out, active, ms, tiles, spent, alone)

    def _model_id(self, active: Active) -> ModelId:
        """What `active`'s frames are counted under in `models`."""
        return model_id(active.key, active.manifest or self._manifest)

    def _inline(self, frame: Frame) -> bool:
        """Idle fast path: with nothing queued or in flight, the capture thread runs the frame
        through preprocess, infer and store itself (two thread wake-ups saved). True: consumed."""
        # queues read without their locks (stale either way): `_work`, busy_since again guard
        frames = self._frames.queue
        if (self.busy_since is not None or self.preprocessing or frames
                or not self._raw.empty() or not self._work.acquire(blocking=False)):
            return False
        try:
            if self.busy_since is not None or frames:
                return False  # the infer thread took a frame meanwhile
            self.busy_since = time.monotonic()
            made = self._tensor(frame)
            if made is None:
                self.busy_since = None
                return True
            done = self._run(frame, *made, alone=True)
            if done is not None:
                self._store([done])
            self.counters["inline"] += 1
            return True
        finally:
            self._work.release()

    def _store(self, batch: list[Inferred]) -> None:
        """Postprocess and persist a group in one outbox transaction, then mark frames done."""
        c_post = time.thread_time()
        results, made, owners, counted = [], [], [], []
        infer_s = 0.0
        for frame, out, active, ms, tiles, spent, alone in batch:
            # counted with the frame's store, so a window's inference CPU is its own frames'
            # (counted at inference, a window could hold frames inferred in the one before:
            # a model share of 0 mJ beside a box figure)
            infer_s += spent
            manifest = active.manifest or self._manifest  # a swap: each frame its own model's
            try:  # label, score; a detector's boxes and counts too
                fields = frame_result(out, manifest, frame.image.shape[:2], active.input_shape)
            except Exception as e:  # an output not of the declared form: this frame only
                self.bad.record("postprocess_failed", frame.ref, str(e))
                self.models.error(self._model_id(active), time.monotonic())  # the model's fault
                continue
            if (ev := self.sight.see(manifest, out, fields)) is not None:
                self._event(ev)  # runtime/engine/sanity.py
            results.append(_result_of(frame, fields, manifest, active, ms))
            made.append(frame)
            owners.append(manifest)
            counted.append((self._model_id(active), ms / max(tiles, 1), alone))
        c_persist = time.thread_time()
        try:
            seqs = self._sink(results) if results else []
        except Exception as e:  # disk full, database broken: frames stay not-done
            self.busy_since = None
            self.shadow.drop_due()  # bounded: no comparisons pile up while storing fails
            self._cpu("postprocess", c_persist - c_post)
            self._cpu("infer", infer_s)  # spent all the same
            self.counters["store_errors"] += len(results)
            # a full disk fails every batch: one line a minute (with how many more), one
            # event an outage, not one each per frame into the outbox that is failing
            self._store_log.log("store", "could not store %d results: %s; their frames are not "
                                "marked done (inspected again after a restart)", len(results),
                                e, level=logging.ERROR)
            if not self._store_failing:
                self._store_failing = True
                self._event({"type": EventType.STORE_FAILED, "severity": "critical",
                             "error": str(e)})
            return
        if self._store_failing:
            self._store_failing = False
            log.warning("results are stored again (%d could not be stored meanwhile)",
                        self.counters["store_errors"])
        # windows and tallies on the monotonic clock (a wall step must not empty or freeze
        # them); capture-to-result from the frame's wall stamp, as the result says it
        now, mono = time.time(), time.monotonic()
        for m, ms_each, alone in counted:
            self.models.result(m, mono, ms_each, alone)
        for item in batch:
            frame = item.frame
            e2e_ms = (now - frame.t) * 1e3
            self._slo.add(mono, item.ms, e2e_ms)
            lane = self._lane.get(frame.source)
            if lane is not None:
                lane.e2e.append((mono, e2e_ms))
                lane.counters["results"] += 1
        self._done.stored(max(seqs, default=0), self.lanes, [item.frame for item in batch])
        self.counters["results"] += len(results)
        for r in results:
            label = r["label"]
            # bounded: a many-class model must not grow health without limit
            self.labels[label if label in self.labels or len(self.labels) < MAX_LABELS
                        else OTHER_LABEL] += 1
        if self._local is not None and results:
            # one submit per model (sources may run different models, with their own labels)
            groups: dict[int, list[int]] = {}
            for i, m in enumerate(owners):
                groups.setdefault(id(m), []).append(i)
            for idx in groups.values():
                m = owners[idx[0]]
                # a detector's ok result is "none" (nothing found), not its first class:
                # snapshots by default keep every label but the first
                self._local.submit([made[i] for i in idx], [results[i] for i in idx],
                                   [seqs[i] for i in idx] if seqs else [],
                                   ("none", *m.labels) if m.detect else m.labels)
        self._stage_cpu.stored(len(results), time.thread_time() - c_persist, infer_s,
                               c_persist - c_post)
        self.busy_since = None
        self.shadow.compare_due(self._pre_of, self._manifest)  # after the store: no latency

    def release_durable(self) -> None:
        """Mark done the files whose results reached the disk after their store (the outbox
        flushed what it held when space came back): called at each health, so an idle
        source's files do not wait for its next file, or a restart, to be done."""
        if self._done.waiting():
            with self._work:
                self._done.stored(0, [], [])


def _result_of(frame: Frame, fields: dict[str, Any], manifest: Manifest, active: Active,
               ms: float) -> dict[str, Any]:
    """The result of a frame's inference, as the outbox stores it and the wire carries it
    (`fields`: the model's label and score, a detector's boxes and counts)."""
    r = {"t": frame.t, "source": frame.source, "model": manifest.name, "ref": frame.ref,
         **fields, "variant": active.variant_id, "rung": active.rung + 1,  # 1 = cheapest
         "latency_ms": round(ms, 3),  # inference alone
         "e2e_ms": round((time.time() - frame.t) * 1e3, 3)}  # capture to result
    if frame.truth is not None:
        r["truth"] = frame.truth
    if frame.camera_frame is not None:  # the camera's number of the image judged
        r["camera_frame"] = frame.camera_frame
    return r


def _tiles(tensor: Any) -> int:
    """Inferences a preprocessed frame costs: a tiled frame is a batch of its tiles."""
    return int(getattr(tensor, "shape", (1,))[0] or 1)
