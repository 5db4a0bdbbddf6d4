"""The `[source]` and `[[sources]]` checks at their edges (pure tables): each row is one a
mutation of runtime/config/source.py passed unnoticed, so a bound moved or a branch dropped
fails here."""

from __future__ import annotations

import re

import pytest

from runtime.config import ConfigError, from_dict
from runtime.config.schema import ConfigAbsent
from runtime.config.source import MAX_SOURCES, SourceConfig, check_model, check_sources

CAM = {"kind": "capture", "path": "rtsp://x/y"}
PYLON = {"kind": "pylon"}


@pytest.mark.parametrize("source", [
    CAM | {"frame_size": [16, 16]},  # the smallest model input
    CAM | {"frame_size": [8192, 4320]},  # 8K video
    CAM | {"frame_size": [192, 108]},  # no roi: roi_units' default ("pixels") is no matter
    CAM | {"frame_size": [192, 108], "roi": [0, 0, 0.5, 1], "roi_units": "fraction"},
    PYLON | {"exposure_us": 1e8, "gain_db": 100, "serial": "s" * 64,
             "pixel_format": "BayerRG8"},
])
def test_settings_at_their_edges_are_taken(source):
    from_dict({"source": source})


@pytest.mark.parametrize("source, key, says", [
    (CAM | {"frame_size": [224, 126, 126]}, "frame_size", "[width, height]"),  # 3 sides
    (CAM | {"frame_size": [15, 126]}, "frame_size", "within 16..8192"),
    (CAM | {"frame_size": [224, 8193]}, "frame_size", "within 16..8192"),
    (CAM | {"frame_size": [100_000, 100]}, "frame_size", "within 16..8192"),
    ({"kind": "capture"}, "path", "needs a path"),  # a camera opened at ""
    # each timeout named by itself: the other's key sent a reader to a line not in the file
    (CAM | {"read_timeout_s": 0}, "read_timeout_s", "must be > 0, got 0"),
    (CAM | {"read_timeout_s": -1}, "read_timeout_s", "must be > 0, got -1"),
    (CAM | {"open_timeout_s": 0}, "open_timeout_s", "must be > 0, got 0"),
    (PYLON | {"exposure_us": 2e8}, "exposure_us", "within 0..1e8"),
    (PYLON | {"serial": "a/b"}, "serial", "letters, digits"),  # into the camera's node map
    (PYLON | {"pixel_format": "x" * 65}, "pixel_format", "up to 64"),
])
def test_settings_past_their_edges_are_refused_naming_the_key(source, key, says):
    with pytest.raises(ConfigError, match=rf"key 'source\.{key}'.*{re.escape(says)}"):
        from_dict({"source": source})


@pytest.mark.parametrize("tile_size, refused", [(16384, False), (16385, True)])
def test_tile_size_bound(tile_size, refused):
    problem = check_model(SourceConfig(tile_size=tile_size))
    assert (problem is not None and problem[0] == "tile_size") if refused else problem is None


def test_a_model_name_with_a_delete_character_is_refused():
    """A control character (DEL too) must not reach the filesystem, the log or health."""
    problem = check_model(SourceConfig(model="yolo\x7fn"))
    assert problem is not None and problem[0] == "model" and "control characters" in problem[1]


@pytest.mark.parametrize("model", ["nothere.onnx", "models/nothere", "/srv/m/nothere.onnx"])
def test_a_model_path_not_there_yet_is_retried_not_refused(model):
    """A bare 'x.onnx' is a path (model_path) as much as one with a '/': not there may be a
    mount not up yet, so the unit is restarted (ConfigAbsent), not stopped as a typo."""
    with pytest.raises(ConfigAbsent, match="no model there"):
        from_dict({"sources": [{"name": "a", "model": model}]})


def test_a_bundled_name_not_there_is_a_typo_and_stops_the_unit():
    with pytest.raises(ConfigError, match="no model there") as e:
        from_dict({"sources": [{"name": "a", "model": "no_such_bundled_model"}]})
    assert not isinstance(e.value, ConfigAbsent)


@pytest.mark.parametrize("count, rate, says", [
    (MAX_SOURCES, 1.0, None),
    (MAX_SOURCES + 1, 1.0, f"at most {MAX_SOURCES} sources"),
    (2, 0.0, "rate_hz must be > 0 with several sources"),  # 0 sized no latency or budget
])
def test_several_sources_bounded_and_each_with_a_rate(count, rate, says):
    sources = [SourceConfig(name=f"s{i}", rate_hz=rate) for i in range(count)]
    problem = check_sources(sources, single_given=False)
    assert (problem is None) if says is None else (says in problem[1]), problem
