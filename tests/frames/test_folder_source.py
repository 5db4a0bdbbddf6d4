"""Review R3: the folder source: clocks, idle listing, damaged state, unusable paths."""

from __future__ import annotations

import os
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from models.synthetic import samples
from runtime.config.source import SourceConfig
from runtime.frames.folder_source import FolderSource
from runtime.frames.frame import SourceError


def _read_all(src: FolderSource, within_s: float) -> list[str]:
    refs: list[str] = []
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        f = src.read(0.1)
        if f is not None:
            refs.append(f.ref)
            src.done([f])
    return refs


def test_a_file_stamped_in_the_future_is_inspected_once_it_has_settled(tmp_path, monkeypatch,
                                                                       caplog):
    """A file copied with its times kept (`cp -p`, rsync -t, a camera's own clock) from a
    clock an hour ahead, or any file while the box's clock is still behind (no RTC, before
    NTP), has an mtime in the future: it used to wait (silently) until the box's clock
    passed its mtime. Its settling is now observed instead: unchanged for SETTLE_S."""
    monkeypatch.setattr(FolderSource, "SETTLE_S", 0.3)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    img = next(iter(samples(seed=1, count=1))).image
    cv2.imwrite(str(inbox / "ahead.png"), img)
    ahead = time.time() + 3600
    os.utime(inbox / "ahead.png", (ahead, ahead))
    src = FolderSource(SourceConfig(kind="folder", path=str(inbox)), tmp_path / "state")
    with caplog.at_level("WARNING", logger="edgerun.source"):
        assert _read_all(src, 0.1) == []  # not yet: it must be seen unchanged first
        assert _read_all(src, 2.0) == ["ahead.png"]
    assert "in the future" in caplog.text and "ahead.png" in caplog.text
    src.close()
    src = FolderSource(SourceConfig(kind="folder", path=str(inbox)), tmp_path / "state")
    assert _read_all(src, 1.0) == []  # remembered: once, across a restart
    src.close()


def test_a_future_file_still_growing_waits_until_it_stops(tmp_path, monkeypatch):
    """Observed settling still waits for a writer: a size change restarts the wait."""
    monkeypatch.setattr(FolderSource, "SETTLE_S", 0.5)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    _, png = cv2.imencode(".png", next(iter(samples(seed=2, count=1))).image)
    data = png.tobytes()
    path = inbox / "slow.png"
    ahead = time.time() + 3600
    path.write_bytes(data[:100])
    os.utime(path, (ahead, ahead))
    src = FolderSource(SourceConfig(kind="folder", path=str(inbox)), tmp_path / "state")
    assert _read_all(src, 0.3) == []
    path.write_bytes(data)  # the rest arrives; the writer keeps its clock's stamp
    os.utime(path, (ahead + 1, ahead + 1))
    assert _read_all(src, 0.3) == []  # changed: the wait starts again
    assert _read_all(src, 2.0) == ["slow.png"]  # and it is read whole (not refused)
    src.close()


