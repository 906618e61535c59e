"""Helpers of the ``ftlab explore`` tests (on pytest's pythonpath): requests to the page's server, Chromium."""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlencode

#: Chromium flags for a sandbox-less machine with no network but loopback.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def chromium_path() -> str:
    """The Chromium binary: ``$FTLAB_CHROMIUM``, else ``chromium`` on the PATH, else /usr/bin/chromium."""
    return os.environ.get("FTLAB_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


def browser_problem() -> str | None:
    """Why the browser tests cannot run here, or ``None``."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the 'playwright' package is not installed (pip install -e '.[dev]')"
    if not Path(chromium_path()).is_file():
        return f"no Chromium at {chromium_path()} (apt-get install chromium, or set FTLAB_CHROMIUM)"
    return None


def call(server, path: str, *, method: str = "GET", params: dict | None = None) -> tuple[int, dict]:
    """``(status, JSON body)`` of one request to the page's server."""
    url = server.url.rstrip("/") + path + (f"?{urlencode(params)}" if params else "")
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=120) as res:
            return res.status, json.loads(res.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
