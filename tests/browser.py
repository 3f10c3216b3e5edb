"""A headless Chromium that reads the built book as a reader would, for tests/test_book.py.

Chromium is driven over the DevTools protocol (a websocket, ``websocket-client``); the book
is served over HTTP from 127.0.0.1, and every other host name fails to resolve, so a page
that needs the network to read well fails its test.
"""

from __future__ import annotations

import base64
import functools
import http.server
import itertools
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import websocket

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
    "--hide-scrollbars",
    "--window-size=1280,1000",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    "--remote-debugging-port=0",
]


def chromium_executable() -> str:
    """Debian's chromium; installed with apt when missing and we are root (as on CI)."""
    if not Path(CHROMIUM).exists() and os.geteuid() == 0 and shutil.which("apt-get"):
        for command in (
            ["apt-get", "update"],
            ["apt-get", "install", "-y", "chromium"],
        ):
            subprocess.run(command, check=True, capture_output=True, timeout=900)
    if not Path(CHROMIUM).exists():
        raise RuntimeError(
            f"the browser tests need Chromium at {CHROMIUM}: "
            "`apt-get install -y chromium` (Debian), as root"
        )
    return CHROMIUM


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class Site:
    """The built book served over HTTP on 127.0.0.1, from a thread."""

    def __init__(self, root: Path):
        handler = functools.partial(_QuietHandler, directory=str(root))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Browser:
    """One headless Chromium; each page opens in a fresh tab and is closed after."""

    def __init__(self, profile: Path, timeout: float = 180.0):
        self.timeout = timeout
        self.process = subprocess.Popen(
            [
                chromium_executable(),
                *FLAGS,
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not (port_file.exists() and len(port_file.read_text().split()) == 2):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("Chromium did not start its DevTools endpoint")
            time.sleep(0.2)
        port, path = port_file.read_text().split()
        self.ws = websocket.create_connection(
            f"ws://127.0.0.1:{port}{path}", timeout=timeout, suppress_origin=True
        )
        self.ids = itertools.count(1)

    def send(self, method: str, params=None, session=None, events=None) -> dict:
        """Send a command and wait for its answer; events that arrive meanwhile are
        appended to ``events`` (when given)."""
        message_id = next(self.ids)
        message = {"id": message_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self.ws.send(json.dumps(message))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if events is not None and "method" in reply:
                events.append(reply)

    def visit(self, url: str, script: str, screenshot: Path | None = None):
        """Open ``url``, wait for it to load, evaluate ``script`` (an async function body
        returning JSON-able data) and return ``(its value, the page's events)``."""
        events: list[dict] = []
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send(
            "Target.attachToTarget", {"targetId": target, "flatten": True}
        )["sessionId"]
        try:
            for domain in ("Page", "Network", "Runtime"):
                self.send(f"{domain}.enable", session=session, events=events)
            self.send("Page.navigate", {"url": url}, session=session, events=events)
            deadline = time.monotonic() + self.timeout
            while not any(e["method"] == "Page.loadEventFired" for e in events):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{url} did not finish loading")
                message = json.loads(self.ws.recv())
                if "method" in message:
                    events.append(message)
            result = self.send(
                "Runtime.evaluate",
                {
                    "expression": f"(async () => {{ {script} }})()",
                    "awaitPromise": True,
                    "returnByValue": True,
                },
                session=session,
                events=events,
            )
            if "exceptionDetails" in result:
                raise RuntimeError(f"{url}: {result['exceptionDetails']}")
            if screenshot is not None:
                self._screenshot(session, screenshot, events)
            return result["result"].get("value"), events
        finally:
            self.send("Target.closeTarget", {"targetId": target})

    def _screenshot(self, session: str, path: Path, events: list) -> None:
        """The whole page, up to 16000 pixels tall, as a PNG."""
        size = self.send("Page.getLayoutMetrics", session=session)["cssContentSize"]
        clip = {
            "x": 0,
            "y": 0,
            "width": size["width"],
            "height": min(size["height"], 16000),
            "scale": 1,
        }
        shot = self.send(
            "Page.captureScreenshot",
            {"format": "png", "clip": clip, "captureBeyondViewport": True},
            session=session,
            events=events,
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self):
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
