"""The page in headless Chromium: controls move, the redrawn numbers are the library's, bad input is a message.

Run alone with ``python -m pytest tests/explore/test_browser.py``; skipped (reason printed) without
Chromium or playwright.
"""

from __future__ import annotations

import numpy as np

from ftlab.dln import metrics
from ftlab.dln.advisor import CORNERS, advise
from ftlab.dln.replica import learning_curve
from ftlab.dln.simulate import simulate_ptft
from ftlab.explore.knobs import Knobs
from ftlab.explore.views import ALPHA_GRID

TOL = {"rtol": 1e-9, "atol": 1e-12}
IDLE = "window.ftlab.idle()"


def knobs_of(page) -> Knobs:
    """The knobs the page sent (its state), as the library reads them."""
    return Knobs(**{k: float(v) for k, v in page.evaluate("({...window.ftlab.state})").items()})


def shown(page, cell: str) -> float:
    """The full value behind a number shown on the page."""
    return float(page.get_attribute(f"#{cell}", "data-value"))


def trace(page, plot: str, uid: str) -> dict:
    """x and y of one trace as drawn by plotly in the plot ``plot``."""
    return page.evaluate("([p, u]) => { const t = document.getElementById(p).data.find((d) => d.uid === u);"
                         " return {x: Array.from(t.x), y: Array.from(t.y)}; }", [plot, uid])


def type_into(page, name: str, text: str) -> None:
    page.fill(f"#t-{name}", text)
    page.press(f"#t-{name}", "Enter")


def check_point(page) -> Knobs:
    """Metrics cells and the regime map's current point equal metrics() for the page's knobs."""
    k = knobs_of(page)
    m = metrics(beta_pt=k.beta_pt, beta_ft=k.beta_ft, c=k.c, lam=k.lam, gamma=k.gamma)
    np.testing.assert_allclose([shown(page, f"v-{key}") for key in ("l_order", "pd", "m", "k")],
                               [m.l_order, m.pd, m.m, m.k], **TOL)
    assert page.get_attribute("#v-regime", "data-value") == m.regime
    cur = trace(page, "plane", "current")
    np.testing.assert_allclose([cur["x"][0], cur["y"][0]], [m.l_order, m.pd], **TOL)
    for name, scales in CORNERS.items():
        mc = metrics(beta_pt=k.beta_pt, beta_ft=k.beta_ft, c=scales.c, lam=scales.lam, gamma=scales.gamma)
        t = trace(page, "plane", f"corner-{name}")
        np.testing.assert_allclose([t["x"][0], t["y"][0]], [mc.l_order, mc.pd], **TOL)
    return k


def check_curve(page, *, corners: bool = False) -> np.ndarray:
    """The drawn learning curve (and the corners' ones) equal learning_curve() for the page's knobs."""
    k = knobs_of(page)
    cur = trace(page, "curve", "current")
    ref = learning_curve(k.task(), k.scales(), cur["x"])
    np.testing.assert_allclose(cur["y"], ref["error"], **TOL)
    assert k.alpha in cur["x"]
    np.testing.assert_allclose(shown(page, "v-error_at_alpha"), float(ref["error"][cur["x"].index(k.alpha)]), **TOL)
    for name in ("I", "III") if corners else ():
        t = trace(page, "curve", f"corner-{name}")
        assert t["x"] == list(ALPHA_GRID)
        np.testing.assert_allclose(t["y"], learning_curve(k.task(), CORNERS[name], t["x"])["error"], **TOL)
    return np.array(cur["y"])


def test_controls_redraw_the_library_numbers(page):
    before = check_point(page)
    curve0 = check_curve(page, corners=True)
    page.focus("#s-lam")                                 # move the lambda slider with the keyboard
    for _ in range(5):
        page.keyboard.press("ArrowRight")
    page.wait_for_function(IDLE)
    after = check_point(page)
    assert after.lam > before.lam and shown(page, "v-l_order") != metrics(
        beta_pt=1, beta_ft=1, c=before.c, lam=before.lam, gamma=before.gamma).l_order
    type_into(page, "c", "0.02")                         # type a value
    page.fill("#s-gamma", "-1")                          # drag gamma to 10^-1
    page.wait_for_function(IDLE)
    k = check_point(page)
    assert (k.c, k.gamma) == (0.02, 0.1)
    curve1 = check_curve(page)
    assert not np.allclose(curve0, curve1[: len(curve0)])
    page.fill("#s-overlap", "0.5")                       # the task: every curve moves, the corners' too
    type_into(page, "beta_pt", "3")
    page.wait_for_function(IDLE)
    check_point(page)
    check_curve(page, corners=True)
    assert "overlap=0.5" in page.evaluate("location.hash")


