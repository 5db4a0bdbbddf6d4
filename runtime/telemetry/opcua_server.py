"""The PLC's OPC UA server (`[opcua]`, docs/plc.md): Objects/edgerun/<source>/ with the last
verdict, counters, the rung and model, health; on a PLC-triggered source a `Trigger()` method
and a writable `PartPresent`, whose rising edges become frames (runtime/frames/edges.py).

asyncua runs in a thread of its own with its own event loop (plc_thread.py, shared with the
Modbus server); the daemon talks to it through
a narrow interface, from any thread, without waiting on it:

- `tap(sink)`: the pipeline's result sink, wrapped: after the results are stored, their
  verdicts are handed to the loop (`call_soon_threadsafe`: a few microseconds a batch on the
  infer thread) and written by one writer task in order, FrameId last;
- `edges`: the board the PLC-triggered sources take their edges from;
- `start(health)`: `health()` (runtime/device/health.py's message) is read every
  `health_interval_s` in a worker thread for the rung, model and health variables.

Clients are bounded and confined: at most `max_sessions` sessions (the next CreateSession is
answered BadTooManySessions), every write is checked against opcua_view.WRITABLE (only
PartPresent, typed; anything else BadNotWritable or BadTypeMismatch, never an exception), and
no client is an administrator (no node can be added or removed).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

try:
    from asyncua import Server, ua
    from asyncua.common.utils import ServiceError
    from asyncua.crypto.permission_rules import User, UserRole
    from asyncua.server.internal_server import InternalServer
    from asyncua.server.internal_session import InternalSession
except ImportError as e:  # an optional extra: the daemon says so as a config error
    raise ImportError(f"[opcua] enabled needs the asyncua package ({e}): pip install "
                      "'edgerun[opcua]'") from e

from runtime.config.opcua import OpcUaConfig
from runtime.frames.edges import EdgeBoard
from runtime.telemetry import opcua_view as view
from runtime.telemetry.plc_thread import LoopServer, require_loopback
from runtime.wire.quarantine import RateLimitedLog

log = logging.getLogger("edgerun.opcua")
NAMESPACE = "urn:edgerun:plc"


def _vt(name: str) -> ua.VariantType:
    return getattr(ua.VariantType, name)


_ZERO: dict[str, Any] = {"Boolean": False, "String": "", "Double": math.nan, "Int32": 0,
                         "UInt32": 0, "UInt64": 0,
                         "DateTime": datetime(1601, 1, 1, tzinfo=UTC)}  # OPC UA's "never"


class _Secrets:
    """What the security settings point at, read once at construction so a bad file fails
    the daemon's start (naming the key) before minutes of profiling."""

    def __init__(self, cfg: OpcUaConfig):
        self.password = b""
        self.certificate = self.private_key = b""
        self.trusted: set[bytes] = set()  # client certificates, DER
        if cfg.security == "none":
            return
        self.certificate = _read(cfg.certificate, "opcua.certificate")
        self.private_key = _read(cfg.private_key, "opcua.private_key")
        if cfg.password_file:
            self.password = _read(cfg.password_file, "opcua.password_file").strip()
            if not self.password:
                raise ValueError(f"opcua.password_file {cfg.password_file}: empty")
        if cfg.trusted_certs:
            d = Path(cfg.trusted_certs).expanduser()
            if not d.is_dir():
                raise ValueError(f"opcua.trusted_certs {d}: not a directory")
            for p in sorted(d.iterdir()):
                if p.suffix.lower() in (".der", ".pem", ".crt"):
                    self.trusted.add(_der(_read(str(p), "opcua.trusted_certs"), p))
            if not self.trusted:
                raise ValueError(f"opcua.trusted_certs {d}: no .der, .pem or .crt certificate")


def _read(path: str, key: str) -> bytes:
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as e:
        raise ValueError(f"{key} {path}: {e.strerror or e}") from e


