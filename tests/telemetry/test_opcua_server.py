"""The PLC's OPC UA server against asyncua's own client on loopback: browse, read, subscribe,
Trigger() and its verdict, PartPresent edges, refused writes (wrong type, read-only, unknown
nodes), the session bound, and Basic256Sha256 with a user name and password."""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
from pathlib import Path

import pytest

asyncua = pytest.importorskip("asyncua")  # the `opcua` extra (in `test`)
from asyncua import Client, ua  # noqa: E402
from asyncua.crypto import security_policies  # noqa: E402

from runtime.config.opcua import OpcUaConfig  # noqa: E402
from runtime.telemetry.opcua_server import NAMESPACE, PlcServer  # noqa: E402
from runtime.wire.broker import free_port  # noqa: E402

HEALTH = {"model": "inspection", "choice": "v-top", "rung": 5, "rungs": 5, "temp_c": 51.5,
          "throttled": False, "uptime_s": 12.0, "governor": {"level": 0},
          "pipeline": {"sources": {"main": {"state": "running", "rate_hz": 4.9,
                                            "e2e_p95_ms": 7.5, "model": "inspection",
                                            "variant": "v-top"}}}}


@contextlib.contextmanager
def serving(cfg: OpcUaConfig | None = None, sources=("main", "cam2"), triggered=("main",),
            state_dir: Path | None = None):
    srv = PlcServer(cfg or OpcUaConfig(enabled=True, port=0, health_interval_s=0.1),
                    list(sources), list(triggered), state_dir)
    srv.start(lambda: HEALTH)
    try:
        yield srv
    finally:
        srv.stop()


def node(c: Client, idx: int, path: str):
    return c.get_node(ua.NodeId(path, idx))


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def _wait_value(n, want, timeout_s: float = 5.0):
    for _ in range(int(timeout_s / 0.01)):
        if (v := await n.read_value()) == want:
            return v
        await asyncio.sleep(0.01)
    raise AssertionError(f"{n} never read {want!r}, last {v!r}")


def test_browse_shows_the_tree_with_trigger_only_on_the_triggered_source():
    async def go(srv):
        async with Client(srv.endpoint) as c:
            idx = await c.get_namespace_index(NAMESPACE)
            root = await c.nodes.objects.get_child(f"{idx}:edgerun")
            names = {(await n.read_browse_name()).Name for n in await root.get_children()}
            assert names == {"Device", "main", "cam2"}
            main = {(await n.read_browse_name()).Name
                    for n in await node(c, idx, "main").get_children()}
            assert {"LastResult", "Counts", "Model", "Variant", "Rung", "Rungs", "Health",
                    "Trigger", "PartPresent"} <= main
            cam2 = {(await n.read_browse_name()).Name
                    for n in await node(c, idx, "cam2").get_children()}
            assert "Trigger" not in cam2 and "PartPresent" not in cam2
            last = {(await n.read_browse_name()).Name
                    for n in await node(c, idx, "main.LastResult").get_children()}
            assert last == {"Verdict", "Ok", "Class", "Score", "Time", "FrameId", "E2eMs"}
            # health-fed values, through health() only
            assert await _wait_value(node(c, idx, "main.Rung"), 5) == 5
            assert await node(c, idx, "main.Model").read_value() == "inspection"
            assert await node(c, idx, "main.Health.State").read_value() == "running"
            assert await node(c, idx, "Device.TempC").read_value() == 51.5
            assert math.isnan(await node(c, idx, "cam2.Health.RateHz").read_value())
            assert await _wait_value(node(c, idx, "Device.Sessions"), 1) == 1  # this one
    with serving() as srv:
        run(go(srv))


