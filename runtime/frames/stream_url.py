"""A stream's URL as the daemon says it (credentials redacted, length capped) and why its host
does not resolve: shared by both live stream readers (capture_source.py, av_source.py) and
the config check (source_check.py)."""

from __future__ import annotations

import re
import threading

SHOWN_MAX = 200  # characters of a URL quoted in an error, a log line or an event


def redact(url: str) -> str:
    """A URL fit for logs and events: `user:password@` becomes `***@`. Up to the last '@'
    before the path, query or fragment, as FFmpeg splits it: a password holding an '@'
    works with the camera, and was shown from that '@' on. A password given in the path or
    the query (`password=`, `passwd=`, `pwd=`, `loginpas=`: cameras that take it there,
    Xiongmai's `/user=admin&password=...&channel=1`) becomes `***` too."""
    url = re.sub(r"(?<=://)[^/?#\s]*@", "***@", url)
    return _PASSWORD_PARAM.sub(r"\1***", url)


_PASSWORD_PARAM = re.compile(r"(?i)([/?&;](?:password|passwd|pwd|loginpas)=)[^&;#\s]*")


def shown(url: str, limit: int = SHOWN_MAX) -> str:
    """The URL as quoted in errors and logs: redacted, then cut to `limit` characters with
    its full length said. Why: a 5000-character path was quoted whole in every error, log
    line and `source_failed` event of every re-open; redacted before it is cut, so a cut
    inside the credentials cannot leave them unredacted."""
    url = redact(url)
    if len(url) <= limit:
        return url
    return f"{url[:limit]}...({len(url)} characters)"


def unresolved(url: str, timeout_s: float = 3.0) -> str:
    """Why a stream URL's host name does not resolve, or "" (it resolves, is an address, has
    no host, or the DNS gave no answer within `timeout_s`). FFmpeg says no more than
    "Input/output error" (PyAV) or "failed" (OpenCV, which read as refused credentials) for a
    name the DNS does not know: a typo, or a camera not yet in the DNS. Asked in a thread of
    its own: getaddrinfo has no timeout of its own."""
    import ipaddress
    import socket
    import urllib.parse

    try:
        host = urllib.parse.urlsplit(url).hostname
        if not host:
            return ""
        ipaddress.ip_address(host)
        return ""
    except ValueError:  # a name, not an address (or a URL that does not parse)
        if not host:
            return ""
    why: list[str] = []

    def look() -> None:
        try:
            socket.getaddrinfo(host, None)
        except socket.gaierror as e:
            why.append(str(e.strerror or e))
        except (OSError, UnicodeError):  # not the name's fault (or not a name at all)
            pass

    t = threading.Thread(target=look, name="resolve", daemon=True)
    t.start()
    t.join(timeout_s)
    return f"the host name {shown(host, 100)!r} does not resolve ({why[0]})" if why else ""
