"""A stream's URL as the daemon quotes it: credentials redacted, a long one cut (table), and
the errors of both stream readers opening a 5000-character URL at a port that refuses."""

from __future__ import annotations

import socket

import pytest

from runtime.config.source import SourceConfig
from runtime.frames.frame import SourceError
from runtime.frames.sources import open_source
from runtime.frames.stream_url import SHOWN_MAX, redact, shown

LONG = "a" * 5000


@pytest.mark.parametrize(("url", "expected"), [
    ("rtsp://10.0.0.21/s1", "rtsp://10.0.0.21/s1"),
    ("rtsp://op:pw@10.0.0.21/s1", "rtsp://***@10.0.0.21/s1"),
    ("rtsp://10.0.0.21/" + "a" * 183, "rtsp://10.0.0.21/" + "a" * 183),  # 200: whole
    ("rtsp://10.0.0.21/" + "a" * 184, "rtsp://10.0.0.21/" + "a" * 183 + "...(201 characters)"),
    # redacted before it is cut: credentials past the cut never show, whole or in part
    ("rtsp://op:" + "p" * 300 + "@cam/x", "rtsp://***@cam/x"),
    ("rtsp://op:pw@cam/" + LONG, ("rtsp://***@cam/" + LONG)[:SHOWN_MAX] + "...(5015 characters)"),
])
def test_a_url_is_shown_redacted_and_cut(url, expected):
    assert shown(url) == expected
    assert len(shown(url)) <= SHOWN_MAX + 30


def test_redact_hides_user_and_password():
    assert redact("http://u:p@h/x and rtsp://v@h2/y") == "http://***@h/x and rtsp://***@h2/y"


@pytest.mark.parametrize(("url", "expected"), [
    # FFmpeg takes the last '@' before the path as the end of the credentials, so a
    # password holding '@' works with the camera: it was shown from its '@' on
    ("rtsp://admin:p@ss@10.0.0.21/s1", "rtsp://***@10.0.0.21/s1"),
    ("rtsp://admin:a@b@c@cam:554/s1?x=a@b", "rtsp://***@cam:554/s1?x=a@b"),
    ("rtsp://admin:p@ss@cam/" + "a" * 300, ("rtsp://***@cam/" + "a" * 300)[:SHOWN_MAX]
     + "...(315 characters)"),
    # no credentials: an '@' in the path or the query is the path's
    ("rtsp://cam/a@b", "rtsp://cam/a@b"),
    ("rtsp://cam?u=a@b", "rtsp://cam?u=a@b"),
])
def test_a_password_holding_an_at_sign_is_redacted_whole(url, expected):
    assert shown(url) == expected
    assert "ss@" not in shown(url) and "b@c" not in shown(url)

@pytest.mark.parametrize(("url", "expected"), [
    # cameras that take the credentials in the path or the query (Xiongmai's, many NVRs')
    ("rtsp://10.0.0.5:554/user=admin&password=s3cret&channel=1&stream=0.sdp?",
     "rtsp://10.0.0.5:554/user=admin&password=***&channel=1&stream=0.sdp?"),
    ("http://cam/video.cgi?loginuse=admin&loginpas=s3cret", "http://cam/video.cgi?loginuse="
     "admin&loginpas=***"),
    ("rtsp://cam/live?PWD=s3cret;x=1", "rtsp://cam/live?PWD=***;x=1"),
    ("rtsp://cam/live?passwd=s3cret", "rtsp://cam/live?passwd=***"),
    ("rtsp://cam/compass=north", "rtsp://cam/compass=north"),  # not a password
])
def test_a_password_in_the_path_or_query_is_redacted(url, expected):
    assert shown(url) == expected and "s3cret" not in shown(url)



_NO_PYAV = pytest.mark.skipif(
    not __import__("runtime.frames.av_source", fromlist=["x"]).pyav_available(),
    reason="PyAV is not installed")


@pytest.mark.parametrize("decoder", ["opencv", pytest.param("pyav", marks=_NO_PYAV),
                                     pytest.param("rtp", marks=_NO_PYAV)])
def test_an_error_quotes_a_5000_character_url_cut_and_redacted(tmp_path, decoder):
    """A camera URL of 5000 characters (a token in its path) at a port that refuses: the one
    SourceError quotes it cut to SHOWN_MAX characters with its length said, its credentials
    redacted (it was quoted whole: 5000 characters in every error, log line and event of every
    re-open)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there: refused at once
    url = f"rtsp://op:s3cret-pw@127.0.0.1:{port}/{LONG}"
    with pytest.raises(SourceError) as e:
        open_source(SourceConfig(kind="capture", path=url, open_timeout_s=2, decoder=decoder),
                     tmp_path)
    msg = str(e.value)
    assert msg.startswith(f"source.path 'rtsp://***@127.0.0.1:{port}/aaa"), msg[:300]
    assert f"({len(redact(url))} characters)" in msg and len(msg) < 400, (len(msg), msg[:300])
    assert "s3cret-pw" not in msg
