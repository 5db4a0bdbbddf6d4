"""Config validation: errors name the file, the line and the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runtime import config
from runtime.config.schema import ConfigError


def write(tmp_path, text: str):
    p = tmp_path / "edgerun.toml"
    p.write_text(text)
    return p


def test_defaults_without_file():
    cfg = config.load(None)
    assert cfg.constraints.latency_ms == 20.0
    assert cfg.backends.enabled == config.ENGINES


def test_valid_file_is_typed(tmp_path):
    cfg = config.load(write(tmp_path, """
[model]
input_shape = [1, 3, 64, 64]
[constraints]
latency_ms = 15
percentile = 99
[backends]
enabled = ["onnxruntime"]
threads = [1]
[backends.openvino]
precision_hints = ["f32"]
"""))
    assert cfg.model.input_shape == (1, 3, 64, 64)
    assert cfg.constraints.latency_ms == 15.0 and isinstance(cfg.constraints.latency_ms, float)
    assert cfg.constraints.percentile == 99
    assert cfg.backends.enabled == ("onnxruntime",)
    assert cfg.backends.openvino.precision_hints == ("f32",)


@pytest.mark.parametrize(("text", "where", "what"), [
    ("[profiler]\nwarmup = 3\n", ":2: key 'profiler.warmup'", "unknown key"),
    ("[constraints]\n\nlatency_ms = 'fast'\n", ":3: key 'constraints.latency_ms'",
     "expected a number"),
    ("[constraints]\npercentile = 90\n", ":2: key 'constraints.percentile'", "50 or 95 or 99"),
    ("[backends]\nenabled = ['tensorrt']\n", "key 'backends.enabled.[0]'", "'onnxruntime'"),
    ("[profiler]\nmin_runs = 10\nmax_runs = 5\n", ":3: key 'profiler.max_runs'",
     "must be >= min_runs"),
    ("[bogus]\nx = 1\n", ":1: key 'bogus'", "known keys here"),
    ("[model]\ninput_shape = [1, 0, 3]\n", ":2: key 'model.input_shape'", "positive"),
    ("[device]\nsysfs_root = 5\n", ":2: key 'device.sysfs_root'", "expected a string"),
    ("[governor]\nband_c = -0.1\n", ":2: key 'governor.band_c'", "within 0..5"),
    ("[governor]\nband_c = 1e9\n", ":2: key 'governor.band_c'", "within 0..5"),
    ("[governor]\nband_c = nan\n", ":2: key 'governor.band_c'", "finite"),
    ("[governor]\nband_c = 'low'\n", ":2: key 'governor.band_c'", "expected a number"),
    # re-ranks on served energy: a storm of them is refused, as is "never" spelt inf
    ("[daemon]\nrerank_every_s = 10\n", ":2: key 'daemon.rerank_every_s'", ">= 60"),
    ("[daemon]\nrerank_every_s = inf\n", "key 'daemon.rerank_every_s'", "finite"),
    ("[daemon]\nrerank_every_s = nan\n", "key 'daemon.rerank_every_s'", "finite"),
    ("[governor]\ndwell_s = -1\n", ":2: key 'governor.dwell_s'", "within 0..3600"),
    ("[governor]\ndwell_s = 120\nmax_dwell_s = 60\n", ":3: key 'governor.max_dwell_s'",
     "within dwell_s (120)"),
    ("[governor]\nhold_invalid_s = -5\n", ":2: key 'governor.hold_invalid_s'", "must be >= 0"),
])
def test_errors_name_file_line_key(tmp_path, text, where, what):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        config.load(p)
    msg = str(e.value)
    assert msg.startswith(str(p))
    assert where in msg
    assert what in msg


def test_not_toml(tmp_path):
    with pytest.raises(ConfigError, match="not valid TOML"):
        config.load(write(tmp_path, "[model\n"))


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        config.load(tmp_path / "nope.toml")


def test_check_command(tmp_path):
    # `check` also probes the sensors under sysfs_root (tests/power/test_sensors.py): point it at a
    # fixture board so the result does not depend on the machine running the tests.
    board = Path(__file__).parents[1] / "fixtures/sysfs/x86-coretemp"
    good = write(tmp_path, f'[device]\nsysfs_root = "{board}"\n[constraints]\nlatency_ms = 12\n')
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "check", str(good)],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert '"latency_ms": 12.0' in r.stdout
    # the fixture board has no timesyncd and the kernel is not asked for a fake root
    assert "clock: unsynced: not synchronised (no systemd-timesyncd" in r.stderr, r.stderr
    cam = write(tmp_path, f'[device]\nsysfs_root = "{board}"\n[source]\nkind = "capture"\n'
                'path = "rtsp://admin:hunter2@10.0.0.9/live"\n')
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "check", str(cam)],
                       capture_output=True, text=True, check=False)
    assert "rtsp://***@10.0.0.9/live" in r.stdout, r.stdout + r.stderr
    assert "hunter2" not in r.stdout + r.stderr
    bad = write(tmp_path, "[constraints]\nlatency = 12\n")
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "check", str(bad)],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 2
    assert "key 'constraints.latency': unknown key" in r.stderr
    assert "Traceback" not in r.stderr


def test_bundled_device_profiles_load():
    from runtime.device.profiles import load_profile, profile_path

    for f in profile_path("generic-x86").parent.glob("*.toml"):
        assert load_profile(str(f)).name == f.stem


def test_unknown_device_profile():
    from runtime.device.profiles import load_profile

    with pytest.raises(ConfigError, match="bundled profiles: .*generic-x86"):
        load_profile("no-such-board")


# -- issue 12, finding 12: whatever the file holds, loading says what and where ---------------

def test_non_utf8_byte_names_file_line_and_column(tmp_path):
    p = tmp_path / "edgerun.toml"
    p.write_bytes(b"[constraints]\nlatency_ms = 12\n# caf\xe9\n")
    with pytest.raises(ConfigError) as e:
        config.load(p)
    assert str(e.value).startswith(f"{p}:3: not UTF-8: byte 0xe9 at column 6")


def test_utf8_bom_is_accepted(tmp_path):
    p = tmp_path / "edgerun.toml"
    p.write_bytes(b"\xef\xbb\xbf[constraints]\nlatency_ms = 12\n")
    assert config.load(p).constraints.latency_ms == 12.0


def test_toml_error_names_the_line(tmp_path):
    with pytest.raises(ConfigError, match=r"edgerun.toml:3: not valid TOML"):
        config.load(write(tmp_path, "[constraints]\nlatency_ms = 12\nx = = 1\n"))


@pytest.mark.parametrize("what", ["directory", "fifo", "device", "huge", "deep"])
def test_files_that_are_not_configs_are_config_errors(tmp_path, what):
    import os

    p = tmp_path / "edgerun.toml"
    if what == "directory":
        p.mkdir()
        match = "it is a directory"
    elif what == "fifo":  # would block a plain open() forever
        os.mkfifo(p)
        match = "not a regular file"
    elif what == "device":  # /dev/zero would fill memory with a plain read()
        p.symlink_to("/dev/zero")
        match = "not a regular file"
    elif what == "huge":
        p.write_text("# padding\n" * 200_000)
        match = "more than the 1048576"
    else:  # tomllib recurses into nested arrays
        p.write_text("x = " + "[" * 50_000 + "]" * 50_000 + "\n")
        match = "nested too deeply"
    with pytest.raises(ConfigError, match=match) as e:
        config.load(p)
    assert str(e.value).startswith(str(p))


# -- config as a leaf (its imports: tests/test_layering.py) ----------------------------------

def test_bundled_models_is_where_the_models_package_is():
    import models
    from runtime.config.source import BUNDLED_MODELS

    assert BUNDLED_MODELS == models.ROOT


@pytest.mark.parametrize("name", config.ENGINES)
def test_each_backend_names_its_own_config_class(name):
    """[backends.<name>] is typed by the class the backend's own file names, and the
    backend's name is its registry line's (runtime/config/backends.py REGISTRY)."""
    import dataclasses
    import importlib
    import typing

    from runtime.config.backends import BY_NAME, BackendsConfig

    module, cls = BY_NAME[name].backend.split(":")
    backend = getattr(importlib.import_module(module), cls)
    assert backend.name == name
    assert backend.config_class is BY_NAME[name].knobs
    hints = typing.get_type_hints(BackendsConfig)
    if backend.config_class is None:  # an engine without knobs has no section
        assert name not in hints
        return
    assert hints[name] is backend.config_class
    assert dataclasses.is_dataclass(backend.config_class)


def test_the_backends_section_is_derived_from_the_registry():
    """`enabled` accepts the registry's names, and each engine with knobs has its section:
    adding an engine is its module and one registry line."""
    import typing

    from runtime.config.backends import REGISTRY, BackendsConfig

    hints = typing.get_type_hints(BackendsConfig)
    (name_type, _) = typing.get_args(hints["enabled"])
    assert typing.get_args(name_type) == tuple(e.name for e in REGISTRY) == config.ENGINES
    assert {k for k in hints if k not in ("enabled", "threads", "plugins")} == {
        e.name for e in REGISTRY if e.knobs}
    with pytest.raises(ConfigError, match="'backends.enabled.\\[0\\]': expected 'onnxruntime' "
                       "or 'openvino' or 'opencv' or 'opencl', got 'tflite'"):
        config.from_dict({"backends": {"enabled": ["tflite"]}})
    with pytest.raises(ConfigError, match="'backends.opencl': unknown key"):
        config.from_dict({"backends": {"opencl": {}}})


def _schema_keys(cls: type, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key path of the config schema, tables and leaves (`sources` as one)."""
    import dataclasses
    import typing

    from runtime.config.schema import keys_of

    hints = typing.get_type_hints(cls)
    out = []
    for f in keys_of(cls).values():
        path = (*prefix, f.name)
        out.append(path)
        if dataclasses.is_dataclass(hints[f.name]):
            out += _schema_keys(hints[f.name], path)
    return out


