"""Broker identities in Mosquitto's own formats: its password file and its ACL file.

edgerun never authenticates MQTT clients itself; it writes the two files Mosquitto reads
(`password_file`, `acl_file`) and Mosquitto enforces them. A broker directory holds:

    passwd            Mosquitto password file, PBKDF2-SHA512 (`$7$`, what mosquitto_passwd
                      writes by default since 2.0)
    acl               Mosquitto ACL file, generated from identities.json (edits are overwritten)
    identities.json   who is enrolled, with which role (no secrets)

Username convention: a device D of fleet F logs in as `F/D`, so one set of `pattern` lines with
`%u` confines every device to `edgerun/v1/F/D/...`; Mosquitto refuses pattern substitution
only for usernames containing `+` or `#`, which names never do (see `check_name`). Coordinators
and other clients log in with a name without `/` (their pattern expansions are not topics the
fleet uses) and get explicit `user` blocks.

Client ids are bound to identities: the broker configuration (`conf_lines`) sets Mosquitto's
`use_username_as_clientid`, so every connection's client id is its username and nobody can
take over another identity's session (a device connecting with the coordinator's client id
gets its own session, `F/D`). A process that keeps more than one connection gives each its
own identity, `<username>+<purpose>` (`connection_username`): same password, a `user` block
with exactly the topics of that connection (a `+` in a username also turns Mosquitto's `%u`
patterns off for it). docs/security.md says why this and not dynamic security or `%c`.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import secrets
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from runtime.config.telemetry import BrokerConfig, check_name
from runtime.durable import write_atomic

log = logging.getLogger("edgerun.brokerauth")

PREFIX = "edgerun/v1"
# bundle/req and bundle/chunk: model bundles over MQTT (runtime/ota/bundle_mqtt.py)
DEVICE_PUBLISHES = ("state", "result", "health", "event", "cmd/reply", "result/each",
                    "bundle/req")
DEVICE_SUBSCRIBES = ("cmd", "ack", "bundle/chunk")
ROLES = ("device", "coordinator", "client")
# the extra connections each role keeps, by purpose (connection_username): a device's bundle
# download over MQTT and its MQTT trigger source; a coordinator's bundle chunk server; a
# client's credentials given to a device's trigger source; a device's Sparkplug B edge node
# (its own will, the NDEATH: runtime/telemetry/sparkplug/)
PURPOSES = {"device": ("bundles", "trigger", "sparkplug"), "coordinator": ("bundles",),
            "client": ("trigger",)}
_PBKDF2_ITERATIONS = 1000  # passwords are 256-bit random: iterations only slow the broker


def device_username(fleet: str, device: str) -> str:
    """The broker username of device `device` in fleet `fleet`: `fleet/device`."""
    for what, value in (("fleet", fleet), ("device", device)):
        if why := check_name(what, value):
            raise ValueError(why)
    return f"{fleet}/{device}"


def connection_username(username: str, purpose: str = "") -> str:
    """The broker username of one connection of `username`: itself for its main connection,
    `<username>+<purpose>` for another (PURPOSES; enrolled with the same password)."""
    return f"{username}+{purpose}" if purpose else username


def for_connection(broker: BrokerConfig, purpose: str) -> BrokerConfig:
    """`broker` logging in as the `purpose` connection of its identity (unchanged when it
    logs in anonymously: an open test broker)."""
    if not broker.username:
        return broker
    return replace(broker, username=connection_username(broker.username, purpose))


def new_password() -> str:
    """A random broker password (256 bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


def hash_password(password: str, salt: bytes | None = None,
                  iterations: int = _PBKDF2_ITERATIONS) -> str:
    """The password in Mosquitto's `$7$` format: PBKDF2-HMAC-SHA512, base64 salt and hash."""
    salt = salt if salt is not None else os.urandom(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    return (f"$7${iterations}${base64.b64encode(salt).decode()}"
            f"${base64.b64encode(digest).decode()}")


@dataclass(frozen=True)
class Identity:
    """One enrolled broker user and what the ACL grants it beyond its role."""

    username: str
    role: str  # device | coordinator | client
    fleets: tuple[str, ...] = ()  # coordinator: the fleets it serves
    read: tuple[str, ...] = ()  # extra topic filters it may receive (e.g. a trigger topic)
    write: tuple[str, ...] = ()  # extra topics it may publish


def acl_text(identities: list[Identity]) -> str:
    """The Mosquitto ACL file for these identities (patterns for devices, user blocks else)."""
    lines = ["# Generated by edgerun (`edgerun fleet enroll`); edits here are overwritten.",
             "# Devices log in as <fleet>/<device>: these patterns confine each device to its",
             "# own topics. Anything not granted is denied; anonymous clients are refused by",
             "# `allow_anonymous false` in mosquitto.conf.", ""]
    lines += [f"pattern write {PREFIX}/%u/{kind}" for kind in DEVICE_PUBLISHES]
    lines += [f"pattern read {PREFIX}/%u/{kind}" for kind in DEVICE_SUBSCRIBES]
    for ident in sorted(identities, key=lambda i: i.username):
        block = []
        if ident.role == "coordinator":
            for fleet in ident.fleets:
                block += [f"topic write {PREFIX}/{fleet}/+/cmd",
                          f"topic write {PREFIX}/{fleet}/+/ack",
                          f"topic write {PREFIX}/{fleet}/+/bundle/chunk",
                          f"topic read {PREFIX}/{fleet}/+/#"]
        block += [f"topic read {t}" for t in ident.read]
        block += [f"topic write {t}" for t in ident.write]
        if block:
            lines += ["", f"user {ident.username}", *block]
        for purpose, grants in _connection_grants(ident).items():
            if grants:
                lines += ["", f"user {connection_username(ident.username, purpose)}",
                          *grants]
    return "\n".join(lines) + "\n"


def _connection_grants(ident: Identity) -> dict[str, list[str]]:
    """The ACL lines of each extra connection of `ident` (PURPOSES): exactly its topics."""
    if ident.role == "device":
        own = f"{PREFIX}/{ident.username}"
        fleet, _, device = ident.username.partition("/")
        spb = f"spBv1.0/{fleet}"  # group id = fleet, edge node id = device ([sparkplug])
        return {"bundles": [f"topic write {own}/bundle/req", f"topic read {own}/bundle/chunk"],
                "trigger": [f"topic read {t}" for t in ident.read],
                "sparkplug": [f"topic write {spb}/+/{device}", f"topic write {spb}/+/{device}/+",
                              f"topic read {spb}/NCMD/{device}",
                              f"topic read {spb}/DCMD/{device}/+", "topic read spBv1.0/STATE/+"]}
    if ident.role == "coordinator":
        return {"bundles": [line for fleet in ident.fleets for line in (
            f"topic read {PREFIX}/{fleet}/+/bundle/req",
            f"topic write {PREFIX}/{fleet}/+/bundle/chunk")]}
    return {"trigger": [f"topic read {t}" for t in ident.read]}


def passwd_text(identities: dict[str, Identity], hashes: dict[str, str]) -> str:
    """The password file: each user's hash, and the same hash for each of its connections'
    usernames (connection_username), so one password logs in every connection."""
    rows = dict(hashes)
    for u, ident in identities.items():
        if u in hashes:
            for purpose in PURPOSES.get(ident.role, ()):
                rows[connection_username(u, purpose)] = hashes[u]
    return "".join(f"{u}:{h}\n" for u, h in sorted(rows.items()))


def _check_topic(topic: str) -> None:
    if not topic or any(c in topic for c in "\n\r\0") or topic.startswith("$"):
        raise ValueError(f"not a usable topic filter: {topic!r}")


def check_identity(ident: Identity, policy: bool = True) -> None:
    """ValueError when `ident` is not one `enrol` accepts (its username, fleets and topics
    go into the ACL file as they are). `policy=False`: its names and topics only, not the
    rule an older version did not have (a write topic reaching the fleet's)."""
    if ident.role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {ident.role!r}")
    if ident.role == "device":
        fleet, _, device = ident.username.partition("/")
        device_username(fleet, device)  # validates both parts
    elif why := check_name("username", ident.username):
        raise ValueError(why)
    for f in ident.fleets:
        if why := check_name("fleet", f):
            raise ValueError(why)
    for t in (*ident.read, *ident.write):
        _check_topic(t)
    if policy and ident.role != "coordinator":
        # A camera's or a device's extra write topic reaching the fleet's own would let it
        # publish results, health and acks as any device (the ACL patterns confine devices
        # to their own; this would undo that).
        for t in ident.write:
            if reaches_fleet_topics(t):
                raise ValueError(f"write topic {t!r} reaches the fleet's own topics "
                                 f"({PREFIX}/<fleet>/<device>/...): {ident.username} could "
                                 "publish results, health and acks as any device; give it a "
                                 "topic of its own (e.g. plc/line1/trigger)")


def reaches_fleet_topics(topic: str) -> bool:
    """Whether an ACL filter can match a topic under `edgerun/v1/<fleet>/<device>/` ('#',
    'edgerun/#', '+/v1/+/+/result', ...)."""
    levels = topic.split("/")
    for want in (*PREFIX.split("/"), "+", "+"):  # fleet and device levels: anything
        if not levels:
            return False  # the filter ends above the device topics
        level = levels.pop(0)
        if level == "#":
            return True
        if level not in ("+", want) and want != "+":
            return False
    return bool(levels)


def _write_like(path: Path, text: str, mode: int) -> None:
    """Replace `path` atomically (runtime.durable: a `<path>.tmp` symlink left in the
    directory is never followed), keeping the mode and group of the file it replaces (so a
    `root:mosquitto 0640` file stays readable by the broker). The temporary file is set up
    through its descriptor: root running `fleet acl` or `enroll` never chmods or chowns a
    path someone else could have swapped."""

    def like_the_old(fd: int) -> None:
        if not path.exists():
            os.fchmod(fd, mode)
            return
        st = path.stat()
        os.fchmod(fd, st.st_mode & 0o777)
        try:
            os.fchown(fd, st.st_uid, st.st_gid)
        except PermissionError:  # not root: the file becomes ours; its group stays
            try:
                os.fchown(fd, -1, st.st_gid)  # a group we are in
            except PermissionError:
                # the broker reads it through that group (docs/security.md:
                # root:mosquitto 0640): a file of our group would lock it out at its next
                # reload
                raise PermissionError(
                    f"{path}: not replaced: it belongs to group {_group(st.st_gid)}, which "
                    "this user is not in, and the new file would not (the broker reads it "
                    "through its group); run this as root (`sudo edgerun fleet acl "
                    "--broker-dir DIR`) or as a member of that group") from None

    write_atomic(path, text, setup=like_the_old, tmp=path.with_name(path.name + ".tmp"))


def _group(gid: int) -> str:
    """A group's name (its number when it has none)."""
    import grp

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


class BrokerAuth:
    """The broker directory (see module docstring); every change rewrites `passwd` and `acl`."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory).expanduser()
        self.passwd = self.dir / "passwd"
        self.acl = self.dir / "acl"
        self._registry = self.dir / "identities.json"

    def registered(self) -> bool:
        """Whether `edgerun fleet enroll` has enrolled anyone here (its registry exists)."""
        return self._registry.exists()

    def identities(self, policy: bool = True) -> dict[str, Identity]:
        """Everyone enrolled, by username; each checked as `enrol` checks it (the ACL is made
        from these: a name or topic with a newline, `#` or `+` where enrol never puts one
        would widen what someone may read or write), ValueError naming the file otherwise.
        `policy=False`: names and topics checked, not the write-topic rule (for a revocation,
        which only narrows the ACL: one an older version enrolled and this one refuses is
        what to revoke)."""
        if not self._registry.exists():
            return {}
        doc = json.loads(self._registry.read_text())
        out = {}
        for u, d in doc.items():
            lists = {k: d.get(k, []) for k in ("fleets", "read", "write")}
            if any(not isinstance(v, list) or not all(isinstance(x, str) for x in v)
                   for v in lists.values()):
                raise ValueError(f"{self._registry}: {u!r}: fleets, read and write must be "
                                 "lists of strings")
            ident = Identity(username=u, role=d["role"], **{k: tuple(v) for k, v in
                                                            lists.items()})
            try:
                check_identity(ident, policy)
            except ValueError as e:
                raise ValueError(f"{self._registry}: {u[:80]!r} is not an identity `edgerun "
                                 f"fleet enroll` makes ({e}); fix or remove it") from None
            out[u] = ident
        return out

    def _hashes(self) -> dict[str, str]:
        """The password file's users and hashes, without the connections' usernames (they
        are written from their identity's: passwd_text)."""
        if not self.passwd.exists():
            return {}
        out = {}
        for line in self.passwd.read_text().splitlines():
            user, sep, h = line.partition(":")
            if sep and user and not line.startswith("#") and "+" not in user:
                out[user] = h
        return out

    def enrol(self, ident: Identity, password: str | None = None) -> str:
        """Add or replace `ident` with a new password (random unless given); returns it."""
        check_identity(ident)
        self.dir.mkdir(parents=True, exist_ok=True)
        password = password or new_password()
        with self._locked():
            self._enrol_locked(ident, password)
        return password

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One writer at a time: two enrolments at once must not lose one's user."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _enrol_locked(self, ident: Identity, password: str) -> None:
        idents = self.identities()
        old = idents.get(ident.username)
        if old and old.role != ident.role:
            # e.g. a camera enrolled as `coordinator` replaced the coordinator's password and
            # ACL: after the broker's reload the fleet had no coordinator
            raise ValueError(f"{ident.username!r} is already enrolled as a {old.role}; "
                             f"enrolling it as a {ident.role} would replace its password and "
                             f"ACL. Choose another name, or revoke it first (`edgerun fleet "
                             f"revoke {ident.username}`)")
        if old and old.role == "coordinator" and ident.role == "coordinator":
            ident = Identity(ident.username, "coordinator",
                             tuple(dict.fromkeys(old.fleets + ident.fleets)),
                             tuple(dict.fromkeys(old.read + ident.read)),
                             tuple(dict.fromkeys(old.write + ident.write)))
        idents[ident.username] = ident
        hashes = self._hashes()
        hashes[ident.username] = hash_password(password)
        self._save(idents, hashes)

    def remove(self, username: str) -> bool:
        """Revoke a user (password and ACL lines); True when it existed."""
        with self._locked():
            # without the write-topic rule: a revocation only narrows the ACL, and an identity
            # an older version enrolled and this one refuses (a write topic reaching the
            # fleet's) is what the refusal says to remove, it and any other such one
            idents, hashes = self.identities(policy=False), self._hashes()
            had_ident = idents.pop(username, None) is not None
            had_hash = hashes.pop(username, None) is not None
            self._save(idents, hashes)
        return had_ident or had_hash

    def _save(self, idents: dict[str, Identity], hashes: dict[str, str]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        _write_like(self.passwd, passwd_text(idents, hashes), 0o600)
        _write_like(self.acl, acl_text(list(idents.values())), 0o600)
        _write_like(self._registry, json.dumps(
            {u: {k: v for k, v in asdict(i).items() if k != "username"}
             for u, i in sorted(idents.items())}, indent=1) + "\n", 0o600)

    def ensure(self) -> bool:
        """Create the (empty) files when missing, so a broker can start before enrolment, and
        bring an existing ACL up to date (`refresh_acl`). True when the ACL was rewritten."""
        if not (self.passwd.exists() and self.acl.exists() and self._registry.exists()):
            with self._locked():
                self._save(self.identities(), self._hashes())
            return False
        return self.refresh_acl()

    def refresh_acl(self) -> bool:
        """Regenerate the ACL from identities.json when it differs from what this version
        writes (an ACL written by an older version lacks the topics added since, e.g. the
        bundle topics of bundles over MQTT, until someone is enrolled again): atomically,
        keeping the file's mode and group. True when it was rewritten (the broker reads it
        at its next start or reload, SIGHUP); False when it is up to date, or when there is
        no identities.json (an ACL edgerun did not generate is never touched)."""
        if not self._registry.exists():
            return False
        self._refresh_passwd()
        want, have = self._acl_now()
        if have == want:  # the usual case: no lock taken, nothing written
            return False
        with self._locked():
            want, have = self._acl_now()  # again: an enrolment may have just rewritten it
            if have == want:
                return False
            _write_like(self.acl, want, 0o600)
        missing = sorted(set(want.splitlines()) - set((have or "").splitlines()) - {""})
        log.warning("broker ACL %s %s: regenerated from %s (mode and group kept; %d lines "
                    "added%s); the broker applies it at its next start or reload (`systemctl "
                    "reload mosquitto`)",
                    self.acl, "was missing" if have is None else
                    "was out of date (written by an older version, or edited)",
                    self._registry.name, len(missing),
                    f", e.g. {missing[0]!r}" if missing else "")
        return True

    def _refresh_passwd(self) -> None:
        """Give the connections' usernames (connection_username) their identity's hash when
        a password file written by an older version lacks them; mode and group kept."""
        if not self.passwd.exists():
            return
        try:
            want = passwd_text(self.identities(), self._hashes())
        except (ValueError, KeyError, TypeError, AttributeError):
            return  # _acl_now names what is wrong with identities.json
        if self.passwd.read_text() == want:
            return
        with self._locked():
            want = passwd_text(self.identities(), self._hashes())
            if self.passwd.read_text() != want:
                _write_like(self.passwd, want, 0o600)
                log.warning("broker password file %s: added the usernames of the identities' "
                            "extra connections (<username>+bundles, +trigger: each connection "
                            "is its own identity, docs/security.md); the broker reads it at its "
                            "next start or reload", self.passwd)

    def _acl_now(self) -> tuple[str, str | None]:
        """(the ACL the identities give, the ACL file's text or None when there is none);
        ValueError naming the file when identities.json is not readable as one."""
        try:
            want = acl_text(list(self.identities().values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            if isinstance(e, ValueError) and str(self._registry) in str(e):
                raise  # says already which identity and why
            raise ValueError(f"{self._registry}: not a list of identities "
                             f"({type(e).__name__}: {e})") from None
        try:
            return want, self.acl.read_text()
        except FileNotFoundError:
            return want, None

    def conf_lines(self) -> str:
        """The mosquitto.conf lines that make the broker use these files."""
        # use_username_as_clientid: a client id is usable by its owner only (module docstring)
        return (f"allow_anonymous false\npassword_file {self.passwd}\n"
                f"acl_file {self.acl}\nuse_username_as_clientid true\n")


def write_secret(path: str | Path, secret: str) -> Path:
    """Write a secret file readable only by its owner (mode 0600 from creation)."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    os.chmod(path, 0o600)
    return path

