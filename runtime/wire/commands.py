"""Signed commands: Ed25519 envelopes with id, issue time and expiry; typed on the device.

Signing uses `cryptography` (pyca, audited and maintained; Ed25519 is not in the standard
library). The signature covers the canonical JSON of every envelope field except `sig`
(sorted keys, no spaces), so a tampered field, a different device or a stretched expiry all
break it. Verification is a pure function of (envelope, trusted keys, now, seen-ids check);
the MQTT thread calls it and hands the typed command to the daemon through a queue.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from runtime.config.constraints import accuracy_floor_problem, latency_target_problem
from runtime.durable import write_atomic
from runtime.wire import payloads
from runtime.wire.clock import CEILING_T

# The longest lifetime (expires_at - issued_at) a device accepts by default: a day. A command
# signed for a century would be answered and its id had to be remembered as long.
DEFAULT_MAX_TTL_S = 86400.0
# A sleeping device's commands wait in its broker session (up to session_expiry_s) and carry
# the coordinator's wake margin on top (runtime/coordinator/service.py send_command).
SLEEP_MARGIN_S = 3600.0


def lifetime_cap(configured_s: float, session_expiry_s: float = 0.0) -> float:
    """The longest command lifetime a device accepts: `[telemetry] max_command_ttl_s`, raised
    for a device whose broker session holds commands longer (a sleeper: `[sleep]
    session_expiry_s`, plus SLEEP_MARGIN_S), so a command queued for its wake still fits."""
    if session_expiry_s > 0:
        return max(configured_s, session_expiry_s + SLEEP_MARGIN_S)
    return configured_s


class CommandRefused(Exception):
    """A command was not accepted; the message is the reason sent back in the reply."""


@dataclass(frozen=True)
class Command:
    """A verified command: what to do, with its validated arguments."""

    id: str
    name: str
    args: dict[str, Any]


def _number(lo: float, hi: float) -> Callable[[Any], float]:
    def check(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
            raise CommandRefused(f"expected a number in {lo}..{hi}, got {v!r}")
        return float(v)
    return check


def _by(rule: Callable[[Any], str | None]) -> Callable[[Any], float]:
    """A validator from a constraints rule (runtime/config/constraints.py): the values the
    config accepts for the field the command sets, no other."""
    def check(v: Any) -> float:
        if (problem := rule(v)) is not None:
            raise CommandRefused(problem)
        return float(v)
    return check


def _name(v: Any) -> str:
    if not isinstance(v, str) or not 0 < len(v) <= 128 or "/" in v or v.startswith("."):
        raise CommandRefused(f"expected a model name (no '/', not starting with '.'), got {v!r}")
    return v


def _version(v: Any) -> str:
    import re

    if not isinstance(v, str) or not re.match(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}$", v):
        raise CommandRefused(f"expected a version (1-64 of A-Z a-z 0-9 _ . + -), got {v!r}")
    return v


def _url(v: Any) -> str:
    if not isinstance(v, str) or len(v) > 1024 or not v.startswith(("http://", "https://")):
        raise CommandRefused(f"expected an http(s) URL of at most 1024 characters, got "
                             f"{str(v)[:60]!r}")
    return v


def _sha256(v: Any) -> str:
    if not isinstance(v, str) or len(v) != 64 or any(c not in "0123456789abcdef" for c in v):
        raise CommandRefused("expected 64 lowercase hex digits")
    return v


def _token(v: Any) -> str:
    if not isinstance(v, str) or len(v) > 256:
        raise CommandRefused("expected a download token of at most 256 characters")
    return v


def _size(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= 1 << 40:
        raise CommandRefused(f"expected a size in bytes, got {v!r}")
    return v


# command -> {argument: validator}; every argument is required.
COMMANDS: dict[str, dict[str, Callable[[Any], Any]]] = {
    "set_latency_target": {"ms": _by(latency_target_problem)},
    "set_accuracy_floor": {"value": _by(accuracy_floor_problem)},
    "set_rate": {"fps": _number(0.0, 1000.0)},  # 0 = as fast as the source delivers
    "choose_model": {"name": _name},
    # A signed bundle to download, verify, profile and swap to (runtime/device/ota.py).
    "deploy": {"name": _name, "version": _version, "url": _url, "size": _size,
               "sha256": _sha256, "token": _token},
    "reprofile": {},
    "rebirth": {},
    "ping": {},
}


def loggable(args: Mapping[str, Any]) -> dict[str, Any]:
    """Arguments for logs and events: a `deploy`'s download token masked."""
    return {k: ("***" if k == "token" else v) for k, v in args.items()}


