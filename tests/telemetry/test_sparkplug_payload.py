"""Sparkplug payloads and metrics (runtime/telemetry/sparkplug/payload.py, metrics.py): the
schema is Tahu's, the committed _pb2 is what protoc makes of it, what edgerun encodes
decodes with an independently compiled schema, commands are refused whole, and report by
exception keeps to its deadbands."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from support.sparkplug_host import PROTO, decode, value

from runtime.config.sparkplug import SparkplugConfig
from runtime.telemetry.sparkplug import payload as spb
from runtime.telemetry.sparkplug import sparkplug_b_pb2
from runtime.telemetry.sparkplug.metrics import NODE_METRICS, Tally, changed, node_metrics

# eclipse/tahu sparkplug_b/sparkplug_b.proto as of commit 46f25e79 (2022-05, the 3.0 schema)
TAHU_SHA256 = "4432c5c483b7fb9732d0594c98a2e97dca5e517e39c5374a8b918d837f0b4a19"


def test_the_schema_is_tahus_verbatim():
    assert hashlib.sha256(PROTO.read_bytes()).hexdigest() == TAHU_SHA256


def test_the_committed_pb2_is_what_protoc_makes_of_the_schema(tmp_path):
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO.parent}",
                    f"--python_out={tmp_path}", PROTO.name], check=True)
    fresh = (tmp_path / "sparkplug_b_pb2.py").read_text()
    assert Path(sparkplug_b_pb2.__file__).read_text() == fresh, (
        "sparkplug_b_pb2.py is not what this protoc makes of the schema: regenerate it "
        "(payload.py says how) and raise the protobuf floor in pyproject.toml to its version")


@pytest.mark.parametrize("datatype,x,field,want", [
    (spb.INT32, -5, "int_value", (1 << 32) - 5),  # two's complement in the uint32 field
    (spb.INT32, 7, "int_value", 7),
    (spb.UINT32, 4_000_000_000, "int_value", 4_000_000_000),
    (spb.INT64, 255, "long_value", 255),
    (spb.UINT64, 1 << 62, "long_value", 1 << 62),
    (spb.DATETIME, 1_700_000_000_123, "long_value", 1_700_000_000_123),
    (spb.DOUBLE, 0.125, "double_value", 0.125),
    (spb.BOOLEAN, True, "boolean_value", True),
    (spb.STRING, "scratch", "string_value", "scratch"),
])
def test_each_datatype_goes_in_its_field(datatype, x, field, want):
    p = decode(spb.encode({"m": spb.Value(datatype, x, 42, historical=True)}, 43, 9))
    (m,) = p.metrics
    assert (m.name, m.datatype, m.timestamp, m.is_historical) == ("m", datatype, 42, True)
    assert m.WhichOneof("value") == field and getattr(m, field) == want
    assert (p.timestamp, p.seq) == (43, 9)


@pytest.mark.parametrize("x", [None, float("nan"), float("inf")])
def test_a_value_not_measured_is_null_not_a_number(x):
    (m,) = decode(spb.encode({"t": spb.Value(spb.DOUBLE, x, 1)}, 1, 0)).metrics
    assert m.is_null and m.WhichOneof("value") is None and m.datatype == spb.DOUBLE


def test_ndeath_carries_bdseq_and_no_seq():
    p = decode(spb.death(17, 5))
    assert not p.HasField("seq") and [(m.name, m.datatype, value(m)) for m in p.metrics] == [
        ("bdSeq", spb.INT64, 17)]


def _cmd(*metrics: tuple) -> bytes:
    p = sparkplug_b_pb2.Payload(timestamp=1, seq=0)
    for name, datatype, field, x in metrics:
        m = p.metrics.add(name=name, datatype=datatype)
        if field:
            setattr(m, field, x)
    return p.SerializeToString()


def test_a_rebirth_ncmd_is_taken():
    assert spb.parse_node_command(_cmd(("Node Control/Rebirth", spb.BOOLEAN,
                                        "boolean_value", True)), 4096)
    assert not spb.parse_node_command(_cmd(("Node Control/Rebirth", spb.BOOLEAN,
                                            "boolean_value", False)), 4096)


@pytest.mark.parametrize("raw,why", [
    (_cmd(("Node Control/Reboot", spb.BOOLEAN, "boolean_value", True)), "unknown metric"),
    (_cmd(("Node Control/Rebirth", spb.BOOLEAN, "boolean_value", True),
          ("Inference/Rung", spb.INT32, "int_value", 1)), "unknown metric"),
    (_cmd(("Node Control/Rebirth", spb.STRING, "string_value", "true")), "must be a Boolean"),
    (_cmd(("Node Control/Rebirth", spb.INT32, "int_value", 1)), "must be a Boolean"),
    (_cmd(("Node Control/Rebirth", spb.BOOLEAN, "", None)), "must be a Boolean"),
    (_cmd(), "without metrics"),
    (b"\xff\xff\xff\xff", "not a Sparkplug B payload"),
    (_cmd(("Node Control/Rebirth", spb.BOOLEAN, "boolean_value", True)) + b"\x2a\x00" * 3000,
     "more than the 4096"),
])
def test_a_bad_ncmd_is_refused_whole(raw, why):
    with pytest.raises(spb.CommandRefused, match=why):
        spb.parse_node_command(raw, 4096)


def test_a_dcmd_is_refused_naming_its_metric():
    raw = _cmd(("Last Result/Class", spb.STRING, "string_value", "ok"))
    assert "unknown metric 'Last Result/Class'" in spb.refuse_device_command(raw, 4096)


HEALTH = {"model": "inspection", "choice": "inspection/int8@openvino:CPU/t1", "rung": 2,
          "rungs": 3, "temp_c": 61.5, "throttled": False, "power_w": 4.0,
          "box_energy": {"box_mj": 12.5}, "energy_mj": 3.0,
          "pipeline": {"results": 120, "rate_hz": 9.8, "latency_ms": {"p50": 3.0, "p95": 4.5},
                       "sources": {"cam1": {"state": "running", "rate_hz": 9.8,
                                            "e2e_p95_ms": 11.0}}},
          "slo": {"target_ms": 20.0, "compliance": 0.99},
          "backlog": {"results_held": 4, "evicted_total": 0}}


def test_node_metrics_read_health_with_their_datatypes():
    m = node_metrics(HEALTH, 5)
    assert set(m) == set(NODE_METRICS)
    got = {k: (v.datatype, v.value) for k, v in m.items()}
    assert got["Inference/Rung"] == (spb.INT32, 2)
    assert got["Thermal/Die Temperature C"] == (spb.DOUBLE, 61.5)
    assert got["Energy/Per Frame mJ"] == (spb.DOUBLE, 12.5)  # the box's, not the model's
    assert got["Latency/Meets Target"] == (spb.BOOLEAN, True)
    assert got["Backlog/Results Held"] == (spb.UINT64, 4)
    bare = node_metrics({"model": "m"}, 5)  # nothing measured yet: nulls, typed
    assert bare["Thermal/Die Temperature C"].value is None
    assert bare["Latency/Meets Target"].value is None


@pytest.mark.parametrize("name,old,new,sent", [
    ("Thermal/Die Temperature C", 60.0, 60.4, False),  # within 0.5 °C
    ("Thermal/Die Temperature C", 60.0, 60.6, True),
    ("Thermal/Die Temperature C", 60.0, None, True),  # a sensor lost: null is news
    ("Energy/Per Frame mJ", 10.0, 10.4, False),  # within 5 %
    ("Energy/Per Frame mJ", 10.0, 10.6, True),
    ("Energy/Per Frame mJ", 0.0, 0.001, True),
    ("Inference/Rung", 2, 2, False),
    ("Inference/Rung", 2, 1, True),
    ("Inference/Variant", "a", "b", True),
    ("Last Result/Score", 0.90, 0.91, False),  # within 0.02
    ("Last Result/Score", 0.90, 0.95, True),
    ("Counts/Results", 5, 6, True),
])
def test_report_by_exception_keeps_to_the_deadbands(name, old, new, sent):
    dt = spb.DOUBLE
    before = {name: spb.Value(dt, old, 1)}
    assert bool(changed(before, {name: spb.Value(dt, new, 2)}, SparkplugConfig())) == sent


def test_a_tally_gives_the_verdict_and_counts_at_the_results_time():
    t = Tally()
    ok = ("ok", "none")
    assert t.metrics(ok)["Last Result/Class"].value is None  # before any result
    t.add({"seq": 7, "t": 1700000000.25, "label": "scratch", "score": 0.8,
           "source": "cam1"}, ok)
    t.add({"seq": 8, "t": 1700000001.5, "label": "none", "score": 0.0,
           "counts": {"bolt": 2, "nut": 1}}, ok)
    m = t.metrics(ok, historical=True)
    assert m["Last Result/Verdict"].value == "ok" and m["Last Result/Objects"].value == 3
    assert m["Last Result/Seq"].value == 8 and m["Last Result/Time"].value == 1700000001500
    assert (m["Counts/Results"].value, m["Counts/OK"].value, m["Counts/Reject"].value) == (
        2, 1, 1)
    assert all(v.t_ms == 1700000001500 and v.historical for v in m.values())
