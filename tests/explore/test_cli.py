"""``ftlab explore`` on the command line: lazy imports, help, start, stop, errors."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest
from click.testing import CliRunner

WEB = ("ftlab.explore", "ftlab.explore.server", "http.server", "plotly")


def test_neither_ftlab_nor_the_cli_entry_imports_the_web_stack():
    code = ("import sys\nimport ftlab, ftlab.dln, ftlab.dln.replica, ftlab.cli.main\n"
            "from ftlab.cli.main import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            f"print([m for m in {WEB!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "explore" in out.stdout  # the command is listed ...
    assert out.stdout.strip().splitlines()[-1] == "[]"  # ... without importing its code


def test_help_teaches_with_an_example():
    from ftlab.cli.main import cli

    out = " ".join(CliRunner().invoke(cli, ["explore", "--help"]).output.split())
    for words in ("--port", "--no-browser", "Examples:", "ftlab explore --port 8050 --no-browser", "arXiv 2602.20062",
                  "127.0.0.1"):
        assert words in out


def _start(*args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", "from ftlab.cli.main import main; main()", "explore", "--no-browser",
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert "serving http://127.0.0.1:" in line, line + proc.stderr.read()
    return proc, line.split("serving ")[1].split()[0]


def test_the_command_serves_the_page_and_stops_cleanly_on_ctrl_c():
    pytest.importorskip("plotly")
    proc, url = _start("--port", "0")
    try:
        with urllib.request.urlopen(url + "api/point?c=0.01", timeout=30) as res:
            body = json.loads(res.read())
        assert body["knobs"]["c"] == 0.01
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0 and "ftlab explore: stopped" in err and "Traceback" not in err
    finally:
        proc.kill()


def test_a_taken_port_is_a_one_line_error():
    pytest.importorskip("plotly")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run([sys.executable, "-c", "from ftlab.cli.main import main; main()", "explore", "--no-browser",
                            "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and f"port={port} cannot be used" in r.stderr


def test_without_plotly_the_error_names_the_extra(monkeypatch):
    import importlib.util

    from ftlab.explore import server

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"pip install 'ftlab\[explore\]'"):
        server.plotly_js()