def test_an_idle_folder_is_not_listed_fifty_times_a_second(tmp_path, monkeypatch):
    """Every read() listed the whole directory every 20 ms while idle: a folder of 100,000
    inspected files (no done_dir: they stay) cost 55 % of a core with nothing to do. An
    unchanged directory is now listed every RESCAN_S; a new name is still picked up at once."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    img = next(iter(samples(seed=3, count=1))).image
    for i in range(3):
        cv2.imwrite(str(inbox / f"old{i}.png"), img)
    old = time.time() - 3600
    for f in [*inbox.iterdir(), inbox]:
        os.utime(f, (old, old))
    src = FolderSource(SourceConfig(kind="folder", path=str(inbox)), tmp_path / "state")
    assert _read_all(src, 0.5) == ["old0.png", "old1.png", "old2.png"]
    os.utime(inbox, (old, old))  # done: nothing changes from here
    scans = []
    real = src._scan
    monkeypatch.setattr(src, "_scan", lambda: (scans.append(1), real())[1])
    assert _read_all(src, 1.0) == []
    assert len(scans) <= 2, f"{len(scans)} listings in 1 s of an unchanged folder"
    # a camera that renames a finished file into place (it keeps its old mtime)
    cv2.imwrite(str(tmp_path / "new.png"), img)
    os.rename(tmp_path / "new.png", tmp_path / "new.png.tmp")
    os.utime(tmp_path / "new.png.tmp", (old, old))
    t0 = time.monotonic()
    os.rename(tmp_path / "new.png.tmp", inbox / "new.png")
    f = None
    while f is None and time.monotonic() - t0 < 5:
        f = src.read(0.05)
    assert f is not None and f.ref == "new.png"
    assert time.monotonic() - t0 < 0.5  # the listing every 20 ms while the directory changes
    src.close()


def test_a_damaged_seen_table_is_moved_aside_and_the_folder_inspected_again(tmp_path):
    """A folder-<key>.db that is not a database (power loss on an SD card) raised
    sqlite3.DatabaseError out of the source's open: the capture thread died and the daemon
    inspected nothing, without a word. Now it is moved aside, logged, and nothing is skipped."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    cv2.imwrite(str(inbox / "a.png"), next(iter(samples(seed=4, count=1))).image)
    old = time.time() - 3600
    os.utime(inbox / "a.png", (old, old))
    src = FolderSource(SourceConfig(kind="folder", path=str(inbox)), tmp_path / "state")
    assert _read_all(src, 0.3) == ["a.png"]
    src.close()
    (db,) = (tmp_path / "state").glob("folder-*.db")
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    db.write_bytes(b"garbage " * 100)
    src = FolderSource(SourceConfig(kind="folder", path=str(inbox)), tmp_path / "state")
    assert _read_all(src, 0.3) == ["a.png"]  # inspected again: never skipped
    src.close()
    assert list((tmp_path / "state").glob("folder-*.db.corrupt-*"))


def test_an_unusable_done_dir_is_a_source_error_not_a_dead_thread(tmp_path):
    """A done_dir that cannot be made (a file in its place, no permission) raised OSError
    out of the open, which ended the capture thread; a SourceError is reported and retried."""
    (tmp_path / "inbox").mkdir()
    (tmp_path / "done").write_text("a file, not a directory")
    with pytest.raises(SourceError, match="source.done_dir"):
        FolderSource(SourceConfig(kind="folder", path=str(tmp_path / "inbox"),
                                  done_dir=str(tmp_path / "done")), tmp_path / "state")


def test_a_folder_that_disappears_is_a_source_error_and_comes_back(tmp_path):
    """The watched folder unmounted or removed (a USB stick pulled, an NFS share gone): the
    listing raised FileNotFoundError out of read(), which ended the capture thread. It is a
    SourceError now (the pipeline reports it and re-opens with backoff)."""
    import shutil

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    src = FolderSource(SourceConfig(kind="folder", path=str(inbox)), tmp_path / "state")
    assert src.read(0.05) is None
    shutil.rmtree(inbox)
    with pytest.raises(SourceError, match="cannot list it"):
        for _ in range(200):  # within RESCAN_S at the latest
            src.read(0.05)
    src.close()


