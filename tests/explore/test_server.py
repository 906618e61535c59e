"""The page's JSON API: the library's numbers, one-line errors, a server that keeps serving, jobs."""

from __future__ import annotations

import time
import urllib.request

import numpy as np
import pytest

from explore_helpers import call
from ftlab.dln import metrics
from ftlab.dln.replica import learning_curve
from ftlab.dln.simulate import simulate_ptft
from ftlab.explore.knobs import Knobs

TOL = {"rtol": 1e-9, "atol": 1e-12}


def params(knobs: Knobs) -> dict:
    return {k: repr(v) for k, v in knobs.as_dict().items()}


@pytest.mark.parametrize("knobs", [Knobs(), Knobs(c=3e-5, lam=0.7, gamma=2.0, beta_pt=0.1, beta_ft=4.0),
                                   Knobs(c=0.05, lam=-1.0, gamma=0.01, rho_pt=0.3, rho_ft=0.05, overlap=0.2, alpha=0.37)])
def test_point_and_curve_answers_are_the_library_numbers(server, knobs):
    status, point = call(server, "/api/point", params=params(knobs))
    assert status == 200
    m = metrics(beta_pt=knobs.beta_pt, beta_ft=knobs.beta_ft, c=knobs.c, lam=knobs.lam, gamma=knobs.gamma)
    np.testing.assert_allclose([point["metrics"][k] for k in ("l_order", "pd", "k")], [m.l_order, m.pd, m.k], **TOL)
    assert point["metrics"]["regime"] == m.regime and point["knobs"] == knobs.as_dict()
    status, curve = call(server, "/api/curve", params=params(knobs))
    assert status == 200
    ref = learning_curve(knobs.task(), knobs.scales(), curve["alphas"])
    np.testing.assert_allclose(curve["error"], ref["error"], **TOL)


@pytest.mark.parametrize("path, query, words", [
    ("/api/point", {"c": "0"}, "c=0.0 is out of range: must be in (0, 1e50]"),
    ("/api/point", {"c": "-2"}, "c=-2.0 is out of range"),
    ("/api/point", {"lam": "-1.2"}, "lam=-1.2 is out of range: must be in [-1, 1]"),
    ("/api/curve", {"lam": "3"}, "lam=3.0 is out of range"),
    ("/api/curve", {"alpha": "0"}, "alpha=0.0 is out of range: must be > 0"),
    ("/api/curve", {"alpha": "-0.5"}, "alpha=-0.5 is out of range"),
    ("/api/corners", {"rho_pt": "2"}, "rho_pt=2.0"),
    ("/api/point", {"gamma": "x"}, "gamma='x' is not a number"),
    ("/api/point", {"c": ""}, "c='' is not a number"),
])
def test_bad_input_is_a_400_with_one_line_and_the_server_keeps_serving(server, path, query, words):
    status, body = call(server, path, params=query)
    assert status == 400 and words in body["error"] and "\n" not in body["error"] and "Traceback" not in body["error"]
    status, body = call(server, "/api/point")
    assert status == 200 and body["metrics"]["regime"] == metrics(beta_pt=1, beta_ft=1, c=1e-3, lam=-0.99, gamma=0).regime


def test_an_unexpected_failure_is_a_500_with_one_line_and_the_server_keeps_serving(server, monkeypatch, capsys):
    import ftlab.explore.server as srv

    def broken(knobs):
        raise RuntimeError("planted failure\nsecond line")

    monkeypatch.setattr(srv, "point_view", broken)
    assert call(server, "/api/point") == (500, {"error": "internal error: RuntimeError: planted failure"})
    assert "planted failure" in capsys.readouterr().err
    monkeypatch.undo()
    assert call(server, "/api/point")[0] == 200


def test_unknown_pages_and_methods_are_json_errors(server):
    assert call(server, "/api/nothing") == (404, {"error": "no such page: /api/nothing"})
    status, body = call(server, "/api/point", method="POST")
    assert status == 405 and "POST is not allowed" in body["error"]
    assert call(server, "/api/job", params={"id": "simulate-999"})[0] == 400
    with urllib.request.urlopen(server.url) as res:
        html = res.read().decode()
    assert "/static/plotly.min.js" in html and "http" not in html.split("<body>")[0].replace("http-equiv", "")
    with urllib.request.urlopen(server.url + "static/plotly.min.js") as res:
        assert res.status == 200 and len(res.read()) > 1_000_000  # served from the installed plotly package


def _wait(server, job_id: str, *, until=lambda st: st["state"] != "running", timeout: float = 120.0) -> dict:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        status, st = call(server, "/api/job", params={"id": job_id})
        assert status == 200
        if until(st):
            return st
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} still running after {timeout} s")


def test_simulation_job_reports_progress_and_the_library_numbers(server):
    knobs = Knobs(lam=0.0, gamma=0.1)
    status, started = call(server, "/api/simulate", method="POST",
                           params=params(knobs) | {"dim": "50", "seeds": "2", "method": "flow", "sim_alphas": "0.2, 0.4"})
    assert status == 200 and started["total"] == 4
    st = _wait(server, started["job"])
    assert st["state"] == "done" and st["done"] == 4 and st["params"]["sim_alphas"] == [0.2, 0.4]
    for r in st["results"]:
        ref = simulate_ptft(knobs.task(), knobs.scales(), alpha=r["alpha"], dim=50, seed=r["seed"], method="flow")
        np.testing.assert_allclose([r["error"], r["error_pred"]], [ref.error, ref.error_pred], **TOL)


def test_a_cancelled_simulation_stops_before_its_end(server):
    status, started = call(server, "/api/simulate", method="POST",
                           params={"dim": "300", "seeds": "10", "sim_alphas": "0.3 0.5", "method": "flow"})
    assert status == 200 and started["total"] == 20
    _wait(server, started["job"], until=lambda st: st["done"] >= 1)
    call(server, "/api/cancel", method="POST", params={"id": started["job"]})
    st = _wait(server, started["job"])
    assert st["state"] == "cancelled" and st["done"] < 20


@pytest.mark.parametrize("query, words", [({"dim": "1"}, "dim=1 is out of range"), ({"seeds": "2.5"}, "seeds=2.5"),
                                          ({"method": "adam"}, "method='adam'"), ({"sim_alphas": "0.1 x"}, "sim_alphas='x'"),
                                          ({"c": "-1"}, "c=-1.0")])
def test_bad_simulation_requests_are_400(server, query, words):
    status, body = call(server, "/api/simulate", method="POST", params=query)
    assert status == 400 and words in body["error"]