def _der(data: bytes, where: Path) -> bytes:
    """A certificate file's DER bytes (PEM decoded)."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    try:
        cert = (x509.load_pem_x509_certificate(data) if data.lstrip().startswith(b"-----")
                else x509.load_der_x509_certificate(data))
    except ValueError as e:
        raise ValueError(f"opcua.trusted_certs {where}: not a certificate ({e})") from e
    return cert.public_bytes(Encoding.DER)


class _Users:
    """Who may open a session: anyone on a loopback server without security; else the
    configured user name with its password, or a trusted client certificate. Every client
    is a plain user (never an administrator: the address space cannot be changed)."""

    def __init__(self, cfg: OpcUaConfig, secrets: _Secrets):
        self._cfg, self._secrets = cfg, secrets

    def get_user(self, iserver: Any, username: str | None = None, password: str | None = None,
                 certificate: Any = None) -> User | None:
        """The user of a session's identity token, or None (BadUserAccessDenied)."""
        if self._cfg.security == "none":
            return User(role=UserRole.User, name="loopback")
        if username is not None and self._cfg.username:
            pw = password.encode() if isinstance(password, str) else (password or b"")
            name_ok = hmac.compare_digest(username.encode(), self._cfg.username.encode())
            if name_ok and hmac.compare_digest(pw, self._secrets.password):
                return User(role=UserRole.User, name=username)
            return None
        if certificate is not None and self._secrets.trusted:
            from cryptography.hazmat.primitives.serialization import Encoding

            der = certificate if isinstance(certificate, bytes) else certificate.public_bytes(
                Encoding.DER)
            if der in self._secrets.trusted:
                return User(role=UserRole.User, name="certificate")
        return None


class _GuardedSession(InternalSession):
    """A client's session: its writes pass `_Guard` first (see module doc)."""

    guard: _Guard

    async def write(self, params: ua.WriteParameters) -> list[ua.StatusCode]:
        """Refuse what the guard refuses; write the rest (keeping the order of the answers)."""
        results: list[ua.StatusCode | None] = []
        allowed = []
        for wv in params.NodesToWrite:
            code = self.guard.check(wv)
            results.append(None if code is None else ua.StatusCode(code))
            if code is None:
                allowed.append(wv)
        if allowed:
            done = iter(await super().write(ua.WriteParameters(NodesToWrite=allowed)))
            results = [r if r is not None else next(done) for r in results]
        return [r for r in results if r is not None]


class _Server(InternalServer):
    """asyncua's internal server with a bound on sessions and guarded client sessions."""

    def __init__(self, users: _Users, max_sessions: int, guard: _Guard,
                 shelf: Path | None = None):
        super().__init__(user_manager=users)  # type: ignore[arg-type]
        self.max_sessions, self.guard, self.shelf = max_sessions, guard, shelf
        self.sessions: set[int] = set()  # ids of the client sessions open now
        self.by_peer: dict[str, InternalSession] = {}  # a connection's session now
        self.refused_sessions = 0
        self.max_connections = max_sessions + 10  # sockets too (a few mid-handshake)
        # asyncua's 600 s default kept a dropped PLC's slot for ten minutes: a PLC that
        # rebooted a few times locked itself out
        self.max_session_timeout_ms = 60_000

    async def load_standard_address_space(self, shelf_file: Path | None = None) -> None:
        """From the shelf on disk, node by node as asked (opcua_aspace.py), when there is
        one; else built in memory. (asyncua's own shelf check knows only some dbm backends'
        file names, hence this.)"""
        if self.shelf is not None:
            self.aspace.load_aspace_shelf(self.shelf)
        else:
            await super().load_standard_address_space()

    def create_session(self, name: str, user: User = User(role=UserRole.Anonymous),  # noqa: B008
                       external: bool = False) -> InternalSession:
        """A new session; BadTooManySessions past max_sessions (external ones only)."""
        if external and (old := self.by_peer.pop(name, None)) is not None:
            # asyncua replaces a connection's session on each CreateSession without closing
            # the one before: closed here, or one client could hold every slot for good
            self.unregister_external_session(old)
            asyncio.get_running_loop().create_task(old.close_session(delete_subs=True))
        if external and len(self.sessions) >= self.max_sessions:
            self.refused_sessions += 1
            self.guard.said.log("sessions", "OPC UA: refused a session from %s: %d are open, "
                                "the bound ([opcua] max_sessions)", name, len(self.sessions))
            raise ServiceError(ua.StatusCodes.BadTooManySessions)
        if not external:
            return super().create_session(name, user, external)
        s = _GuardedSession(self, self.aspace, self.subscription_service, name, user=user,
                            external=True)
        s.guard = self.guard
        self.by_peer[name] = s
        return s

    def register_external_session(self, session: InternalSession) -> None:
        """Count it (made in InternalSession's constructor)."""
        super().register_external_session(session)
        self.sessions.add(id(session))

    def unregister_external_session(self, session: InternalSession) -> None:
        """Closed (asyncua calls this once per session)."""
        super().unregister_external_session(session)
        self.sessions.discard(id(session))
        if self.by_peer.get(session.name) is session:
            del self.by_peer[session.name]