def test_a_seen_table_that_cannot_be_written_costs_a_log_line_not_the_thread(tmp_path,
                                                                             caplog):
    """`done()` runs on the infer thread: a full disk raised out of it."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    cv2.imwrite(str(inbox / "a.png"), next(iter(samples(seed=5, count=1))).image)
    old = time.time() - 3600
    os.utime(inbox / "a.png", (old, old))
    src = FolderSource(SourceConfig(kind="folder", path=str(inbox)), tmp_path / "state")
    f = src.read(0.5)
    assert f is not None
    src._db.close()  # any sqlite3 error from here on, as a full disk gives
    src._db = __import__("sqlite3").connect(":memory:", check_same_thread=False)
    with caplog.at_level("ERROR", logger="edgerun.source"):
        src.done([f])
    assert "could not record 1 file(s) as done" in caplog.text
    assert src.read(0.1) is None  # still known to this process: not inspected twice


def test_a_done_dir_on_another_filesystem_gets_the_files(tmp_path):
    """A rename across filesystems fails with EXDEV: with the done_dir on a USB disk or a NAS
    mount, nothing was ever moved (a warning for every file) and the inbox only grew."""
    import shutil
    import tempfile

    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the temporary directory")
    done = Path(tempfile.mkdtemp(dir=shm, prefix="r3-done-"))
    try:
        inbox = tmp_path / "inbox"
        inbox.mkdir()
        img = next(iter(samples(seed=6, count=1))).image
        old = time.time() - 3600
        for name in ("a.png", "b.png"):
            cv2.imwrite(str(inbox / name), img)
            os.utime(inbox / name, (old, old))
        (inbox / "bad.png").write_bytes(b"not an image")
        os.utime(inbox / "bad.png", (old, old))
        src = FolderSource(SourceConfig(kind="folder", path=str(inbox), done_dir=str(done)),
                           tmp_path / "state")
        got = []
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not (len(got) == 2 and (done / "rejected").exists()):
            try:
                f = src.read(0.1)
            except Exception:  # the refused bad.png
                continue
            if f is not None:
                got.append(f)
                src.done([f])
        src.close()
        assert sorted(f.ref for f in got) == ["a.png", "b.png"]
        assert sorted(p.name for p in done.iterdir()) == ["a.png", "b.png", "rejected"]
        assert [p.name for p in (done / "rejected").iterdir()] == ["bad.png"]
        assert list(inbox.iterdir()) == []
        assert cv2.imread(str(done / "a.png")) is not None  # whole
    finally:
        shutil.rmtree(done)


def test_a_sub_directory_is_named_once_not_ignored_silently(tmp_path, caplog):
    """A labelled set copied into the inbox (inbox/dent/*.png, as `models prepare --val`
    wants them) was inspected by nobody and nothing said so."""
    inbox = tmp_path / "inbox"
    (inbox / "dent").mkdir(parents=True)
    cv2.imwrite(str(inbox / "dent" / "a.png"), next(iter(samples(seed=7, count=1))).image)
    src = FolderSource(SourceConfig(kind="folder", path=str(inbox)), tmp_path / "state")
    with caplog.at_level("WARNING", logger="edgerun.source"):
        assert _read_all(src, 0.3) == []
    notes = [r.getMessage() for r in caplog.records if "sub-directory" in r.getMessage()]
    assert len(notes) == 1 and "dent/ is a sub-directory" in notes[0]
    src.close()


def test_a_done_dir_inside_the_inbox_is_not_reported(tmp_path, caplog):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    src = FolderSource(SourceConfig(kind="folder", path=str(inbox),
                                    done_dir=str(inbox / "done")), tmp_path / "state")
    with caplog.at_level("WARNING", logger="edgerun.source"):
        assert _read_all(src, 0.3) == []
    assert "sub-directory" not in caplog.text
    src.close()


def test_done_dir_keeps_every_inspected_image_of_a_reused_name(tmp_path):
    """A camera that always writes part.png: each inspected part.png was moved over the
    previous one in done_dir, so only the last image of the day was kept. The newest keeps
    the name; the older ones are kept beside it, named with their mtime."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    done = tmp_path / "done"
    src = FolderSource(SourceConfig(kind="folder", path=str(inbox), done_dir=str(done)),
                       tmp_path / "state")
    imgs = [s.image for s in samples(seed=8, count=3)]
    for i, img in enumerate(imgs):
        cv2.imwrite(str(inbox / "part.png"), img)
        os.utime(inbox / "part.png", (1000 + i, 1000 + i))
        assert _read_all(src, 0.3) == ["part.png"]
    src.close()
    names = sorted(p.name for p in done.iterdir())
    assert names == ["part.png", "part~1000000000000.png", "part~1001000000000.png"]
    kept = [cv2.imread(str(done / n)) for n in ("part~1000000000000.png",
                                                 "part~1001000000000.png", "part.png")]
    assert all(np.array_equal(k, img) for k, img in zip(kept, imgs, strict=True))


def _listings(monkeypatch) -> list[int]:
    """Count the folder source's full listings (os.listdir as the source module calls it)."""
    import runtime.frames.folder_source as sources

    calls: list[int] = []
    real = os.listdir
    monkeypatch.setattr(sources.os, "listdir", lambda p: (calls.append(1), real(p))[1])
    return calls


def _hand_over(tmp_path: Path, inbox: Path, name: str, img, how: str) -> None:
    """A finished image into the inbox, the way writers do it (kept an old mtime, settled)."""
    old = time.time() - 3600
    stage = tmp_path / f"{name}.part"
    cv2.imwrite(str(stage) + ".png", img)
    os.rename(str(stage) + ".png", stage)
    os.utime(stage, (old, old))
    if how == "rename":
        os.rename(stage, inbox / name)
    elif how == "link":  # a hard link: IN_CREATE, no close_write
        os.link(stage, inbox / name)
    else:  # copied in place with its times kept (cp -p)
        (inbox / name).write_bytes(stage.read_bytes())
        os.utime(inbox / name, (old, old))


@pytest.mark.parametrize("how", ["rename", "link", "copy"])
def test_files_arriving_in_a_full_folder_are_found_without_listing_it(tmp_path, monkeypatch,
                                                                      how):
    """A folder that keeps its inspected files (no done_dir) was listed in full on every
    20 ms poll while files kept arriving (1.4 ms of CPU a listing at 3,300 files). With the
    inotify watch only the names the kernel reports are looked at between full listings."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    img = next(iter(samples(seed=4, count=1))).image
    for i in range(200):
        (inbox / f"old{i:03d}.txt").write_text("not an image")  # listed, never inspected
    src = FolderSource(SourceConfig(kind="folder", path=str(inbox)), tmp_path / "state")
    assert src.read(0.1) is None  # the first (full) listing, and the watch armed
    calls = _listings(monkeypatch)
    got = []
    for i in range(10):
        _hand_over(tmp_path, inbox, f"new{i}.png", img, how)
        got += _read_all(src, 0.15)
    src.close()
    assert got == [f"new{i}.png" for i in range(10)]
    assert len(calls) <= 1, f"{len(calls)} full listings for 10 new files"  # RESCAN_S: 2 s


def test_without_a_watch_the_folder_is_listed_on_change(tmp_path, monkeypatch):
    """No inotify (another OS, no instances left): every change lists the folder, as before."""
    import runtime.frames.folder_source as sources

    def refused(path):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(sources, "DirWatch", refused)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    img = next(iter(samples(seed=4, count=1))).image
    src = FolderSource(SourceConfig(kind="folder", path=str(inbox)), tmp_path / "state")
    assert src.read(0.1) is None
    calls = _listings(monkeypatch)
    got = []
    for i in range(3):
        _hand_over(tmp_path, inbox, f"new{i}.png", img, "rename")
        got += _read_all(src, 0.15)
    src.close()
    assert got == ["new0.png", "new1.png", "new2.png"] and len(calls) >= 3


def test_a_watch_that_lost_track_lists_the_folder(tmp_path, monkeypatch):
    """The kernel's event queue overflowed (or the watch went): the next scan lists the whole
    folder and re-arms the watch, so nothing that arrived meanwhile is missed."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    img = next(iter(samples(seed=4, count=1))).image
    src = FolderSource(SourceConfig(kind="folder", path=str(inbox)), tmp_path / "state")
    assert src.read(0.1) is None and src._watch is not None
    first = src._watch
    first.close()  # as take() does on IN_Q_OVERFLOW: it answers None from now on
    calls = _listings(monkeypatch)
    _hand_over(tmp_path, inbox, "during.png", img, "rename")
    assert _read_all(src, 0.3) == ["during.png"]
    assert len(calls) == 1 and src._watch is not None and src._watch is not first
    src.close()


def test_a_file_still_settling_is_looked_at_again_without_a_new_event(tmp_path, monkeypatch):
    """A file written just now waits SETTLE_S; with the watch no further event may come for
    it, so the source looks at it again each scan until it has settled."""
    monkeypatch.setattr(FolderSource, "SETTLE_S", 0.3)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    img = next(iter(samples(seed=4, count=1))).image
    src = FolderSource(SourceConfig(kind="folder", path=str(inbox)), tmp_path / "state")
    assert src.read(0.1) is None
    cv2.imwrite(str(inbox / "fresh.png"), img)  # mtime now: settling
    t0 = time.monotonic()
    got = _read_all(src, 1.5)
    src.close()
    assert got == ["fresh.png"] and time.monotonic() - t0 >= 0.3


def test_a_file_name_that_is_not_utf8_is_inspected_once_and_named_as_text(tmp_path):
    """A camera wrote `bad\\xff.png` (a name in Latin-1, not UTF-8): Python lists it with a
    lone surrogate, which SQLite refused to bind when the infer thread recorded it as done
    (UnicodeEncodeError: the infer thread died, the daemon went stalled and, restarted by
    its watchdog, met the same file again), and which the coordinator refuses in a result
    (the device's result stream stalled behind it). The name is text, with the odd byte
    written as an escape, and the file is remembered across a restart."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    name = os.fsencode(inbox) + b"/bad\xff.png"
    _, png = cv2.imencode(".png", next(iter(samples(seed=7, count=1))).image)
    with open(name, "wb") as f:
        f.write(png.tobytes())
    old = time.time() - 3600
    os.utime(name, (old, old))
    src = FolderSource(SourceConfig(kind="folder", path=str(inbox)), tmp_path / "state")
    refs = _read_all(src, 0.5)  # done() runs as the infer thread runs it
    src.close()
    assert refs == ["bad\\xff.png"]
    refs[0].encode("utf-8")  # valid text: a result naming it is one the coordinator admits
    src = FolderSource(SourceConfig(kind="folder", path=str(inbox)), tmp_path / "state")
    assert _read_all(src, 0.5) == []  # remembered: once, across a restart
    src.close()


def test_a_quiet_watched_folder_sleeps_on_the_watch(tmp_path, monkeypatch):
    """An idle read slept 20 ms at a time: 50 wake-ups a second on a quiet folder. With the
    watch it sleeps until the kernel reports a name, or the read's timeout."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    src = FolderSource(SourceConfig(kind="folder", path=str(inbox)), tmp_path / "state")
    assert src.read(0.1) is None and src._watch is not None  # listed once, watch armed
    monkeypatch.setattr(FolderSource, "RESCAN_S", 60.0)
    looks = []
    real = src._changed
    monkeypatch.setattr(src, "_changed", lambda: (looks.append(1), real())[1])
    assert src.read(1.0) is None
    assert len(looks) <= 3, f"{len(looks)} looks at a quiet folder in one 1 s read"
    src.close()


def test_a_file_arriving_during_a_read_wakes_it(tmp_path, monkeypatch):
    """The read sleeping on the watch wakes for a new name: with the next full listing a
    minute away, a file handed over while the read waits is returned by that read."""
    import threading

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    img = next(iter(samples(seed=5, count=1))).image
    src = FolderSource(SourceConfig(kind="folder", path=str(inbox)), tmp_path / "state")
    assert src.read(0.1) is None and src._watch is not None
    monkeypatch.setattr(FolderSource, "RESCAN_S", 60.0)
    calls = _listings(monkeypatch)
    waiting = threading.Event()
    real_idle = src._idle
    monkeypatch.setattr(src, "_idle", lambda d: (waiting.set(), real_idle(d))[1])
    t = threading.Thread(target=lambda: (waiting.wait(10),
                                         _hand_over(tmp_path, inbox, "new.png", img, "rename")))
    t.start()
    f = src.read(10.0)
    t.join()
    assert f is not None and f.ref == "new.png"
    assert calls == []  # found through the watch, not a listing
    src.close()


def test_a_watch_closed_while_a_read_waits_on_it_is_closed_by_the_waiter(tmp_path):
    """close() from another thread during `wait` (a source closed on stop while its read
    sleeps): the descriptor stays open until the select returns (a number closed under it
    could be reused by another file and read as events), then it is closed."""
    import threading

    from runtime.frames.dirwatch import DirWatch

    w = DirWatch(tmp_path)
    t = threading.Thread(target=w.wait, args=(0.5,))
    t.start()
    deadline = time.monotonic() + 5
    while not w._waiting and time.monotonic() < deadline:
        time.sleep(0.005)
    assert w._waiting
    w.close()
    assert w._fd is not None  # still the waiter's
    t.join()
    assert w._fd is None and w.take() is None
    w.wait(10.0)  # closed: returns at once
    w.close()  # twice: nothing to do
