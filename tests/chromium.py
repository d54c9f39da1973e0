"""Headless Chromium driven over the DevTools protocol (websockets, which Prefect brings): a
page opened, a script evaluated in it, a screenshot taken. Imported by tests/test_flows_pictures.py;
`found()` is None where no Chromium is installed (Debian: `apt-get install chromium`)."""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def found() -> str | None:
    """The path of an installed Chromium, or None."""
    return next((p for p in map(shutil.which, NAMES) if p), None)


class Page:
    """One tab: navigate(), evaluate() and screenshot() as DevTools commands."""

    def __init__(self, ws: Any):
        self.ws, self.n = ws, 0

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=120))
            if msg.get("id") == self.n:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def navigate(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def evaluate(self, script: str) -> Any:
        out = self.send("Runtime.evaluate", expression=script, returnByValue=True)
        return out.get("result", {}).get("value")

    def wait_for(self, what: str, script: str, timeout: float = 120.0) -> Any:
        """Evaluate `script` until it is truthy; its value (fail naming `what`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if value := self.evaluate(script):
                return value
            time.sleep(0.25)
        raise AssertionError(f"the page never showed {what}")

    def screenshot(self, height: int = 900) -> bytes:
        """The page as PNG, in a window `height` pixels high (Prefect's UI scrolls inside)."""
        self.send("Emulation.setDeviceMetricsOverride", width=1280, height=height,
                  deviceScaleFactor=1, mobile=False)  # fmt: skip
        time.sleep(1)  # the layout follows the new size
        return base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"])


@contextlib.contextmanager
def page(binary: str) -> Iterator[Page]:
    """A headless Chromium with one tab, closed when the block ends."""
    from websockets.sync.client import connect

    profile = tempfile.mkdtemp(prefix="chromium-")
    proc = subprocess.Popen(
        [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--remote-debugging-port=0",
         f"--user-data-dir={profile}", "--window-size=1280,900", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        port = None
        for line in proc.stderr:  # "DevTools listening on ws://127.0.0.1:PORT/devtools/..."
            if "DevTools listening on" in line:
                port = line.split("ws://")[1].split("/")[0].split(":")[1]
                break
        assert port, "Chromium never opened its DevTools port"
        tabs = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list").read())
        (tab,) = [t for t in tabs if t.get("type") == "page"][:1]
        with connect(tab["webSocketDebuggerUrl"], max_size=None) as ws:
            yield Page(ws)
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(profile, ignore_errors=True)