def test_the_standard_address_space_is_read_from_its_shelf_node_by_node(tmp_path):
    async def go(srv):
        async with Client(srv.endpoint) as c:
            idx = await c.get_namespace_index(NAMESPACE)
            assert await _wait_value(node(c, idx, "main.Rung"), 5) == 5
            status = c.get_node(ua.NodeId(ua.ObjectIds.Server_ServerStatus_State))
            assert await status.read_value() == ua.ServerState.Running  # a standard node
            assert NAMESPACE in await c.get_namespace_array()

    for start in ("makes the shelf", "reads it"):
        with serving(state_dir=tmp_path) as srv:
            assert srv.alive()
            assert list(tmp_path.glob("opcua-aspace-*/aspace*")), start
            nodes = srv.server.iserver.aspace._nodes
            # node by node: only those read so far are in memory, not the ~7,000
            assert type(nodes).__name__ == "LazyLoadingDict" and len(nodes) < 1000, start
            run(go(srv))
        assert not srv.alive()
    assert not list(tmp_path.glob(".opcua-aspace-*"))  # no half-made shelf left behind


def test_a_state_dir_that_refuses_the_shelf_serves_from_memory(tmp_path):
    (tmp_path / "ro").write_text("a file where the folder would be")
    with serving(state_dir=tmp_path / "ro") as srv:
        assert type(srv.server.iserver.aspace._nodes) is dict
        assert len(srv.server.iserver.aspace._nodes) > 1000

        async def go():
            async with Client(srv.endpoint) as c:
                idx = await c.get_namespace_index(NAMESPACE)
                assert await _wait_value(node(c, idx, "main.Rung"), 5) == 5
        run(go())


def test_trigger_returns_the_frame_id_and_the_verdict_comes_back_on_a_subscription():
    async def go(srv):
        async with Client(srv.endpoint) as c:
            idx = await c.get_namespace_index(NAMESPACE)
            seen: asyncio.Queue = asyncio.Queue()

            class Handler:
                def datachange_notification(self, n, val, data):
                    seen.put_nowait(val)

            sub = await c.create_subscription(10, Handler())
            await sub.subscribe_data_change(node(c, idx, "main.LastResult.FrameId"))
            assert await asyncio.wait_for(seen.get(), 5) == ""  # the initial value
            refs = []
            for label in ("ok", "scratch"):
                ref = await node(c, idx, "main").call_method(ua.NodeId("main.Trigger", idx))
                edge = srv.edges.take("main", 5)
                assert edge is not None and edge.ref == ref and edge.via == "Trigger"
                # what the pipeline's sink does once the frame's result is stored
                srv.post([{"source": "main", "ref": ref, "label": label, "score": 0.875,
                           "t": edge.t, "e2e_ms": 9.5}])
                assert await asyncio.wait_for(seen.get(), 5) == ref
                refs.append(ref)
                ok = label == "ok"
                assert await node(c, idx, "main.LastResult.Verdict").read_value() == (
                    "OK" if ok else "NOK")
                assert await node(c, idx, "main.LastResult.Ok").read_value() is ok
                assert await node(c, idx, "main.LastResult.Class").read_value() == label
                assert await node(c, idx, "main.LastResult.Score").read_value() == 0.875
                t = await node(c, idx, "main.LastResult.Time").read_value()
                assert abs(t.timestamp() - edge.t) < 1e-3
            assert refs == ["plc-1", "plc-2"]
            assert await node(c, idx, "main.Counts.Results").read_value() == 2
            assert await node(c, idx, "main.Counts.Nok").read_value() == 1
            assert await node(c, idx, "main.Counts.Triggers").read_value() == 2
            await sub.delete()
    with serving() as srv:
        run(go(srv))


def test_part_present_makes_one_edge_per_rising_edge_only():
    async def go(srv):
        async with Client(srv.endpoint) as c:
            idx = await c.get_namespace_index(NAMESPACE)
            pp = node(c, idx, "main.PartPresent")
            for v in (True, True, False, False, True, False):
                await pp.write_value(v)
            edges = [srv.edges.take("main", 0.1) for _ in range(3)]
            assert [e.via if e else None for e in edges] == ["PartPresent", "PartPresent",
                                                              None]
            assert await pp.read_value() is False
    with serving() as srv:
        run(go(srv))


