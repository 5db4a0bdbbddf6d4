"""When the log says why the governor does not step up (runtime/device/sensing.py RefusalWatch):
a new kind of reason at once, the same kind again once per `every_s` of device time."""

import pytest

from runtime.device.sensing import RefusalWatch, refusal_kind

HOLD = "rung hold: big in 12 s (dwell 30 s)"
EXCURSION = "on an excursion: no richer rung or rate until it ends"

# name, (refused, device time t, said?) in turn, on one watch (every_s 300)
SEQUENCES = [
    ("nothing refused: nothing said", [("", 0.0, False), ("", 400.0, False)]),
    ("the same kind once per every_s, again at exactly every_s",
     [(HOLD, 0.0, True), ("rung hold: big in 11 s (dwell 30 s)", 1.0, False),
      (HOLD, 299.0, False), (HOLD, 300.0, True)]),
    ("another kind at once", [(HOLD, 0.0, True), (EXCURSION, 1.0, True), (HOLD, 2.0, True)]),
    ("a refusal that ended and came back is said again at once",
     [(EXCURSION, 0.0, True), ("", 1.0, False), (EXCURSION, 2.0, True)]),
    ("device time stepping back (NTP at boot) starts again",
     [(HOLD, 1000.0, True), (HOLD, 10.0, True), (HOLD, 11.0, False)]),
]


@pytest.mark.parametrize(("name", "steps"), SEQUENCES, ids=[c[0] for c in SEQUENCES])
def test_when_a_refusal_is_said(name, steps):
    w = RefusalWatch(every_s=300.0)
    assert [w.due(refused, t) for refused, t, _ in steps] == [said for *_, said in steps]


@pytest.mark.parametrize(("refused", "kind"), [
    (HOLD, "rung hold: big in"),  # the variant held back is part of the kind
    (EXCURSION, "on an excursion: no richer rung or rate until it ends"),
    ("small would settle near 81.2 °C, over 80 °C", "small would settle near"),
    # digits inside a variant's name are the name's: two variants, two kinds
    ("yolov8n@onnxruntime:CPU/t2 would settle near 81.2 °C, over 80 °C",
     "yolov8n@onnxruntime:CPU/t2 would settle near"),
    ("yolov5s-int8@openvino:CPU/t4 would settle near -0.5 °C", "yolov5s-int8@openvino:CPU/t4 "
     "would settle near"),
    ("rung hold: yolov8n in 12 s (dwell 30 s)", "rung hold: yolov8n in"),
])
def test_a_refusal_s_kind_leaves_its_changing_figures_out(refused, kind):
    assert refusal_kind(refused) == kind
