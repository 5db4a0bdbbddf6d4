"""Small HTTP helpers: GET with a token, a /metrics scrape and its samples."""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

TOKEN = "t" * 32  # the API token the /metrics tests serve with


def http_get(url: str, token: str, rng: str = "") -> tuple[int, dict, bytes]:
    """(status, headers, body) of a GET with a bearer token and an optional Range."""
    headers = {"Authorization": f"Bearer {token}"}
    if rng:
        headers["Range"] = rng
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers)) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def scrape(port: int, token: str | None = TOKEN) -> tuple[int, str]:
    """(status, body) of GET /metrics."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, labels): value} parsed by prometheus_client's parser."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def dev(name: str, device: str, **labels: str) -> tuple[str, frozenset]:
    """The `samples()` key of a per-device metric."""
    return name, frozenset({"device": device, **labels}.items())


def gauges(text: str) -> dict[str, float]:
    """{sample name: value} of an exposition with one device, parsed by prometheus_client."""
    return {s.name: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.labels.get("device") == "box1"}