def test_wrong_types_read_only_and_unknown_nodes_are_refused_with_their_codes():
    async def go(srv):
        async with Client(srv.endpoint) as c:
            idx = await c.get_namespace_index(NAMESPACE)
            pp = node(c, idx, "main.PartPresent")
            for bad in (ua.Variant(1, ua.VariantType.Int32), ua.Variant("true"),
                        ua.Variant(1.0, ua.VariantType.Double),
                        ua.Variant([True], ua.VariantType.Boolean)):
                with pytest.raises(ua.uaerrors.BadTypeMismatch):
                    await pp.write_value(ua.DataValue(bad))
            for path in ("main.LastResult.Verdict", "main.Counts.Results", "Device.TempC",
                         "cam2.Rung"):
                with pytest.raises(ua.uaerrors.BadNotWritable):
                    await node(c, idx, path).write_value(ua.DataValue(ua.Variant(
                        await node(c, idx, path).read_value(),
                        (await node(c, idx, path).read_data_value()).Value.VariantType)))
            # an attribute other than the value, even of the writable node
            with pytest.raises(ua.uaerrors.BadNotWritable):
                await pp.write_attribute(ua.AttributeIds.DisplayName, ua.DataValue(
                    ua.Variant(ua.LocalizedText("x"))))
            # the server's own nodes
            with pytest.raises(ua.uaerrors.BadNotWritable):
                await c.get_node(ua.ObjectIds.Server_ServerStatus_State).write_value(
                    ua.DataValue(ua.Variant(0, ua.VariantType.Int32)))
            with pytest.raises(ua.uaerrors.BadNodeIdUnknown):
                await node(c, idx, "main.Nope").read_value()
            with pytest.raises(ua.uaerrors.BadNotWritable):
                await node(c, idx, "main.Nope").write_value(True)
            with pytest.raises(ua.UaStatusCodeError):  # no client adds nodes
                await node(c, idx, "main").add_variable(ua.NodeId("x", idx), "x", 1.0)
            with pytest.raises(ua.uaerrors.BadTooManyArguments):
                await node(c, idx, "main").call_method(ua.NodeId("main.Trigger", idx), 5)
            # nothing changed, and the server still answers
            assert srv.edges.pending("main") == 0
            assert await pp.read_value() is False
            await pp.write_value(True)
            assert srv.edges.take("main", 1) is not None
    with serving() as srv:
        run(go(srv))
        assert srv.stats()["writes_refused"] >= 9


def test_a_full_edge_queue_refuses_the_trigger_instead_of_losing_it():
    async def go(srv):
        async with Client(srv.endpoint) as c:
            idx = await c.get_namespace_index(NAMESPACE)
            main = node(c, idx, "main")
            assert await main.call_method(ua.NodeId("main.Trigger", idx)) == "plc-1"
            assert await main.call_method(ua.NodeId("main.Trigger", idx)) == "plc-2"
            with pytest.raises(ua.uaerrors.BadResourceUnavailable):
                await main.call_method(ua.NodeId("main.Trigger", idx))
            with pytest.raises(ua.uaerrors.BadResourceUnavailable):
                await node(c, idx, "main.PartPresent").write_value(True)
            assert await node(c, idx, "main.PartPresent").read_value() is False
    cfg = OpcUaConfig(enabled=True, port=0, max_pending=2)
    with serving(cfg) as srv:
        run(go(srv))
        assert srv.edges.refused["main"] == 2
        assert [srv.edges.take("main", 0.1).ref for _ in range(2)] == ["plc-1", "plc-2"]


def test_fifty_sessions_are_held_and_the_fifty_first_is_refused():
    async def go(srv):
        clients = [Client(srv.endpoint, timeout=20) for _ in range(50)]
        try:
            for c in clients:
                await c.connect()
            assert srv.stats()["sessions"] == 50
            extra = Client(srv.endpoint, timeout=20)
            with pytest.raises(ua.uaerrors.BadTooManySessions):
                await extra.connect()
            with contextlib.suppress(Exception):
                await extra.disconnect()
            # the 50 still work, and a closed one makes room
            idx = await clients[0].get_namespace_index(NAMESPACE)
            assert await node(clients[-1], idx, "main.Model").read_value() in ("",
                                                                               "inspection")
            await clients.pop().disconnect()
            late = Client(srv.endpoint, timeout=20)
            await late.connect()
            clients.append(late)
            assert srv.stats()["sessions_refused"] == 1
        finally:
            for c in clients:
                with contextlib.suppress(Exception):
                    await c.disconnect()
    with serving(OpcUaConfig(enabled=True, port=0, max_sessions=50)) as srv:
        run(go(srv))
        assert srv.stats()["sessions"] == 0


