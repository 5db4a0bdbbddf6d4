"""A minimal W3C WebDriver client (standard library only) driving Debian's chromium through
its chromedriver, for the dashboard's browser test.

Why not Selenium or Playwright: WebDriver is a small, stable JSON-over-HTTP protocol and the
test needs eight of its commands; chromedriver is the browser's own Debian package. Selenium
would add a dozen packages (trio, websocket, certifi, ...) and a driver-downloading helper
binary, Playwright a 40 MB wheel with its own Node.js; neither would change what is tested.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C key of an element reference
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-dev-shm-usage", "--window-size=1400,1000"]


def find_browser() -> tuple[str, str] | None:
    """(chromium, chromedriver) paths, or None when either is not installed."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (chromium, driver) if chromium and driver else None


class WebDriverError(RuntimeError):
    """chromedriver answered an error; `.error` is the W3C error code."""

    def __init__(self, error: str, message: str):
        super().__init__(f"{error}: {message[:500]}")
        self.error = error


class Browser:
    """One headless chromium session through chromedriver. Chromium is started here, as a
    child of the test's process, and chromedriver attaches to it: chromium started by
    chromedriver outlived a killed test worker (its parent, chromedriver, died of the
    worker's parent-death signal and chromium went on; tests/support/children.py)."""

    def __init__(self, chromium: str, chromedriver: str, workdir: Path):
        self.log = (workdir / "chromedriver.log").open("w")
        self.browser_log = (workdir / "chromium.log").open("w")
        profile = workdir / "chromium-profile"
        # --remote-debugging-port=0: chromium picks a free port and writes it to
        # DevToolsActivePort in its profile dir
        self.browser = subprocess.Popen(
            [chromium, *CHROMIUM_ARGS, f"--user-data-dir={profile}",
             "--remote-debugging-port=0", "about:blank"],
            stdout=self.browser_log, stderr=subprocess.STDOUT)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([chromedriver, f"--port={port}"], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                if self._call("GET", "/status")["ready"]:
                    break
            except (OSError, WebDriverError):
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.quit()
                raise RuntimeError(f"chromedriver did not start; see {workdir}/chromedriver.log")
            time.sleep(0.1)
        devtools = profile / "DevToolsActivePort"
        while not devtools.exists() or not devtools.read_text().strip():
            if time.monotonic() > deadline or self.browser.poll() is not None:
                self.quit()
                raise RuntimeError(f"chromium did not start; see {workdir}/chromium.log")
            time.sleep(0.1)
        caps = {"browserName": "chrome", "goog:chromeOptions": {
            "debuggerAddress": f"127.0.0.1:{devtools.read_text().split()[0]}"}}
        try:
            self.session = self._call("POST", "/session",
                                      {"capabilities": {"alwaysMatch": caps}})["sessionId"]
        except Exception:
            self.quit()
            raise

    def _call(self, method: str, path: str, body: dict | None = None) -> Any:
        data = None if body is None and method == "GET" else json.dumps(body or {}).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.loads(r.read())["value"]
        except urllib.error.HTTPError as e:
            value = json.loads(e.read() or b"{}").get("value", {})
            raise WebDriverError(value.get("error", str(e.code)),
                                 value.get("message", "")) from None

    def _s(self, method: str, path: str, body: dict | None = None) -> Any:
        return self._call(method, f"/session/{self.session}{path}", body)

    def get(self, url: str) -> None:
        """Navigate to `url`."""
        self._s("POST", "/url", {"url": url})

    def find(self, css: str) -> str:
        """The first element matching `css` (WebDriverError 'no such element' if none)."""
        return self._s("POST", "/element", {"using": "css selector", "value": css})[ELEMENT]

    def click(self, css: str) -> None:
        """Click the element at `css` as a user would (retried while the page re-renders it)."""
        for _ in range(20):
            try:
                self._s("POST", f"/element/{self.find(css)}/click")
                return
            except WebDriverError as e:
                if e.error not in ("stale element reference", "no such element"):
                    raise
                time.sleep(0.1)
        raise AssertionError(f"could not click {css}")

    def type(self, css: str, text: str) -> None:
        """Clear the input at `css` and type `text` into it."""
        eid = self.find(css)
        self._s("POST", f"/element/{eid}/clear")
        self._s("POST", f"/element/{eid}/value", {"text": text})

    def js(self, script: str, *args: Any) -> Any:
        """Run `script` (a function body; `arguments` holds args) in the page; its return."""
        return self._s("POST", "/execute/sync", {"script": script, "args": list(args)})

    def text(self, css: str) -> str:
        """textContent of the first element at `css`, "" when there is none (read in one
        script, so a re-render between finding and reading cannot fail it)."""
        return self.js("const e = document.querySelector(arguments[0]); "
                       "return e ? e.textContent : '';", css)

    def wait(self, cond: Callable[[], Any], timeout_s: float, what: str) -> Any:
        """Poll `cond` until it returns something truthy; AssertionError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = cond()
            if got:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
            time.sleep(0.1)

    def screenshot(self, path: Path) -> None:
        """Save a PNG of the viewport."""
        path.write_bytes(base64.b64decode(self._s("GET", "/screenshot")))

    def set_size(self, width: int, height: int) -> None:
        """Resize the window."""
        self._s("POST", "/window/rect", {"width": width, "height": height})

    def quit(self) -> None:
        """End the session, chromedriver and chromium."""
        if getattr(self, "session", None):
            with contextlib.suppress(OSError, WebDriverError):
                self._s("DELETE", "")
        for proc in (self.proc, self.browser):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.log.close()
        self.browser_log.close()