def test_bad_input_is_a_message_on_the_page_and_the_page_recovers(page):
    for name, text, words in [("c", "0", "c=0.0 is out of range"), ("c", "-1", "c=-1.0 is out of range"),
                              ("c", "abc", "c='abc' is not a number"), ("lam", "1.5", "lam=1.5 is out of range"),
                              ("lam", "-1", "zero saddle"), ("alpha", "0", "alpha=0.0 is out of range: must be > 0"),
                              ("overlap", "2", "overlap=2.0 is out of range")]:
        good = page.input_value(f"#t-{name}")
        type_into(page, name, text)
        page.wait_for_function(IDLE)
        assert words in page.text_content("#message")
        type_into(page, name, good)
        page.wait_for_function(IDLE)
        assert page.text_content("#message") == ""
    type_into(page, "c", "-3")
    page.wait_for_function(IDLE)
    assert "bad" in page.get_attribute("#t-c", "class")  # the box of the named knob is marked
    type_into(page, "c", "0.005")
    page.wait_for_function(IDLE)
    check_point(page)
    check_curve(page)


def test_advisor_on_request_is_the_library_advisor(page):
    type_into(page, "overlap", "0.5")
    type_into(page, "alpha", "0.3")
    page.wait_for_function(IDLE)
    page.click("#advise")
    k = knobs_of(page)
    adv = advise(k.task(), alpha=k.alpha)                # while the page's advisor runs in the server
    page.wait_for_function("window.ftlab.last.advice !== null", timeout=120_000)
    np.testing.assert_allclose([shown(page, f"a-{key}") for key in ("c", "lam", "gamma", "error")],
                               [adv.scales.c, adv.scales.lam, adv.scales.gamma, adv.error], **TOL)
    assert page.get_attribute("#a-regime", "data-value") == adv.regime
    page.click("#advice-use")                            # the advice becomes the knobs
    page.wait_for_function(IDLE)
    k = check_point(page)
    assert (k.c, k.lam, k.gamma) == (adv.scales.c, adv.scales.lam, adv.scales.gamma)
    np.testing.assert_allclose(shown(page, "v-error_at_alpha"), learning_curve(k.task(), k.scales(), [k.alpha])["error"][0],
                               rtol=1e-6)  # the same E_g by the curve's (finer) quadrature


def test_simulations_run_without_blocking_the_controls(page):
    page.fill("#sim-dim", "300")
    page.fill("#sim-seeds", "8")
    page.fill("#sim-alphas", "0.3 0.5")
    page.click("#sim-run")
    page.wait_for_function("window.ftlab.last.sim && window.ftlab.last.sim.done >= 1", timeout=60_000)
    type_into(page, "lam", "0.25")                       # the controls answer while the job runs
    page.wait_for_function(IDLE)
    check_point(page)
    assert page.evaluate("window.ftlab.last.sim.state") == "running"
    page.click("#sim-cancel")
    page.wait_for_function("window.ftlab.last.sim.state === 'cancelled'", timeout=60_000)
    assert "(for earlier knobs)" in page.text_content("#sim-status")
    page.fill("#sim-dim", "40")                          # a small run to the end: the drawn points are the library's
    page.fill("#sim-seeds", "2")
    page.fill("#sim-alphas", "0.2, 0.4")
    page.select_option("#sim-method", "gd")
    page.click("#sim-run")
    page.wait_for_function("window.ftlab.last.sim.state === 'done' && window.ftlab.last.sim.total === 4", timeout=60_000)
    assert page.text_content("#sim-status").startswith("4 / 4 runs, done")
    k = knobs_of(page)
    runs = page.evaluate("window.ftlab.last.sim.results")
    drawn = trace(page, "curve", "sim-runs")
    np.testing.assert_allclose(drawn["y"], [r["error"] for r in runs], **TOL)
    for r in runs:
        ref = simulate_ptft(k.task(), k.scales(), alpha=r["alpha"], dim=40, seed=r["seed"], method="gd")
        np.testing.assert_allclose(r["error"], ref.error, **TOL)
    page.fill("#sim-dim", "1")
    page.click("#sim-run")
    page.wait_for_function("document.getElementById('message').textContent.includes('dim=1 is out of range')")
