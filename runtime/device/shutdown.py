"""The order a clean stop takes the daemon's parts down in, and the wait for the last acks.

Drain in-flight frames first (their results are stored), then what consumes them (local
results), the local API, the background jobs (they stop at their next variant), the
simulator, and, last, the link: the drained frames' results out and acked while the link is
up (bounded), then the offline state and a clean DISCONNECT (else the broker publishes the
will, "connection lost"). Read from the daemon through `StopHost`, what it stops.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from runtime.device.links import Links
    from runtime.frames.pipeline import Pipeline

STOP_FLUSH_S = 5.0  # a clean stop waits this long at most for the last results' acks


class StopHost(Protocol):
    """What a stop takes down, in its order (the daemon's parts)."""

    pipeline: Pipeline
    links: Links  # local results, the local API, the PLC servers, Sparkplug, MQTT, outbox
    profiler: Any  # runtime.device.profiling.Profiler (its `thread`)
    ota: Any  # runtime.device.ota.DeviceOta or None (its `thread`)
    sim: Any  # runtime.device.simdevice.SimulatedDevice or None


def await_acks(links: Links, timeout_s: float = STOP_FLUSH_S) -> None:
    """Wait, at most `timeout_s`, until the coordinator has acked every stored result; at
    once when the broker is not reached (they stay in the outbox for the next start)."""
    deadline = time.monotonic() + timeout_s
    pub = links.publisher
    while (pub is not None and pub.session_ready
           and links.outbox.stats()["results_held"] and time.monotonic() < deadline):
        time.sleep(0.05)


def stop_steps(d: StopHost) -> list[tuple[str, Callable[[], Any]]]:
    """(what, how to stop it) for every part running, in the order they stop."""
    links = d.links
    steps: list[tuple[str, Callable[[], Any]]] = [("the pipeline", d.pipeline.stop)]
    if d.ota is not None:  # an engine call still running at exit aborts the process
        steps.append(("the probation's shadow loads", d.ota.stop_loads))
    if links.local:
        steps.append(("local results", links.local.stop))  # what the drained frames made
    if links.local_api:
        steps.append(("the local API", links.local_api.stop))
    if links.plc:  # [opcua], [modbus]: after the pipeline (the last verdicts)
        steps.append(("the PLC servers", links.plc.stop))
    if d.profiler.thread is not None:
        # It stops at its next variant (progress raises Stopping); an engine call that is
        # still running when the interpreter exits aborts the process.
        steps.append(("re-profiling", lambda: d.profiler.thread.join(60)))
    if d.ota is not None and d.ota.thread is not None:
        # a model install stops at its next variant, too
        steps.append(("a model install", lambda: d.ota.thread.join(60)))
    if d.sim:
        steps.append(("the simulator", d.sim.stop))
    if links.sparkplug:  # its NDEATH, after the drained frames' results went out
        steps.append(("Sparkplug", links.sparkplug.stop))
    if links.publisher:
        steps.append(("the last acks", lambda: await_acks(links)))
        steps.append(("MQTT", links.publisher.stop))
    return steps
