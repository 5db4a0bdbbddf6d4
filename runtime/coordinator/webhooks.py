"""Alert transitions leave the building: each one POSTed as JSON to `coordinator.webhook_url`.

The coordinator's loops only ever call `Webhook.submit`, which appends to a bounded queue
and returns at once: a slow, failing or hanging receiver costs this module's own thread,
never MQTT handling or ingest. When the queue is full the oldest waiting alert is dropped
and counted (`dropped`), so a receiver that is down for a day holds memory bounded and the
newest alerts go first once it is back.

Delivery: one POST per alert, in order, each tried up to `webhook_attempts` times. A
connection error, a timeout, 408, 429 or 5xx is retried after a delay that starts at
`webhook_backoff_s` and doubles up to 60 s (the shared schedule, runtime/wire/backoff.py; a
first delay set above 60 s is kept for the first retry); any other answer outside 2xx (a
redirect, 4xx) is the receiver refusing this payload and is not retried. Each alert carries a
unique `id` so a receiver can drop the duplicate a retry after a lost response produces.

With `webhook_secret_file` set, every POST carries `X-Edgerun-Signature: sha256=<hex>`, the
HMAC-SHA256 of the exact body under the secret (docs/dashboard.md shows how to check it).
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import json
import logging
import stat
import threading
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from runtime.config.coordinator import check_url, redacted_url
from runtime.wire.backoff import interval
from runtime.wire.quarantine import RateLimitedLog

log = logging.getLogger("edgerun.webhook")

BACKOFF_MAX_S = 60.0
SIGNATURE_HEADER = "X-Edgerun-Signature"
_RETRY_STATUS = {408, 429}


def retry_delay(failures: int, first_s: float) -> float:
    """The wait after a delivery's `failures`-th failure: `first_s` as configured (the config
    allows up to an hour), then the shared doubling up to BACKOFF_MAX_S."""
    return first_s if failures <= 1 else interval(failures, first_s, BACKOFF_MAX_S)


class SecretError(ValueError):
    """The webhook secret file cannot be used; the text says why and what to do."""


def load_secret(path: str | Path) -> bytes:
    """The HMAC secret from its file: readable by its owner only and at least 16 bytes, so
    it is as well kept as the API token next to it."""
    p = Path(path).expanduser()
    try:
        mode = stat.S_IMODE(p.stat().st_mode)
        secret = p.read_bytes().strip()
    except OSError as e:
        raise SecretError(f"{p}: cannot read the webhook secret: {e.strerror}") from None
    if mode & 0o077:
        raise SecretError(f"{p}: the webhook secret file is mode {mode:o}; it must be "
                          f"readable by its owner only (chmod 600 {p})")
    if len(secret) < 16:
        raise SecretError(f"{p}: the webhook secret is shorter than 16 bytes")
    return secret


def alert_payload(fleet: str, device: str, alert: str, state: str, message: str,
                  status: str, t: float) -> dict[str, Any]:
    """The JSON body of one alert transition (docs/dashboard.md describes each field)."""
    return {"v": 1, "id": uuid.uuid4().hex, "t": round(t, 3), "fleet": fleet,
            "device": device, "alert": alert, "state": state, "message": message,
            "status": status}


def sign(secret: bytes, body: bytes) -> str:
    """The signature header value of `body`: `sha256=` + hex HMAC-SHA256."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is answered as it is (an error): an alert is never re-sent to, or turned
    into a GET for, a URL the operator did not configure."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        """No new request: the 3xx answer is returned as an HTTPError."""
        return None


class Webhook:
    """A background sender of alert payloads to one URL (see module docstring)."""

    def __init__(self, url: str, secret: bytes | None = None, queue_max: int = 1000,
                 timeout_s: float = 5.0, attempts: int = 8, backoff_s: float = 1.0):
        if why := check_url(url):
            raise ValueError(f"webhook_url {why}")
        self.url, self.secret = url, secret
        self.timeout_s, self.attempts, self.backoff_s = timeout_s, max(1, attempts), backoff_s
        self._queue: collections.deque[dict[str, Any]] = collections.deque()
        self._queue_max = max(1, queue_max)
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._opener = urllib.request.build_opener(_NoRedirect())
        self._rlog = RateLimitedLog(log)
        self.counters: collections.Counter = collections.Counter()
        self.last_error = ""

    def start(self) -> Webhook:
        """Start the sender thread."""
        self._thread = threading.Thread(target=self._run, name="webhook", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the sender (a POST in flight may finish within its timeout); alerts still
        queued are dropped and counted, with a log line saying how many."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
        with self._cond:
            left = len(self._queue)
            self._queue.clear()
        if left:
            self.counters["dropped_at_stop"] += left
            log.warning("webhook: stopped with %d alert(s) not yet delivered to %s", left,
                        self.url)

    def alive(self) -> bool:
        """Whether the sender thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, payload: dict[str, Any]) -> None:
        """Queue one alert for delivery; never blocks. A full queue drops its oldest."""
        with self._cond:
            if len(self._queue) >= self._queue_max:
                old = self._queue.popleft()
                self.counters["dropped"] += 1
                self._rlog.log("full", "webhook: queue full (%d); dropped the oldest alert "
                               "(%s %s on %s) undelivered", self._queue_max,
                               old.get("alert"), old.get("state"), old.get("device"),
                               level=logging.WARNING)
            self._queue.append(payload)
            self.counters["queued"] += 1
            self._cond.notify()

    def stats(self) -> dict[str, Any]:
        """Delivery counters, queue depth and the last error (for the API's stats)."""
        with self._cond:
            depth = len(self._queue)
        return {"url": redacted_url(self.url), "queue": depth, "queue_max": self._queue_max,
                **{k: self.counters.get(k, 0) for k in
                   ("queued", "sent", "retries", "failed", "dropped", "dropped_at_stop")},
                "last_error": self.last_error, "alive": self.alive()}

    # -- sender thread --------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                while not self._queue and not self._stop.is_set():
                    self._cond.wait(1.0)
                if self._stop.is_set():
                    return
                payload = self._queue.popleft()
            try:
                self._deliver(payload)
            except Exception as e:  # a bug costs this alert, never the sender
                self.counters["failed"] += 1
                log.exception("webhook: delivering an alert failed unexpectedly: %s", e)

    def _deliver(self, payload: dict[str, Any]) -> None:
        body = json.dumps(payload, separators=(",", ":"), default=str).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "edgerun-coordinator"}
        if self.secret is not None:
            headers[SIGNATURE_HEADER] = sign(self.secret, body)
        for attempt in range(1, self.attempts + 1):
            retry, why = self._post(body, headers)
            if why is None:
                self.counters["sent"] += 1
                return
            self.last_error = why
            if not retry or attempt == self.attempts:
                break
            self.counters["retries"] += 1
            delay = retry_delay(attempt, self.backoff_s)
            self._rlog.log("retry", "webhook: %s; retrying in %.1f s (attempt %d of %d)", why,
                           delay, attempt, self.attempts, level=logging.WARNING)
            if self._stop.wait(delay):
                return  # stopping: stop() counts what is left; this one is lost with them
        self.counters["failed"] += 1
        log.error("webhook: gave up on alert %s %s of %s after %d attempt(s): %s",
                  payload.get("alert"), payload.get("state"), payload.get("device"), attempt,
                  self.last_error)

    def _post(self, body: bytes, headers: dict[str, str]) -> tuple[bool, str | None]:
        """(retry?, error) of one POST; error None = delivered."""
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                resp.read(65536)
                return False, None
        except urllib.error.HTTPError as e:
            retry = e.code >= 500 or e.code in _RETRY_STATUS
            return retry, f"{redacted_url(self.url)} answered HTTP {e.code}"
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            return True, f"{redacted_url(self.url)} unreachable: {reason}"
