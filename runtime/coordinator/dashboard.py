"""The fleet dashboard: static HTML/JS served by the coordinator's API server, and the JSON the
pages read that the rest of the API does not already give (a device's health timeline).

No build step: `static/` holds the page, its script and style, and uPlot (vendored with its
licence, `static/vendor/uplot/VERSION`). The static files hold no fleet data and are served
without the token; every number on the page comes from `/api/v1/...` with the token the
operator types into the page (kept in the tab's sessionStorage and sent as
`Authorization: Bearer`, never a cookie, never in the HTML). A header-only token is what
makes the command buttons safe against cross-site request forgery: another site's page can
make the browser send a form or an image request, but not one carrying this header, and the
API answers no CORS preflight. See docs/dashboard.md.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

STATIC = Path(__file__).parent / "static"
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".png": "image/png", ".svg": "image/svg+xml",
          ".txt": "text/plain; charset=utf-8"}
# Served as they are; anything not listed here (LICENSE, VERSION are text) is 404.
_FILES = {"/": "index.html", "/static/app.js": "app.js", "/static/style.css": "style.css",
          "/static/vendor/uplot/uPlot.iife.min.js": "vendor/uplot/uPlot.iife.min.js",
          "/static/vendor/uplot/uPlot.min.css": "vendor/uplot/uPlot.min.css",
          "/static/vendor/uplot/LICENSE": "vendor/uplot/LICENSE",
          "/static/vendor/uplot/VERSION": "vendor/uplot/VERSION"}
# The page runs only its own script; nothing may frame it (clickjacking on the buttons).
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; "
                               "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

# The timeline (Store.TIMELINE columns) and the aggregate over a time bucket: temperature
# and latency take the bucket's maximum and the rung its minimum, so a short excursion
# towards a trip or a brief step down is not averaged away on a long window.
HISTORY = (
    ("temp_c", "MAX"), ("passive_trip_c", "MAX"), ("rung", "MIN"), ("rungs", "MAX"),
    ("p95_ms", "MAX"), ("target_ms", "MAX"), ("rate_hz", "AVG"), ("accuracy", "MIN"),
    ("power_w", "AVG"), ("rung_energy_mj", "AVG"), ("battery_frac", "AVG"),
    ("harvest_w", "AVG"),
)
MAX_POINTS = 600
MIN_WINDOW_S = 60


class HistoryQueryError(ValueError):
    """A history request the API refuses (400)."""


def static_file(path: str) -> tuple[bytes, str] | None:
    """(body, content type) of a dashboard file by URL path, or None when it is not one.
    Only the fixed list above is served: a request path never becomes a file path."""
    name = _FILES.get(path)
    if name is None:
        return None
    file = STATIC / name
    ctype = _TYPES.get(file.suffix, "text/plain; charset=utf-8")
    return file.read_bytes(), ctype


def history_window(query: str, keep_s: float) -> float:
    """The validated `window_s` of a history request (default one hour, at most what the
    store keeps)."""
    pairs = parse_qsl(query, keep_blank_values=True)
    names = [k for k, _ in pairs]
    if set(names) - {"window_s"} or len(names) != len(set(names)):
        raise HistoryQueryError("the only query parameter is window_s (once)")
    if not pairs:
        return 3600.0
    text = pairs[0][1]
    if not text.isdigit() or len(text) > 9:
        raise HistoryQueryError(f"window_s must be whole seconds, got {text[:40]!r}")
    hi = max(MIN_WINDOW_S, int(keep_s))
    if not MIN_WINDOW_S <= int(text) <= hi:
        raise HistoryQueryError(f"window_s must be in [{MIN_WINDOW_S}, {hi}], got {text}")
    return float(text)


def history(coordinator: Any, device: str, window_s: float, now: float | None = None
            ) -> dict[str, Any]:
    """A device's health timeline over the last `window_s` as columns (what uPlot plots):
    `t` (device clock, the newest in each bucket) and one list per HISTORY name, None where
    the field was absent. Raises UnknownDevice for a device never heard from."""
    now = time.time() if now is None else now
    if device not in coordinator.views:  # one dict lookup: the views are replaced whole
        from runtime.coordinator.service import UnknownDevice

        raise UnknownDevice(device)
    since = now - window_s
    until = now + coordinator.cfg.future_skew_s  # a device clock a little ahead still shows
    rows = coordinator.store.health_series(device, since, until, HISTORY, MAX_POINTS)
    out: dict[str, Any] = {"device": device, "since": since, "until": now,
                           "bucket_s": window_s / MAX_POINTS, "t": [r[0] for r in rows]}
    for i, (name, _) in enumerate(HISTORY, start=1):
        out[name] = [r[i] for r in rows]
    return out
