"""The page's local HTTP server: static files, plotly.js from the installed ``plotly`` package, a JSON API.

Built on the standard library (:class:`http.server.ThreadingHTTPServer`, one thread per request);
slow computations run in worker processes (:mod:`ftlab.explore.jobs`). It listens on 127.0.0.1 only.

API (every knob of :class:`~ftlab.explore.knobs.Knobs` is a query parameter; missing ones take
their defaults). Answers are JSON; bad input is answered ``400 {"error": "<one line>"}``, an
unexpected failure ``500 {"error": "internal error: <one line>"}`` -- never a traceback -- and the
server goes on serving.

=======================  ====================================================================
``GET /``                the page (``/static/app.js``, ``/static/app.css``, ``/static/plotly.min.js``)
``GET /api/knobs``       defaults of the knobs and of the simulations, the regimes' colours
``GET /api/point``       :func:`~ftlab.explore.views.point_view` (closed forms, in the request thread)
``GET /api/curve``       :func:`~ftlab.explore.views.curve_view` (in the curve process)
``GET /api/corners``     :func:`~ftlab.explore.views.corner_view` (in the corners process, cached per task)
``POST /api/advise``     start the advisor: ``{"job": id}``
``POST /api/simulate``   start simulations (``dim``, ``seeds``, ``method``, ``sim_alphas`` comma-separated)
``GET /api/job?id=``     a job's :meth:`~ftlab.explore.jobs.Job.status`
``POST /api/cancel?id=`` cancel a job
=======================  ====================================================================
"""

from __future__ import annotations

import contextlib
import importlib.resources
import importlib.util
import json
import multiprocessing
import sys
import threading
from collections.abc import Callable, Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from ftlab.dln.regimes import REGIME_COLORS
from ftlab.explore.jobs import JobTable, Workers, one_line
from ftlab.explore.knobs import Knobs, parse_knobs, parse_number
from ftlab.explore.views import (
    SIM_METHODS,
    advice_view,
    corner_view,
    curve_view,
    point_view,
    sim_plan,
    simulation_view,
)

__all__ = ["HOST", "ExploreServer", "plotly_js", "running"]

HOST = "127.0.0.1"
#: Longest wait of a request for its worker process (seconds).
CURVE_TIMEOUT = 120.0
#: Simulation parameters the page starts with.
SIM_DEFAULTS = {"dim": 200, "seeds": 3, "method": "flow", "sim_alphas": "0.1, 0.2, 0.3, 0.4, 0.5"}
_STATIC = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}


def plotly_js() -> Path:
    """Path of ``plotly.min.js`` inside the installed ``plotly`` package (found without importing it).

    Raises ``ValueError`` (one line, with the install command) when the package is missing.
    """
    spec = importlib.util.find_spec("plotly")
    path = Path(spec.origin).parent / "package_data" / "plotly.min.js" if spec and spec.origin else None
    if path is None or not path.is_file():
        raise ValueError("ftlab explore needs plotly.js from the 'plotly' package: pip install 'ftlab[explore]'")
    return path


class _Answer(Exception):
    """A non-200 answer raised inside a route (status and one-line message)."""

    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


