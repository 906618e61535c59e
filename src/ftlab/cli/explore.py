"""``ftlab explore``: a local page where the regimes, l-order, PD and E_g(alpha) move with the knobs."""

from __future__ import annotations

import sys

import click

from ftlab.cli.main import Terminated


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Port on 127.0.0.1 (0 = a free one, printed at start).")
@click.option("--no-browser", is_flag=True, help="Print the address only; do not open a browser.")
@click.option("--log-requests", is_flag=True, help="Log every request on stderr.")
def explore(port: int, no_browser: bool, log_requests: bool) -> None:
    """Open a page to explore fine-tuning in diagonal linear networks (arXiv 2602.20062).

    \b
    Sliders and text boxes set c (log scale), lambda, gamma, the coordinate magnitudes
    |beta_PT| and |beta_FT|, the task (rho_PT, rho_FT, overlap) and alpha = N_FT / D. Side by side:
      * the regime map (PD against l-order, with the four regime corners) and the regimes
        over the (lambda, c) plane,
      * the implicit-bias potential q_k of the current point (log-log: its slope is the l-order),
      * the replica learning curve E_g(alpha) against the corners' curves, with the advisor's
        best (c, lambda, gamma) and simulated networks (gradient flow or GD) on request.
    Every number is computed by ftlab.dln; the page needs no internet (plotly.js is served from
    the installed 'plotly' package: pip install 'ftlab[explore]'). The server listens on
    127.0.0.1 only; stop it with Ctrl-C. The page's address keeps the knobs, e.g.
    http://127.0.0.1:PORT/#c=0.001&lam=-0.99&gamma=0&alpha=0.2 opens that setting.

    \b
    Examples:
      ftlab explore                          # a free port, opens the default browser
      ftlab explore --port 8050 --no-browser # then open http://127.0.0.1:8050/
    """
    import webbrowser

    from ftlab.explore.server import ExploreServer

    server = ExploreServer(port=port, verbose=log_requests)
    server.warm_up()
    click.echo(f"ftlab explore: serving {server.url}  (Ctrl-C stops it)")
    if not no_browser:
        try:
            opened = webbrowser.open(server.url)
        except webbrowser.Error:
            opened = False
        if not opened:
            click.echo("ftlab explore: no browser found here: open the address above in one")
    try:
        server.serve_forever()
    except KeyboardInterrupt as exc:  # Ctrl-C is the way to stop a server: exit 0; SIGTERM/SIGHUP: 128 + signal
        server.close()
        click.echo("ftlab explore: stopped", err=True)
        if isinstance(exc, Terminated):
            sys.exit(128 + exc.signum)