def _cert(tmp_path: Path, name: str, uri: str) -> tuple[Path, Path]:
    from asyncua.crypto.cert_gen import generate_private_key, generate_self_signed_app_certificate
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID

    key = generate_private_key()
    cert = generate_self_signed_app_certificate(
        key, name, {}, [x509.UniformResourceIdentifier(uri), x509.DNSName("localhost")],
        [ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH])
    c, k = tmp_path / f"{name}.der", tmp_path / f"{name}.pem"
    c.write_bytes(cert.public_bytes(serialization.Encoding.DER))
    k.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.TraditionalOpenSSL,
                                    serialization.NoEncryption()))
    return c, k


def test_sessions_a_client_abandons_free_their_slot_for_the_plc():
    """asyncua replaces a connection's session on each CreateSession without closing the one
    before: three on one connection, never activated, then a disconnect, held two of three
    slots for good (the review's reproduction), and a PLC was refused until a restart."""
    async def go(srv):
        c = Client(srv.endpoint, timeout=20)
        await c.connect_socket()
        await c.send_hello()
        await c.open_secure_channel()
        for _ in range(3):
            await c.create_session()  # never activated, the same connection
        assert srv.stats()["sessions"] == 1
        await c.close_secure_channel()
        c.disconnect_socket()
        for _ in range(200):
            if srv.stats()["sessions"] == 0:
                break
            await asyncio.sleep(0.01)
        assert srv.stats()["sessions"] == 0
        plc = Client(srv.endpoint, timeout=20)
        await plc.connect()  # the PLC gets in
        await plc.disconnect()

    with serving(OpcUaConfig(enabled=True, port=0, max_sessions=3)) as srv:
        run(go(srv))


def test_basic256sha256_with_a_password_admits_the_right_login_only(tmp_path):
    cert, key = _cert(tmp_path, "server", "urn:edgerun:opcua")
    ccert, ckey = _cert(tmp_path, "plc", "urn:plc:client")
    (tmp_path / "pw").write_text("s3cret\n")
    cfg = OpcUaConfig(enabled=True, port=free_port(), security="basic256sha256",
                      certificate=str(cert), private_key=str(key), username="plc",
                      password_file=str(tmp_path / "pw"))

    async def client(user: str | None, pw: str | None, secure: bool = True) -> Client:
        c = Client(srv.endpoint, timeout=20)
        if secure:
            await c.set_security(security_policies.SecurityPolicyBasic256Sha256, str(ccert),
                                 str(ckey), server_certificate=str(cert))
        if user is not None:
            c.set_user(user)
            c.set_password(pw or "")
        return c

    async def go():
        good = await client("plc", "s3cret")
        async with good:
            idx = await good.get_namespace_index(NAMESPACE)
            assert await node(good, idx, "main").call_method(
                ua.NodeId("main.Trigger", idx)) == "plc-1"
        for user, pw, secure, why in (
                ("plc", "wrong", True, "BadUserAccessDenied"),
                ("other", "s3cret", True, "BadUserAccessDenied"),
                (None, None, True, "BadIdentityTokenRejected"),  # anonymous
                ("plc", "s3cret", False, "No matching endpoints")):  # unencrypted
            c = await client(user, pw, secure)
            with pytest.raises(Exception) as e:  # a status code, or the client refuses
                await c.connect()
            assert why in f"{type(e.value).__name__} {e.value}"
            with contextlib.suppress(Exception):
                await c.disconnect()

    with serving(cfg) as srv:
        run(go())


def test_security_none_off_loopback_is_refused_by_the_server_too():
    with pytest.raises(ValueError, match="loopback"):
        PlcServer(OpcUaConfig(enabled=True, host="0.0.0.0"), ["main"], [])


def test_a_port_in_use_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        srv = PlcServer(OpcUaConfig(enabled=True, port=s.getsockname()[1]), ["main"], [])
        with pytest.raises(ValueError, match="cannot serve on 127.0.0.1"):
            srv.start(dict)