class _App:
    """The routes: each takes the query (a dict of strings) and returns ``(status, body bytes, content type)``."""

    def __init__(self, workers: Workers):
        self.workers = workers
        self.jobs = JobTable(workers)
        static = importlib.resources.files("ftlab.explore") / "static"
        self.files = {name: ((static / name).read_bytes(), ctype) for name, ctype in _STATIC.items()}
        self.index = (static / "index.html").read_bytes()
        self.plotly = plotly_js().read_bytes()
        self.routes: dict[tuple[str, str], Callable[[dict], object]] = {
            ("GET", "/api/knobs"): self.knobs, ("GET", "/api/point"): self.point,
            ("GET", "/api/curve"): self.curve, ("GET", "/api/corners"): self.corners,
            ("POST", "/api/advise"): self.advise, ("POST", "/api/simulate"): self.simulate,
            ("GET", "/api/job"): self.job, ("POST", "/api/cancel"): self.cancel,
        }

    def knobs(self, query: dict) -> dict:
        return {"defaults": Knobs().as_dict(), "colors": REGIME_COLORS, "simulation": SIM_DEFAULTS,
                "sim_methods": SIM_METHODS}

    def point(self, query: dict) -> dict:
        return point_view(parse_knobs(query))

    def _in_worker(self, role: str, fn, knobs: Knobs) -> dict:
        try:
            return self.workers.run(role, fn, knobs, timeout=CURVE_TIMEOUT)
        except multiprocessing.TimeoutError:
            raise _Answer(HTTPStatus.SERVICE_UNAVAILABLE,
                          f"the {role} computation took longer than {CURVE_TIMEOUT:g} s; try again") from None

    def curve(self, query: dict) -> dict:
        return self._in_worker("curve", curve_view, parse_knobs(query))

    def corners(self, query: dict) -> dict:
        return self._in_worker("corners", corner_view, parse_knobs(query))

    def advise(self, query: dict) -> dict:
        knobs = parse_knobs(query)
        job = self.jobs.start("advise", knobs=knobs.as_dict(), params={}, calls=[(advice_view, (knobs,), {})])
        return {"job": job.id, "total": 1}

    def simulate(self, query: dict) -> dict:
        sim = SIM_DEFAULTS | {k: v for k, v in query.items() if k in SIM_DEFAULTS}
        knobs = parse_knobs(query, extra=tuple(SIM_DEFAULTS))
        alphas = [parse_number("sim_alphas", a) for a in str(sim["sim_alphas"]).replace(",", " ").split()]
        dim, seeds, method, alphas = sim_plan(dim=parse_number("dim", str(sim["dim"])),
                                              seeds=parse_number("seeds", str(sim["seeds"])),
                                              method=str(sim["method"]), alphas=alphas)
        calls = [(simulation_view, (knobs,), {"alpha": a, "seed": s, "dim": dim, "method": method})
                 for a in alphas for s in range(seeds)]
        params = {"dim": dim, "seeds": seeds, "method": method, "sim_alphas": alphas}
        job = self.jobs.start("simulate", knobs=knobs.as_dict(), params=params, calls=calls)
        return {"job": job.id, "total": len(calls)}

    def job(self, query: dict) -> dict:
        return self.jobs.get(query.get("id", "")).status()

    def cancel(self, query: dict) -> dict:
        job = self.jobs.get(query.get("id", ""))
        job.cancel()
        return job.status()


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body leave at once (Nagle + delayed ACK would add ~40 ms)

    def do_GET(self):  # noqa: N802 - the name http.server calls
        self._dispatch("GET")

    def do_POST(self):  # noqa: N802
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        app = self.server.app
        url = urlsplit(self.path)
        if method == "POST":  # the page sends no body; read one if a client does, so the connection stays usable
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if method == "GET" and url.path == "/favicon.ico":
            return self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon", cache=True)
        if method == "GET" and url.path in ("/", "/index.html"):
            return self._send(HTTPStatus.OK, app.index, "text/html; charset=utf-8")
        if method == "GET" and url.path == "/static/plotly.min.js":
            return self._send(HTTPStatus.OK, app.plotly, "text/javascript; charset=utf-8", cache=True)
        if method == "GET" and url.path.startswith("/static/") and url.path[8:] in app.files:
            return self._send(HTTPStatus.OK, *app.files[url.path[8:]])
        route = app.routes.get((method, url.path))
        if route is None:
            known = any(path == url.path for _, path in app.routes)
            status = HTTPStatus.METHOD_NOT_ALLOWED if known else HTTPStatus.NOT_FOUND
            what = f"{method} is not allowed on {url.path}" if known else f"no such page: {url.path[:80]}"
            return self._json(status, {"error": what})
        try:
            body = route(dict(parse_qsl(url.query, keep_blank_values=True)))
        except _Answer as exc:
            return self._json(exc.status, {"error": str(exc)})
        except ValueError as exc:
            return self._json(HTTPStatus.BAD_REQUEST, {"error": one_line(exc)})
        except Exception as exc:  # noqa: BLE001 - answered as one line, logged as one line, and the server goes on
            line = f"internal error: {type(exc).__name__}: {one_line(exc)}"
            print(f"ftlab explore: {method} {url.path}: {line}", file=sys.stderr)
            return self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": line})
        self._json(HTTPStatus.OK, body)

    def _json(self, status: HTTPStatus, body) -> None:
        self._send(status, json.dumps(body, allow_nan=False).encode(), "application/json")

    def _send(self, status: HTTPStatus, body: bytes, ctype: str, *, cache: bool = False) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "max-age=86400" if cache else "no-store")
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the page went away (reload, newer request): nothing to answer
            self.close_connection = True

    def log_message(self, format, *args):  # noqa: A002 - http.server's signature
        if self.server.verbose:
            super().log_message(format, *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    app: _App
    verbose: bool


class ExploreServer:
    """The page's server on ``127.0.0.1:port`` (port 0: a free one), bound on construction.

    ``url`` is the page's address; :meth:`serve_forever` serves until :meth:`close` (from another
    thread) or Ctrl-C; :meth:`close` stops serving and the worker processes. ``verbose`` logs every
    request on stderr. Raises ``ValueError`` when the port is taken or plotly is not installed.

    Example::

        with running(port=0) as server:          # serves in a background thread
            print(server.url)                    # http://127.0.0.1:PORT/
    """

    def __init__(self, *, port: int = 0, verbose: bool = False):
        self.workers = Workers()
        app = _App(self.workers)
        try:
            self._httpd = _Server((HOST, port), _Handler)
        except OSError as exc:
            self.workers.close()
            raise ValueError(f"port={port} cannot be used ({exc.strerror or exc}): choose another --port, "
                             "or 0 for a free one") from None
        self._httpd.app = app
        self._httpd.verbose = verbose
        self.port = int(self._httpd.server_address[1])
        self.url = f"http://{HOST}:{self.port}/"
        self._serving = False

    def warm_up(self) -> None:
        """Start the worker processes and compute the default curves, so that the first page load is quick."""
        knobs = Knobs()
        self.workers.submit("curve", curve_view, knobs)
        self.workers.submit("corners", corner_view, knobs)
        self.workers.submit("jobs", Knobs)  # starts the process

    def serve_forever(self) -> None:
        self._serving = True
        self._httpd.serve_forever(poll_interval=0.2)

    def close(self) -> None:
        if self._serving:  # shutdown() waits for serve_forever to return: only call it once serving began
            self._httpd.shutdown()
        self._httpd.server_close()
        self.workers.close()


@contextlib.contextmanager
def running(*, port: int = 0, verbose: bool = False, warm: bool = True) -> Iterator[ExploreServer]:
    """An :class:`ExploreServer` serving in a background thread for the ``with`` block (tests, benchmarks)."""
    server = ExploreServer(port=port, verbose=verbose)
    thread = threading.Thread(target=server.serve_forever, name="ftlab-explore", daemon=True)
    thread.start()
    if warm:
        server.warm_up()
    try:
        yield server
    finally:
        server.close()
        thread.join(timeout=10)
