"""Review R3: a model's side files (manifest.json, labels, preprocessing JSON) that are not
what they should be are ModelErrors naming the file, never a hang or a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.under_test import child_env

from runtime.engine.manifest import load_manifest, read_labels, read_preprocess
from runtime.engine.onnx_model import ModelError

ROOT = Path(__file__).parents[2]
BUNDLED = ROOT / "models" / "inspection"


@pytest.mark.parametrize("text, match", [
    ("[]", "must be a JSON object, got list"),       # was AttributeError: 'list' ... 'get'
    ("null", "must be a JSON object, got NoneType"),
    ("[" * 100_000, "nested too deeply"),            # was RecursionError
    (b"\xff\xfe{", "not UTF-8"),                     # was UnicodeDecodeError
])
def test_a_manifest_that_is_not_an_object_is_a_model_error(tmp_path, text, match):
    data = text if isinstance(text, bytes) else text.encode()
    (tmp_path / "manifest.json").write_bytes(data)
    with pytest.raises(ModelError, match=match) as e:
        load_manifest(tmp_path)
    assert "manifest.json" in str(e.value)


@pytest.mark.parametrize("reader", [read_labels, read_preprocess])
def test_a_fifo_or_device_in_place_of_a_side_file_is_refused_not_read_forever(tmp_path, reader):
    fifo = tmp_path / "labels.fifo"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):  # the first blocked, the second filled memory
        with pytest.raises(ModelError, match="not a regular file") as e:
            reader(path)
        assert str(path) in str(e.value)


def test_a_deeply_nested_preprocessing_json_is_a_model_error(tmp_path):
    (tmp_path / "pre.json").write_text("[" * 100_000)
    with pytest.raises(ModelError, match="pre.json: not valid JSON .*nested too deeply"):
        read_preprocess(tmp_path / "pre.json")


def test_check_says_which_file_instead_of_a_traceback(tmp_path):
    model = tmp_path / "m"
    shutil.copytree(BUNDLED, model)
    (model / "manifest.json").write_text("[]")
    cfg = tmp_path / "e.toml"
    cfg.write_text(f'[model]\npath = "{model}"\n[governor]\npolicy = "off"\n')
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "check", str(cfg)],
                       capture_output=True, text=True, timeout=120,
                       env=child_env())
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert f"{model / 'manifest.json'}: the manifest must be a JSON object" in r.stderr


@pytest.mark.parametrize("pre, match", [
    ('{"scale": "x"}', "scale must be a positive number, got 'x'"),  # check ok, serve died
    ('{"scale": true}', "scale must be a positive number"),
    ('{"scale": 0}', "scale must be a positive number"),
    ('{"mean": ["a", "b", "c"]}', "mean and std need 3 finite numbers"),
    ('{"mean": [NaN, 0, 0]}', "mean and std need 3 finite numbers"),
    ('{"std": 5}', "mean and std need 3 finite numbers"),
])
def test_check_refuses_preprocessing_serve_would_die_on(tmp_path, pre, match):
    """`edgerun check` said ok to these and `serve` then died in its warm-up with a numpy
    TypeError traceback (check promises to fail on what serve would fail on)."""
    (tmp_path / "pre.json").write_text(pre)
    cfg = tmp_path / "e.toml"
    cfg.write_text(f'[model]\npath = "{BUNDLED / "fp32.onnx"}"\npreprocess = '
                   f'"{tmp_path / "pre.json"}"\n[governor]\npolicy = "off"\n')
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "check", str(cfg)],
                       capture_output=True, text=True, timeout=120,
                       env=child_env())
    assert r.returncode == 1 and match in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_manifest_preprocess_that_is_not_an_object_is_a_model_error(tmp_path):
    import json

    shutil.copytree(BUNDLED, tmp_path / "m")
    doc = json.loads((tmp_path / "m" / "manifest.json").read_text())
    doc["preprocess"] = []  # was AttributeError: 'list' object has no attribute 'items'
    (tmp_path / "m" / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(ModelError, match="preprocess must be an object"):
        load_manifest(tmp_path / "m")
