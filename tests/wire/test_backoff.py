"""The one retry schedule (runtime/wire/backoff.py): the waits, as tables, and the jitter's
bounds; its users (MQTT reconnects, source re-opens, variant switches, webhooks) wait what
it says."""

from __future__ import annotations

import random

import pytest

from runtime.coordinator.webhooks import retry_delay
from runtime.device.switch_retry import Failing, failed
from runtime.wire import mqtt
from runtime.wire.backoff import Backoff, interval


@pytest.mark.parametrize("first_s, cap_s, want", [
    (0.5, 30.0, [0.5, 1, 2, 4, 8, 16, 30, 30, 30]),        # MQTT reconnects, file sources
    (0.5, 5.0, [0.5, 1, 2, 4, 5, 5, 5, 5, 5]),             # a camera's short cap
    (1.0, 300.0, [1, 2, 4, 8, 16, 32, 64, 128, 256]),      # a failing variant switch
    (1.0, 60.0, [1, 2, 4, 8, 16, 32, 60, 60, 60]),         # webhook retries
    (50.0, 30.0, [30] * 9),                                # a first wait over the cap: the cap
    (0.0, 30.0, [0] * 9),                                  # no wait at all
])
def test_the_wait_doubles_per_failure_up_to_the_cap(first_s, cap_s, want):
    assert [interval(n, first_s, cap_s) for n in range(1, 10)] == want


@pytest.mark.parametrize("failures, want", [
    (0, 0.5),           # nothing failed yet: the first wait
    (1, 0.5),
    (17, 30.0),
    (10**6, 30.0),      # a failure that lasts for ever neither overflows nor grows
])
def test_a_long_series_stays_at_the_cap(failures, want):
    assert interval(failures, 0.5, 30.0) == want


class _Edge(random.Random):
    """Draws the lower or the upper end of every range asked for."""

    def __init__(self, upper: bool):
        super().__init__(0)
        self.upper = upper

    def uniform(self, a: float, b: float) -> float:
        """One end of [a, b]."""
        return b if self.upper else a


@pytest.mark.parametrize("upper, want", [
    (True, [0.5, 1, 2, 4, 8, 16, 30, 30]),
    (False, [0.25, 0.5, 1, 2, 4, 8, 15, 15]),
])
def test_jittered_delays_lie_in_the_upper_half_of_the_wait(upper, want):
    b = Backoff(0.5, 30.0, rng=_Edge(upper))
    assert [b.next_delay() for _ in range(8)] == want
    assert b.attempts == 8


def test_a_reset_starts_the_series_afresh():
    b = Backoff(0.5, 30.0, rng=_Edge(True))
    for _ in range(5):
        b.next_delay()
    b.reset()
    assert (b.attempts, b.next_delay()) == (0, 0.5)


def test_seeded_draws_repeat_and_stay_in_bounds():
    one, two = Backoff(rng=random.Random(7)), Backoff(rng=random.Random(7))
    a, b = [one.next_delay() for _ in range(20)], [two.next_delay() for _ in range(20)]
    assert a == b
    assert all(interval(n, 0.5, 30.0) / 2 <= d <= interval(n, 0.5, 30.0)
               for n, d in enumerate(a, 1))


def test_the_mqtt_connection_and_the_switch_retry_use_the_one_schedule():
    assert mqtt.Backoff is Backoff
    f, delays = Failing(), []
    for _ in range(11):
        f, _ = failed(f, "v1", 0.0)
        delays.append(f.delay_s)
    assert delays == [interval(n, 1.0, 300.0) for n in range(1, 12)]


@pytest.mark.parametrize("first_s, want", [
    (1.0, [1, 2, 4, 8, 16, 32, 60, 60]),
    (0.05, [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4]),
    (100.0, [100, 60, 60, 60, 60, 60, 60, 60]),  # a first delay over the cap is kept, once
])
def test_webhook_retries_wait_the_configured_first_delay_then_the_schedule(first_s, want):
    assert [retry_delay(n, first_s) for n in range(1, 9)] == pytest.approx(want)
