"""Fixtures of the ``ftlab explore`` tests: one page server per session, headless Chromium when there is one.

The browser tests need the ``playwright`` package (dev extra) and a Chromium binary
(``apt-get install chromium``; another one with ``FTLAB_CHROMIUM=/path``). Where either is missing
they are skipped, and the reason is printed at the end of the run.
"""

from __future__ import annotations

import tempfile

import pytest

from explore_helpers import CHROMIUM_ARGS, browser_problem, chromium_path

_SKIPPED: list[str] = []


@pytest.fixture(scope="session")
def server():
    pytest.importorskip("plotly", reason="the page serves plotly.js from the 'plotly' package (ftlab[explore])")
    from ftlab.explore.server import running

    with running(port=0) as srv:
        yield srv


@pytest.fixture(scope="session")
def browser():
    problem = browser_problem()
    if problem is not None:
        _SKIPPED.append(problem)
        pytest.skip(f"browser tests skipped: {problem}")
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="ftlab-chromium-") as profile, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(profile, executable_path=chromium_path(), headless=True,
                                                        args=CHROMIUM_ARGS, viewport={"width": 1500, "height": 950})
        yield context
        context.close()


@pytest.fixture
def page(browser, server):
    pg = browser.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.goto(server.url)
    pg.wait_for_function("window.ftlab && window.ftlab.idle() && window.ftlab.last.curve && window.ftlab.last.corners",
                         timeout=60_000)
    yield pg
    pg.close()
    assert errors == [], f"the page raised: {errors}"


def pytest_terminal_summary(terminalreporter):
    for reason in sorted(set(_SKIPPED)):
        terminalreporter.write_line(f"ftlab explore: browser tests skipped: {reason}", yellow=True)