def canonical(envelope: Mapping[str, Any]) -> bytes:
    """The signed bytes: every field except `sig`, canonical JSON."""
    body = {k: v for k, v in envelope.items() if k != "sig"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def key_id(public: Ed25519PublicKey) -> str:
    """Short stable id of a public key (first 16 hex of sha256 of its raw bytes)."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def sign(private: Ed25519PrivateKey, device: str, name: str, args: dict[str, Any] | None = None,
         ttl_s: float = 60.0, now: float | None = None) -> dict[str, Any]:
    """A signed command envelope for `device`."""
    issued = time.time() if now is None else now
    env: dict[str, Any] = {
        "v": payloads.VERSION, "id": uuid.uuid4().hex, "device": device, "cmd": name,
        "args": args or {}, "issued_at": issued, "expires_at": issued + ttl_s,
        "key_id": key_id(private.public_key()),
    }
    env["sig"] = base64.b64encode(private.sign(canonical(env))).decode()
    return env


@dataclass(frozen=True)
class Floor:
    """The latest time known to have passed (docs/clocks.md, "Commands while the clock is
    not synced"): a synced wall clock's reading, or a verified command's issue time (the
    coordinator signed it: while this clock is unknown, the coordinator's is the one its
    commands' expiry is judged on), with the kernel boot id and CLOCK_BOOTTIME at
    which it was recorded. Kept with the replay record across restarts. `by` says which
    raised it ("clock", "command"; "" when not known, as in a record an older version
    wrote), so a floor found wrong blames the right clock."""

    t: float = 0.0
    kb: str = ""
    bt: float = 0.0
    by: str = ""

    def now(self, kb: str, bt: float) -> float:
        """A lower bound on the real time now: the floor, advanced by the boottime elapsed
        since when it was recorded in this same kernel boot (after a reboot the time spent
        down is unknown: the floor itself)."""
        if self.t <= 0:
            return 0.0
        return self.t + (bt - self.bt) if kb == self.kb and bt >= self.bt else self.t

    def raised(self, t: float, kb: str, bt: float, by: str = "") -> Floor:
        """This floor or one at `t` (recorded at kb/bt, raised `by`), whichever is later
        now; one as late is taken too: its own `t` is later, which is what survives a reboot.
        Never past CEILING_T (2100): a coordinator whose clock read 2150 once would otherwise
        have every later command judged expired."""
        if not t <= CEILING_T:
            return self
        now = self.now(kb, bt)
        if not (t >= now and t > self.t):
            return self
        # one at this floor's own time carried forward (a command judged against the floor
        # while unsynced) shows nothing new: what raised it stays the one to blame
        return Floor(t, kb, bt, by if t > now else self.by)


FLOOR_SOURCES = ("clock", "command")  # what can raise a Floor (its `by`, floor_source)


def floor_source(synced: bool, judged: float, issued_at: float) -> tuple[float, str]:
    """The time a verified command shows to have passed, and which clock says so (pure):
    a synced clock's judged time; while unsynced, the command's signed issue time where it
    is later (the coordinator's clock), else the floor's own time."""
    if synced or issued_at <= judged:
        return judged, "clock"
    return issued_at, "command"


def floor_blame(by: str) -> str:
    """Why a floor ahead of the synced clock is wrong, by what raised it (for the log)."""
    if by == "clock":
        return ("this clock stepped back since it was synced (a wrong time server, or a "
                "manual step)")
    if by == "command":
        return ("a command signed by a coordinator whose clock was ahead raised it while "
                "this clock was not synced")
    return ("this clock stepped back since it was synced (a wrong time server), or a command "
            "was signed by a coordinator clock ahead")


def floor_wrong(wall: float, synced: bool, floor_now: float, skew_s: float) -> bool:
    """Whether a synced wall clock shows the floor to be wrong (pure): more than `skew_s`
    ahead of it. Raised while unsynced to a command's issue time, the floor is as good as the
    coordinator's clock was; one that read 2099 once would leave it there, and every later
    command would be judged expired."""
    return synced and floor_now > wall + skew_s


def judged_now(wall: float, synced: bool, floor_now: float,
               skew_s: float = float("inf")) -> float:
    """The time a command's expiry is judged against (pure): a synced wall clock (never
    below a time known to have passed, unless that time is more than `skew_s` ahead of it:
    then the floor is wrong, `floor_wrong`, and the wall clock alone decides), else only the
    known-passed time. An unsynced wall clock is never used: at 1970 it would accept
    long-expired commands, at 2100 refuse all, and a remembered id dropped by it could be
    replayed once it stepped back."""
    if not synced:
        return floor_now
    return wall if floor_wrong(wall, synced, floor_now, skew_s) else max(wall, floor_now)


def time_problem(issued_at: float, expires_at: float, wall: float, synced: bool,
                 floor_now: float, skew_s: float) -> str | None:
    """Why a command's times refuse it, or None (pure; table-tested). Synced: expired, or
    issued more than `skew_s` ahead of the clock. Unsynced: expired only by a time known to
    have passed (`floor_now`); the issue time is not judged against a clock that may read
    1970. A replay is refused either way by the id record (`verify`'s `remember`), which
    drops an id only once its expiry is behind the same judged time."""
    now = judged_now(wall, synced, floor_now, skew_s)
    if expires_at < now:
        by = "" if synced else " (by the latest time known to have passed: the clock is " \
            "not synced)"
        return f"expired {now - expires_at:.0f} s ago{by}"
    if synced and issued_at > wall + skew_s:
        return f"issued in the future (clock skew beyond the allowed {skew_s:.0f} s)"
    return None


def verify(envelope: dict[str, Any], device: str, trusted: Mapping[str, Ed25519PublicKey],
           now: float, skew_s: float, remember: Callable[[str, float], bool],
           not_before: float = 0.0, max_ttl_s: float = DEFAULT_MAX_TTL_S,
           synced: bool = True, floor_now: float = 0.0) -> Command:
    """Check an already schema-valid envelope; returns the typed command or raises
    CommandRefused with the reason. `remember(id, expires)` is False for a replayed id;
    commands issued before `not_before` (when the device lost its replay record) are refused,
    and so is one whose lifetime (expires_at - issued_at) exceeds `max_ttl_s`: an id then
    never needs remembering longer than `memory_bound(max_ttl_s, skew_s)` from now.
    `now` is the wall clock; with `synced` False it is not believed and the times are judged
    against `floor_now` instead (time_problem)."""
    if envelope["device"] != device:
        raise CommandRefused(f"addressed to device {envelope['device']!r}, this is {device!r}")
    public = trusted.get(envelope["key_id"])
    if public is None:
        raise CommandRefused(f"unknown signing key {envelope['key_id']!r}")
    try:
        public.verify(base64.b64decode(envelope["sig"], validate=True), canonical(envelope))
    except (InvalidSignature, ValueError):
        raise CommandRefused("bad signature") from None
    lifetime = envelope["expires_at"] - envelope["issued_at"]
    if not lifetime <= max_ttl_s:  # `not <=`: a NaN lifetime is refused too
        raise CommandRefused(f"lifetime {lifetime:.0f} s is over this device's cap of "
                             f"{max_ttl_s:.0f} s ([telemetry] max_command_ttl_s)")
    why = time_problem(envelope["issued_at"], envelope["expires_at"], now, synced, floor_now,
                       skew_s)
    if why:
        raise CommandRefused(why)
    if envelope["issued_at"] < not_before:
        raise CommandRefused("issued before this device's replay record was reset (lost, "
                             "or ids dropped by a wrong clock); send it again")
    typed = check_args(envelope["cmd"], envelope["args"])
    # Last, so a refused command does not burn its id.
    if not remember(envelope["id"], envelope["expires_at"]):
        raise CommandRefused("replayed: this command id was already accepted")
    return Command(envelope["id"], envelope["cmd"], typed)


def check_args(name: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """The one gate every command passes before anything acts on it: `name` is a known
    command and `args` exactly its arguments, each in range (COMMANDS). Returns the typed
    arguments or raises CommandRefused naming the command and the argument. The device runs
    it in `verify` (and again before a handler sees a command), the coordinator before it
    signs one, so its API answers 400 for what every device would refuse."""
    spec = COMMANDS.get(name)
    if spec is None:
        raise CommandRefused(f"unknown command {name!r} (known: {', '.join(COMMANDS)})")
    if not isinstance(args, Mapping):
        raise CommandRefused(f"{name}: arguments must be an object")
    extra = set(args) - set(spec)
    if extra:
        raise CommandRefused(f"{name}: unknown argument(s) {sorted(map(str, extra))}")
    typed = {}
    for arg, check in spec.items():
        if arg not in args:
            raise CommandRefused(f"{name}: missing argument {arg!r}")
        try:
            typed[arg] = check(args[arg])
        except CommandRefused as e:
            raise CommandRefused(f"{name}: {arg}: {e}") from None
    return typed


def memory_bound(max_ttl_s: float, skew_s: float) -> float:
    """Seconds from now past which no accepted command can still be valid: it was issued at
    most `skew_s` ahead and lives at most `max_ttl_s`. A replay record needs no id that
    expires later (verify refuses such a command before asking about its id)."""
    return max_ttl_s + skew_s


def load_public_keys(paths: tuple[str, ...] | list[str]) -> dict[str, Ed25519PublicKey]:
    """Trusted keys from PEM files, by key id; a bad file is an error naming it."""
    keys = {}
    for p in paths:
        path = Path(p).expanduser()
        try:
            key = serialization.load_pem_public_key(path.read_bytes())
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: not a readable PEM public key: {e}") from e
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError(f"{path}: not an Ed25519 public key")
        keys[key_id(key)] = key
    return keys


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """An Ed25519 private key from a PEM file or a raw 32-byte file."""
    path = Path(path).expanduser()
    try:
        data = path.read_bytes()
        key = (Ed25519PrivateKey.from_private_bytes(data) if len(data) == 32
               else serialization.load_pem_private_key(data, password=None))
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"{path}: not a readable PEM private key: {e}") from e
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path}: not an Ed25519 private key")
    return key


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    """An Ed25519 public key from a PEM file or a raw 32-byte file."""
    path = Path(path).expanduser()
    try:
        data = path.read_bytes()
        key = (Ed25519PublicKey.from_public_bytes(data) if len(data) == 32
               else serialization.load_pem_public_key(data))
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"{path}: not a readable public key: {e}") from e
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{path}: not an Ed25519 public key")
    return key


def device_key(configured: str, default: Path) -> Ed25519PrivateKey:
    """The device's reply-signing key: `configured` (must exist) or, when empty, `default`,
    made at first start (mode 0600) with its public half next to it as `<name>.pub`, which
    the coordinator needs as `coordinator.device_keys/<device>.pub`."""
    if configured:
        return load_private_key(configured)
    if not default.exists():
        generate_keypair(default, default.with_suffix(".pub"))
    return load_private_key(default)


def sign_reply(private: Ed25519PrivateKey, reply: dict[str, Any]) -> dict[str, Any]:
    """`reply` with `key_id` and `sig` (Ed25519 over the canonical JSON of every other field,
    which includes the command id and the device, so a reply cannot be moved to another
    command or device)."""
    signed = {**reply, "key_id": key_id(private.public_key())}
    signed["sig"] = base64.b64encode(private.sign(canonical(signed))).decode()
    return signed


def reply_signed_by(reply: Mapping[str, Any], public: Ed25519PublicKey) -> bool:
    """True when `reply` carries a valid signature of `public`."""
    sig = reply.get("sig")
    if not isinstance(sig, str):
        return False
    try:
        public.verify(base64.b64decode(sig, validate=True), canonical(reply))
    except (InvalidSignature, ValueError):
        return False
    return True


def generate_keypair(private_path: Path, public_path: Path, overwrite: bool = True) -> str:
    """Write a new Ed25519 key pair (private file mode 0600); returns the key id. With
    `overwrite` False an existing file (either one) raises FileExistsError and nothing is
    written."""
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    private_path.parent.mkdir(parents=True, exist_ok=True)
    public_path.parent.mkdir(parents=True, exist_ok=True)
    if not overwrite:
        # O_EXCL: created here or refused, even if the file appeared a moment ago
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(private_pem)
        # the public file appears whole or not at all: tools (and coordinators) copy it as
        # soon as it exists, and a copy taken mid-write would hold half a key
        tmp = public_path.with_name(f".{public_path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(public_pem)
        try:
            os.link(tmp, public_path)  # refuses an existing file, like O_EXCL
        except FileExistsError:
            private_path.unlink()  # never leave half a pair behind
            raise
        finally:
            tmp.unlink()
        return key_id(key.public_key())
    # a crash leaves the old pair's file or the new one, never half a key
    write_atomic(private_path, private_pem, mode=0o600)
    write_atomic(public_path, public_pem,
                 tmp=public_path.with_name(f".{public_path.name}.{os.getpid()}.tmp"))
    return key_id(key.public_key())