def test_the_example_config_shows_every_section_and_key_the_schema_has():
    """firmware_config/examples/edgerun.toml says it has every section and key: each table of
    the schema as a header (`[results]`, or `# [[sources]]` where one is opt-in and replaces
    another) and each key set there or, unset by default, commented in its table. A section
    or key added to runtime/config/ without a line here fails (issue 32: [results], [sleep],
    [homeassistant], [models] and [[sources]] were missing)."""
    import dataclasses
    import re
    import tomllib

    from runtime.config import Config

    path = Path(__file__).parents[2] / "firmware_config" / "examples" / "edgerun.toml"
    text = path.read_text()
    config.load(path)  # valid as it stands
    data = tomllib.loads(text)
    tables: dict[tuple[str, ...], list[str]] = {(): []}  # table -> its lines, comments too
    current: tuple[str, ...] = ()
    for line in text.splitlines():
        header = re.match(r"^#?\s*\[(\[?)([\w.]+)\]\]?", line)
        if header:
            current = tuple(header.group(2).split("."))
            tables.setdefault(current, [])
            continue
        tables[current].append(line)
    missing = []
    for keys in _schema_keys(Config):
        table, key = keys[:-1], keys[-1]
        node = data
        for k in keys:
            node = node.get(k) if isinstance(node, dict) else None
        if node is not None:
            continue  # set in the example
        if keys in tables:
            continue  # a table shown (commented where opt-in)
        if any(re.match(rf"^#\s*{key}\s*=", ln) for ln in tables.get(table, [])):
            continue  # commented in its table: unset by default
        missing.append(".".join(keys))
    assert missing == [], f"{path.name} lacks {missing}"
    assert {f.name for f in dataclasses.fields(Config)} <= {t[0] for t in tables if t}