class _Guard:
    """The write check of every client write, and the edges PartPresent makes. Runs on the
    server's loop, synchronously: the old value, the edge and the new value are one step."""

    def __init__(self, edges: EdgeBoard):
        self.edges = edges
        self.writable: dict[ua.NodeId, tuple[str, str]] = {}  # node -> (source, path)
        self.present: dict[str, bool] = dict.fromkeys(edges.sources, False)
        self.refused = 0
        self.said = RateLimitedLog(log)

    def check(self, wv: ua.WriteValue) -> int | None:
        """The status code refusing this write, or None (accepted; an edge was queued)."""
        where = self.writable.get(wv.NodeId)
        variant = wv.Value.Value if wv.Value is not None else None
        if where is None or wv.AttributeId != ua.AttributeIds.Value or wv.IndexRange:
            code = "BadNotWritable"
        elif variant is None:
            code = "BadTypeMismatch"
        else:
            code = view.check_write(where[1], variant.VariantType.name, variant.Value)
        if code is None:
            source, _ = where  # type: ignore[misc]
            old, new = self.present[source], bool(variant.Value)  # type: ignore[union-attr]
            if view.rising(old, new) and self.edges.push(source, "PartPresent") is None:
                code = "BadResourceUnavailable"  # max_pending edges wait: not lost, refused
            else:
                self.present[source] = new
                return None
        self.refused += 1
        self.said.log("write", "OPC UA: refused a write to %s: %s", wv.NodeId.to_string(), code)
        return getattr(ua.StatusCodes, code)


