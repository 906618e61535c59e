"""Benchmark: how fast the ``ftlab explore`` page redraws after a control change, measured in the browser.

Starts the page's server, opens it in headless Chromium (playwright) and moves controls one at a
time, waiting for each redraw to finish. The page itself times every change with
``performance.now()``: from the control's event to the end of the redraw (fetch, JSON, plotly.js
redraw, next animation frame). Reported: medians (and 90th percentiles, maxima) over repeated changes of

1. lambda (slider): the metrics, the regime map, the (lambda, c) map and q_k; and the learning curve;
2. the same while a simulation job runs in the background;
3. the overlap (slider): the learning curve, and the four corners' curves of a task not seen before.

Writes the ``explore`` section of docs/benchmarks.md and a screenshot of the page
(docs/figures/explore.png: the default setting with the advisor's answer and simulated networks).

Run: ``.venv/bin/python benchmarks/bench_explore.py [--repeats 20] [--no-screenshot] [--chromium PATH]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from _common import write_section
from ftlab.explore.server import running

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
IDLE = "window.ftlab.idle()"


def _last(page, kind: str) -> float:
    return float(page.evaluate(f"window.ftlab.timings.{kind}.at(-1).ms"))


def _move(page, selector: str, value: float) -> None:
    page.fill(selector, repr(value))
    page.wait_for_function(IDLE, timeout=60_000)


def _row(label: str, what: str, ms: list[float], goal: str) -> str:
    p90 = float(np.percentile(ms, 90))
    return f"| {label} | {what} | {len(ms)} | {statistics.median(ms):.0f} | {p90:.0f} | {max(ms):.0f} | {goal} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20, help="control changes per row (default 20)")
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium", help="Chromium binary")
    ap.add_argument("--no-screenshot", action="store_true", help="do not rewrite docs/figures/explore.png")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    n = args.repeats
    version = subprocess.run([args.chromium, "--version"], capture_output=True, text=True).stdout.split()
    browser = version[1] if len(version) > 1 else "(version unknown)"
    load = [os.getloadavg()[0]]
    with running(port=0) as server, tempfile.TemporaryDirectory() as profile, sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(profile, executable_path=args.chromium, headless=True, args=ARGS,
                                                    viewport={"width": 1500, "height": 950})
        page = ctx.new_page()
        page.goto(server.url)
        page.wait_for_function(IDLE + " && window.ftlab.last.curve && window.ftlab.last.corners", timeout=120_000)
        rows = {"point": [], "curve": [], "point_sim": [], "task_curve": [], "task_corners": []}
        for lam in np.linspace(-0.95, 0.9, n):                                  # 1. lambda
            _move(page, "#s-lam", round(float(lam), 3))
            rows["point"].append(_last(page, "point"))
            rows["curve"].append(_last(page, "curve"))
        page.fill("#sim-dim", "1000")                                           # 2. while a simulation runs
        page.fill("#sim-seeds", "20")
        page.click("#sim-run")
        page.wait_for_function("window.ftlab.last.sim && window.ftlab.last.sim.state === 'running'")
        for lam in np.linspace(-0.9, 0.5, n):
            _move(page, "#s-lam", round(float(lam), 3))
            if page.evaluate("window.ftlab.last.sim.state") == "running":
                rows["point_sim"].append(_last(page, "point"))
        page.click("#sim-cancel")
        page.wait_for_function("window.ftlab.last.sim.state !== 'running'", timeout=120_000)
        for overlap in np.linspace(0.95, 0.2, n):                              # 3. the task
            _move(page, "#s-overlap", round(float(overlap), 3))
            rows["task_curve"].append(_last(page, "curve"))
            rows["task_corners"].append(_last(page, "corners"))
        if not args.no_screenshot:
            _screenshot(page, ROOT / "docs" / "figures" / "explore.png")
        ctx.close()
    load.append(os.getloadavg()[0])

    table = "\n".join([
        "| control change | redrawn | changes | median (ms) | p90 (ms) | max (ms) | goal |",
        "|---|---|---|---|---|---|---|",
        _row("λ slider", "metrics, regime map, (λ, c) map, q_k", rows["point"], "100 ms"),
        _row("λ slider", "learning curve E_g(α) (50 α)", rows["curve"], "1 s"),
        _row("λ slider, a simulation running", "metrics, regime map, (λ, c) map, q_k", rows["point_sim"], "100 ms"),
        _row("overlap slider", "learning curve E_g(α)", rows["task_curve"], "1 s"),
        _row("overlap slider (a new task)", "the four corners' curves", rows["task_corners"], "-"),
    ])
    write_section("explore", f"""## `ftlab explore`: redraw after a control change, in the browser

`benchmarks/bench_explore.py`.

Headless Chromium {browser} on the same machine as the server (both share its 2 cores; 1-minute load
average {load[0]:.1f} before and {load[1]:.1f} after the run, other work included). Each change is timed by
the page with `performance.now()` from the control's event to the end of the redraw (request, JSON,
plotly.js redraw and the next animation frame), one change at a time. The closed forms run in the
server's request thread; the learning curve, the corners' curves and the jobs each run in their own
worker process, so a simulation (here D = 1000, 20 seeds, exact gradient flow) does not hold up the
controls. The corners' curves are computed once per task (cached), alongside the current curve.

{table}
""")


def _screenshot(page, path: Path) -> None:
    """The default setting with the advisor's answer and simulated networks (gradient flow, D = 200, 3 seeds)."""
    page.goto(page.url.split("#")[0] + "#c=0.001&lam=-0.99&gamma=0&beta_pt=1&beta_ft=1&rho_pt=0.1&rho_ft=0.1"
              "&overlap=1&alpha=0.2")
    page.reload()
    page.wait_for_function(IDLE + " && window.ftlab.last.curve && window.ftlab.last.corners", timeout=120_000)
    page.click("#sim-run")
    page.wait_for_function("window.ftlab.last.sim && window.ftlab.last.sim.state === 'done'", timeout=300_000)
    page.click("#advise")
    page.wait_for_function("window.ftlab.last.advice !== null", timeout=300_000)
    page.wait_for_timeout(300)
    page.screenshot(path=str(path))


if __name__ == "__main__":
    main()
