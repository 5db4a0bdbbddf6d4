"""Review R4 of the broker ACL refresh (H26): identities.json is read as hostile input."""

from __future__ import annotations

import json

import pytest

from runtime.coordinator.enroll import refresh_acl
from runtime.wire.brokerauth import BrokerAuth, Identity


@pytest.mark.parametrize("edit", [
    # a username carrying ACL lines: grants `evil` every topic
    lambda d: d.update({"ops\nuser evil\ntopic readwrite #": {"role": "client",
                                                              "read": ["edgerun/v1/f/+/state"]}}),
    # a coordinator's fleet that is a wildcard: the coordinator reads every fleet's topics
    lambda d: d["coord"].update(fleets=["#"]),
    # a device "name" that is not fleet/device (an ACL-significant `+`)
    lambda d: d.update({"f/+": {"role": "device", "write": ["edgerun/v1/f/+/cmd"]}}),
    # a topic with a newline
    lambda d: d["coord"].update(read=["a\ntopic readwrite #"]),
    # fleets as a string (read letter by letter), a role that does not exist
    lambda d: d["coord"].update(fleets="f"),
    lambda d: d["coord"].update(role="root"),
])
def test_refresh_refuses_identities_enrol_would_refuse(tmp_path, edit):
    """Old code: `refresh_acl` (coordinator start, `edgerun fleet acl`) regenerated the ACL
    from whatever identities.json held, unchecked: a hand-edited, restored or planted file
    with ACL-significant characters (newlines, `#`, `+`) in a name widened what a user may
    read or write. Now every identity is checked as `enrol` checks it, and the ACL is left
    untouched, the file and identity named."""
    auth = BrokerAuth(tmp_path)
    auth.enrol(Identity("f/d1", "device"))
    auth.enrol(Identity("coord", "coordinator", fleets=("f",)))
    before = auth.acl.read_text()
    auth.acl.write_text(before.replace("bundle", "x"))  # out of date: a refresh would write
    stale = auth.acl.read_text()
    doc = json.loads(auth._registry.read_text())
    edit(doc)
    auth._registry.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="identities.json"):
        auth.refresh_acl()
    with pytest.raises(ValueError, match="identities.json"):
        refresh_acl(tmp_path)
    assert auth.acl.read_text() == stale
    assert "readwrite #" not in stale and "user evil" not in stale


def test_refresh_of_a_valid_registry_still_works(tmp_path):
    auth = BrokerAuth(tmp_path)
    auth.enrol(Identity("f/d1", "device"))
    auth.enrol(Identity("coord", "coordinator", fleets=("f",)))
    auth.enrol(Identity("ops", "client", read=("edgerun/v1/f/+/state",)))
    want = auth.acl.read_text()
    auth.acl.write_text("old\n")
    assert auth.refresh_acl() and auth.acl.read_text() == want
    assert not auth.refresh_acl()


def _as_user(uid: int, gid: int, fn) -> tuple[int, str]:
    """Run `fn()` in a forked child with only `uid`/`gid` (no supplementary groups): (exit
    code 0 or 2, what it returned or raised)."""
    import os

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 2
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            try:
                out, code = str(fn()), 0
            except Exception as e:
                out = f"{type(e).__name__}: {e}"
            os.write(w, out.encode()[:4000])
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() != 0,
                    reason="needs root to make a file of another group and drop to a user")
def test_refresh_by_a_user_outside_the_files_group_leaves_it(tmp_path):
    """Old code: the ACL replaced by a user who may write the directory but is not in the
    file's group (the documented `chown ...:mosquitto; chmod 0640`) came out in that user's
    own group, chown failing silently: the broker, reading it through its group, could no
    longer read its ACL at the next reload or start. Now the file is left as it was and the
    refresh fails saying why (the coordinator's start logs it and goes on)."""
    import grp
    import os
    import shutil
    import stat
    import tempfile

    try:
        group = grp.getgrnam("mosquitto").gr_gid
    except KeyError:
        group = 105  # any group `nobody` is not in
    nobody, nogroup = 65534, 65534
    d = tempfile.mkdtemp(prefix="edgerun-acl-")
    try:
        auth = BrokerAuth(d)
        auth.enrol(Identity("f/d1", "device"))
        auth.acl.write_text("# an older version's ACL\n")
        for p in (d, *(os.path.join(d, f) for f in os.listdir(d))):
            os.chown(p, nobody, nogroup)
        os.chown(auth.acl, nobody, group)
        os.chmod(auth.acl, 0o640)
        code, out = _as_user(nobody, nogroup, lambda: refresh_acl(d))
        st = os.stat(auth.acl)
        assert st.st_gid == group and stat.S_IMODE(st.st_mode) == 0o640, (code, out)
        assert code == 2 and "group" in out and "not replaced" in out, out
        assert auth.acl.read_text() == "# an older version's ACL\n"
        assert not os.path.exists(os.path.join(d, "acl.tmp"))
        # root (sudo edgerun fleet acl) keeps owner and group
        assert "rewrote" in refresh_acl(d)
        st = os.stat(auth.acl)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (nobody, group, 0o640)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_planted_tmp_symlink_is_not_followed(tmp_path):
    """Old code: `<acl>.tmp` was opened with O_CREAT|O_TRUNC and then chmod/chown'ed by path:
    a symlink of that name (left by anyone who may write the broker directory, e.g. the
    coordinator's service user) made root's `fleet acl`/`enroll` overwrite the file it
    pointed to and give it the ACL's mode and owner."""
    import os

    auth = BrokerAuth(tmp_path / "broker")
    auth.enrol(Identity("f/d1", "device"))
    auth.acl.write_text("old\n")
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.chmod(victim, 0o600)
    os.symlink(victim, auth.acl.with_name("acl.tmp"))
    assert auth.refresh_acl()
    assert victim.read_text() == "precious\n" and (victim.stat().st_mode & 0o777) == 0o600
    assert not auth.acl.is_symlink() and "pattern write" in auth.acl.read_text()
    assert not auth.acl.with_name("acl.tmp").exists()
