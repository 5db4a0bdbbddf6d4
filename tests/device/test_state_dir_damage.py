"""`edgerun serve` as a real process on a box whose state directory is damaged before it
starts: a file where a directory belongs, an outbox database the filesystem emptied. Each is
one line naming the path (or a counted, reported loss), never a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.daemon_harness import Serve, events, result_seqs, write_config
from support.waiting import wait

from models import bundled

pytestmark = pytest.mark.skipif(not (bundled() / "manifest.json").exists(),
                                reason="bundled model not built")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("profiles")


def _refused(tmp_path: Path, cfg: Path) -> str:
    """Run `serve` to its exit; its log, checked to be one error line and exit status 2."""
    d = Serve(tmp_path, cfg)
    try:
        rc = d.proc.wait(120)
    finally:
        d.stop()
    text = d.text()
    assert rc == 2, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    return text.strip().splitlines()[-1]


@pytest.mark.timeout(180)
def test_a_state_dir_that_is_a_file_is_one_line_naming_it(tmp_path, cache):
    """A file where daemon.state_dir should be (a botched restore, a copy gone wrong) raised
    FileExistsError out of start-up: a traceback at every restart."""
    cfg = write_config(tmp_path, cache)
    state = tmp_path / "state"
    state.write_text("not a directory\n")
    line = _refused(tmp_path, cfg)
    assert "daemon.state_dir" in line and str(state) in line, line
    assert state.read_text() == "not a directory\n"  # left as it is


@pytest.mark.timeout(180)
def test_a_file_where_the_model_store_belongs_is_one_line_naming_it(tmp_path, cache):
    """A file at <state>/models: NotADirectoryError from the model store's mkdir was a
    traceback."""
    cfg = write_config(tmp_path, cache)
    (tmp_path / "state").mkdir()
    models = tmp_path / "state" / "models"
    models.write_text("x")
    line = _refused(tmp_path, cfg)
    assert line.startswith("edgerun: ") and str(models) in line, line


@pytest.mark.timeout(240)
def test_an_outbox_database_emptied_by_the_filesystem_is_reported_not_reused(tmp_path, cache):
    """A power cut can leave a file at zero bytes. SQLite opens an empty file as a new
    database, so the daemon started a new stream and the results that were only in the
    database were gone without a word. Now it is the corrupt-database path: moved aside,
    an ERROR line and an outbox_corrupt event say what was lost."""
    cfg = write_config(tmp_path, cache)
    first = Serve(tmp_path, cfg)
    try:
        # enough results that some have spilled from the result log into the database
        wait(lambda: first.ready() and len(result_seqs(first.outbox)) > 40, 120,
             "results stored", first)
    finally:
        assert first.stop() == 0, first.text()[-3000:]
    db = tmp_path / "state" / "outbox.db"
    assert db.stat().st_size > 0 and (tmp_path / "state" / "outbox.db.log").stat().st_size > 0
    for suffix in ("-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    os.truncate(db, 0)
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: d.ready() and events(d.outbox, "outbox_corrupt"), 120,
             "the emptied outbox reported", d)
        assert f"outbox {db} is corrupt" in d.text() and "results only in the database are " \
            "lost" in d.text(), d.text()[-3000:]
        assert list(db.parent.glob("outbox.db.corrupt-*")), "the empty file kept for forensics"
        assert d.stop() == 0
        assert "Traceback" not in d.text()
    finally:
        d.stop()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("damage", ["gone", "manifest-is-a-directory"])
def test_a_current_model_version_that_is_gone_is_said_not_silently_replaced(tmp_path, cache,
                                                                            damage):
    """The model store's pointer names a version whose directory is gone or incomplete, and
    there is no previous one: the configured model was served without a word, while the
    pointer still named the version the fleet deployed."""
    import json

    cfg = write_config(tmp_path, cache)
    models = tmp_path / "state" / "models"
    version = models / "versions" / "inspection@2"
    version.mkdir(parents=True)
    if damage == "manifest-is-a-directory":
        (version / "manifest.json").mkdir()
    else:
        version.rmdir()
    (models / "current.json").write_text(json.dumps(
        {"v": 1, "current": "inspection@2", "previous": None, "probation": None,
         "rejected": {}}))
    d = Serve(tmp_path, cfg)
    try:
        wait(d.ready, 120, "the daemon ready on the configured model", d)
        said = [ln for ln in d.text().splitlines() if "inspection@2" in ln]
        assert said and "ERROR" in said[0] and "configured model" in said[0], d.text()[-3000:]
        assert str(models / "current.json") in said[0], said[0]
        assert d.stop() == 0
    finally:
        d.stop()