class PlcServer(LoopServer):
    """The `[opcua]` server (see module doc). `sources`: every source's name; `triggered`:
    those with `trigger = "opcua"`."""

    protocol, title = "opcua", "OPC UA"

    def __init__(self, cfg: OpcUaConfig, sources: list[str], triggered: list[str],
                 state_dir: Path | None = None):
        require_loopback(cfg.host, cfg.security != "none",
                         f'opcua.security "none" only on loopback, host is {cfg.host!r}')
        super().__init__(cfg.host, cfg.port, log)
        self.cfg = cfg
        self.state_dir = state_dir  # where the standard address space is shelved (None: not)
        self._shelf: Path | None = None
        self.sources = list(sources)
        self.edges = EdgeBoard(triggered, cfg.max_pending)
        self._secrets = _Secrets(cfg)
        self._guard = _Guard(self.edges)
        self._results: asyncio.Queue | None = None
        self._known = set(self.sources)
        self._counts = {s: {"Results": 0, "Ok": 0, "Nok": 0} for s in self.sources}
        self._shown: dict[ua.NodeId, Any] = {}
        self._health: Callable[[], dict[str, Any]] = dict
        self._said = RateLimitedLog(log)
        self.server: Server | None = None
        self.posted = 0  # results handed to the loop

    # -- the daemon's side (any thread) -------------------------------------------------------

    def start(self, health: Callable[[], dict[str, Any]]) -> None:
        """Run the server in its thread; returns once it listens. ValueError when it cannot
        (port taken, bad certificate), naming the key."""
        self._health = health
        if self.state_dir is not None:  # the first start makes it (seconds, once)
            import asyncua

            from runtime.telemetry.opcua_aspace import shelf
            self._shelf = shelf(self.state_dir, getattr(asyncua, "__version__", "unknown"))
        self.start_loop()
        log.info("OPC UA server on %s (%s, %d sources, %d PLC-triggered)", self.endpoint,
                 self.cfg.security, len(self.sources), len(self.edges.sources))

    @property
    def endpoint(self) -> str:
        """The endpoint URL clients connect to."""
        host = f"[{self.cfg.host}]" if ":" in self.cfg.host else self.cfg.host
        return f"opc.tcp://{host}:{self.port}/"

    def post(self, results: list[dict[str, Any]]) -> None:
        """Hand stored results to the server's writer (never blocks; dropped before start)."""
        q = self._results
        items = [(r["source"], str(r.get("ref", "")), str(r.get("label", "")),
                  float(r.get("score") or 0.0), float(r.get("t") or 0.0),
                  float(r.get("e2e_ms") or math.nan))
                 for r in results if r.get("source") in self._known]
        if not items or self._loop is None or q is None:
            return
        self.posted += len(items)
        self.call_soon(q.put_nowait, items)

    def stats(self) -> dict[str, Any]:
        """Sessions, refusals and edges (tests and the log)."""
        srv = self.server.iserver if self.server else None
        return {"sessions": len(srv.sessions) if isinstance(srv, _Server) else 0,
                "sessions_refused": srv.refused_sessions if isinstance(srv, _Server) else 0,
                "writes_refused": self._guard.refused,
                "edges": dict(self.edges.accepted), "edges_refused": dict(self.edges.refused)}

    # -- the server's thread -----------------------------------------------------------------

    async def _open(self) -> list[Coroutine[Any, Any, None]]:
        self._results = asyncio.Queue()
        server = await self._build()
        await server.start()
        self.server = server
        if server.bserver is not None:
            self.port = server.bserver.port  # the one chosen, for port 0
        return [self._write_results(), self._refresh()]

    async def _close(self) -> None:
        if self.server is not None:
            # asyncua's clock task writes CurrentTime, then sleeps a second; its stop() waits
            # for that sleep to end. Cancelled here, a stop (the daemon's, a reload's) takes
            # milliseconds, not up to a second.
            clock = getattr(self.server.iserver, "time_task", None)
            if clock is not None:
                clock.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await clock
                self.server.iserver.time_task = None
            await self.server.stop()

    async def _build(self) -> Server:
        cfg = self.cfg
        for name, level in (("asyncua", logging.WARNING),
                            # a refused request is logged per request by asyncua: a client
                            # could fill the journal; edgerun says it, rate-limited
                            ("asyncua.server.uaprocessor", logging.CRITICAL),
                            ("asyncua.server.internal_session", logging.CRITICAL),
                            ("asyncua.server.address_space", logging.ERROR),
                            ("asyncua.server.binary_server_asyncio", logging.ERROR)):
            logging.getLogger(name).setLevel(level)
        server = Server(iserver=_Server(_Users(cfg, self._secrets), cfg.max_sessions,
                                        self._guard, self._shelf))
        await server.init()
        server.set_endpoint(self.endpoint)
        server.set_server_name("edgerun")
        await server.set_application_uri("urn:edgerun:opcua")
        server.allow_remote_admin(False)
        if cfg.security == "none":
            server.set_security_policy([ua.SecurityPolicyType.NoSecurity])
            server.set_identity_tokens([ua.AnonymousIdentityToken])
        else:
            await server.load_certificate(self._secrets.certificate,
                                          _fmt(self._secrets.certificate))
            await server.load_private_key(self._secrets.private_key, None,
                                          _fmt(self._secrets.private_key))
            server.set_security_policy([ua.SecurityPolicyType.Basic256Sha256_SignAndEncrypt])
            server.set_identity_tokens(
                ([ua.UserNameIdentityToken] if cfg.username else [])
                + ([ua.X509IdentityToken] if self._secrets.trusted else []))
        idx = await server.register_namespace(NAMESPACE)
        root = await server.nodes.objects.add_folder(ua.NodeId("edgerun", idx),
                                                   ua.QualifiedName("edgerun", idx))
        await self._add_vars(root, idx, "", view.DEVICE_VARIABLES)
        for s in self.sources:
            folder = await root.add_folder(ua.NodeId(s, idx), ua.QualifiedName(s, idx))
            variables = dict(view.SOURCE_VARIABLES)
            if s in self.edges.sources:
                variables.update(view.TRIGGER_VARIABLES)
                await folder.add_method(
                    ua.NodeId(f"{s}.Trigger", idx), ua.QualifiedName("Trigger", idx),
                    self._trigger_of(s), [], [_arg("FrameId", ua.ObjectIds.String,
                                                   "the frame this edge makes: LastResult."
                                                   "FrameId once its verdict is written")])
            await self._add_vars(folder, idx, s, variables)
            if s in self.edges.sources:
                node = ua.NodeId(f"{s}.PartPresent", idx)
                await server.get_node(node).set_writable()
                self._guard.writable[node] = (s, "PartPresent")
        self._idx = idx
        return server

    async def _add_vars(self, parent: Any, idx: int, source: str, variables: dict[str, str]
                        ) -> None:
        """Variables (with a folder per dotted prefix: LastResult, Counts, Health, Device)."""
        folders: dict[str, Any] = {}
        for path, type_name in variables.items():
            *group, leaf = path.split(".")
            at = parent
            if group:
                g = group[0]
                if g not in folders:
                    fid = ua.NodeId(f"{source}.{g}" if source else g, idx)
                    try:
                        folders[g] = await parent.add_folder(fid, ua.QualifiedName(g, idx))
                    except ua.UaStatusCodeError:  # Counts exists already (trigger counters)
                        folders[g] = self.server_node(parent, fid)
                at = folders[g]
            nid = ua.NodeId(f"{source}.{path}" if source else path, idx)
            await at.add_variable(nid, ua.QualifiedName(leaf, idx), _ZERO[type_name],
                                  _vt(type_name))

    @staticmethod
    def server_node(parent: Any, nid: ua.NodeId) -> Any:
        """The node `nid` through `parent`'s session."""
        from asyncua import Node

        return Node(parent.session, nid)

    def _trigger_of(self, source: str) -> Callable[..., Any]:
        async def trigger(parent: ua.NodeId, *args: Any) -> Any:
            """Trigger(): one edge; returns its FrameId (the verdict comes in LastResult)."""
            if args:
                return ua.StatusCode(ua.StatusCodes.BadTooManyArguments)
            edge = self.edges.push(source, "Trigger")
            if edge is None:
                self._said.log("full", "OPC UA: Trigger on %s refused: %d edges wait for "
                               "their capture ([opcua] max_pending)", source,
                               self.edges.pending(source))
                return ua.StatusCode(ua.StatusCodes.BadResourceUnavailable)
            return [ua.Variant(edge.ref, ua.VariantType.String)]
        return trigger

    async def _set(self, path: str, value: Any, type_name: str, force: bool = False) -> None:
        """Write one variable (server side), unless it already shows `value`."""
        nid = ua.NodeId(path, self._idx)
        if not force and self._shown.get(nid, _ZERO) == value and nid in self._shown:
            return
        if isinstance(value, float) and math.isnan(value) and isinstance(
                self._shown.get(nid), float) and math.isnan(self._shown[nid]) and not force:
            return
        self._shown[nid] = value
        assert self.server is not None
        await self.server.write_attribute_value(
            nid, ua.DataValue(ua.Variant(value, _vt(type_name)),
                              SourceTimestamp=datetime.now(UTC)))

    async def _write_results(self) -> None:
        """The one writer of LastResult and the result counters, in the results' order. What
        piled up meanwhile is taken at once: every result is counted, LastResult shows what
        view.to_show says (a free-running source's newest), the counters once a source."""
        assert self._results is not None
        types = view.SOURCE_VARIABLES
        while True:
            items = list(await self._results.get())
            while not self._results.empty():
                items.extend(self._results.get_nowait())
            try:
                show = view.to_show([it[0] for it in items], self._guard.present)
                touched: dict[str, None] = {}
                for (source, ref, label, score, t, e2e_ms), shown in zip(items, show,
                                                                         strict=True):
                    word, ok = view.verdict(label, self.cfg.ok_labels)
                    c = self._counts[source]
                    c["Results"] += 1
                    c["Ok" if ok else "Nok"] += 1
                    touched[source] = None
                    if not shown:
                        continue
                    p = f"{source}.LastResult."
                    for leaf, value in (("Verdict", word), ("Ok", ok), ("Class", label),
                                        ("Score", score),
                                        ("Time", datetime.fromtimestamp(t, UTC)),
                                        ("E2eMs", e2e_ms)):
                        await self._set(p + leaf, value, types["LastResult." + leaf], True)
                    await self._set(p + "FrameId", ref, "String", True)  # last: all in place
                for source in touched:
                    c = self._counts[source]
                    for k in ("Results", "Ok", "Nok"):
                        await self._set(f"{source}.Counts.{k}", c[k], "UInt64")
                    if source in self._guard.present:
                        await self._edge_counts(source)
            except Exception:  # one bad batch costs itself, never the writer
                self._said.log("write", "OPC UA: could not show a result", exc_info=True)

    async def _edge_counts(self, source: str) -> None:
        await self._set(f"{source}.Counts.Triggers", self.edges.accepted[source], "UInt64")
        await self._set(f"{source}.Counts.TriggersRefused", self.edges.refused[source],
                        "UInt64")
        await self._set(f"{source}.Counts.Pending", self.edges.pending(source), "UInt32")

    async def _refresh(self) -> None:
        """Every health_interval_s: the health-fed variables (health() in a worker thread:
        it reads the daemon's parts, and the loop must keep serving meanwhile)."""
        while True:
            try:
                h = await asyncio.to_thread(self._health)
                srv = self.server.iserver if self.server else None
                n = len(srv.sessions) if isinstance(srv, _Server) else 0
                for path, value in view.device_values(h, n).items():
                    await self._set(path, value, view.DEVICE_VARIABLES[path])
                for s in self.sources:
                    for path, value in view.source_values(h, s).items():
                        await self._set(f"{s}.{path}", value, view.SOURCE_VARIABLES[path])
                    if s in self._guard.present:
                        await self._edge_counts(s)
            except Exception:  # health failing (start-up, a bug) costs this refresh only
                self._said.log("health", "OPC UA: could not refresh from health",
                               exc_info=True)
            await asyncio.sleep(self.cfg.health_interval_s)


def _arg(name: str, type_id: int, doc: str) -> ua.Argument:
    a = ua.Argument()
    a.Name, a.DataType, a.ValueRank = name, ua.NodeId(type_id), -1
    a.Description = ua.LocalizedText(doc)
    return a


def _fmt(content: bytes) -> str:
    """asyncua's format hint for a key or certificate file's bytes (PEM is text)."""
    return "pem" if content.lstrip().startswith(b"-----") else "der"


def open_plc(cfg: Any) -> PlcServer | None:
    """The `[opcua]` server of a daemon's config (not started), or None when it is off."""
    if not cfg.opcua.enabled:
        return None
    sources = cfg.sources or (cfg.source,)
    names = [s.name or "main" for s in sources]
    return PlcServer(cfg.opcua, names, [s.name or "main" for s in sources
                                        if s.trigger == "opcua"], Path(cfg.daemon.state_dir))
