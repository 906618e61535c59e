"""Sizes checked against memory before any work (naming the parameter), one range per parameter in every
command, theory outputs whole and locked, and the Python API naming the argument it cannot use."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ftlab.core.usercode import check_callable


def _ftlab(*args, cwd=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "ftlab.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def _main(capsys, *args) -> tuple[int, str]:
    """The ftlab command in this process (faster than a subprocess): exit status and stderr."""
    from ftlab.cli.main import main

    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    return code, capsys.readouterr().err


@pytest.mark.parametrize("args", [
    ["theory", "simulate", "--seeds", "1000000000", "--dim", "2"],
    ["theory", "curve", "--alpha", "0.1", "--alpha", "0.2", "--seeds", "1000000000", "--dim", "2", "--out", "o"],
])
def test_a_seed_count_that_cannot_fit_is_refused_naming_it(tmp_path, args):
    r = _ftlab(*args, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--seeds 1000000000" in r.stderr
    assert "GiB of memory" in r.stderr and "reduce --seeds" in r.stderr
    assert list(tmp_path.iterdir()) == []  # refused before anything was created


def test_dim_has_one_range_in_every_simulating_command(capsys):
    refused = [_main(capsys, "theory", "simulate", "--dim", "1", "--alpha", "0.5"),
               _main(capsys, "theory", "curve", "--dim", "1", "--seeds", "1", "--alpha", "0.5")]
    assert refused == [(2, "ftlab: error: dim=1 is out of range: must be an integer >= 2\n")] * 2
    accepted = [_main(capsys, "theory", "simulate", "--dim", "2", "--alpha", "0.5", "--format", "json"),
                _main(capsys, "theory", "curve", "--dim", "2", "--seeds", "1", "--alpha", "0.5", "--workers", "1",
                      "--format", "json")]
    assert [code for code, _ in accepted] == [0, 0], accepted
    from ftlab.dln import InitScales, TaskSpec, simulate_ptft
    from ftlab.dln.replica.curves import simulated_error

    for fn in (simulate_ptft, simulated_error):
        with pytest.raises(ValueError, match="dim=1 is out of range: must be an integer >= 2"):
            fn(TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=1.0), InitScales(c=1e-3, lam=0.0, gamma=0.0), alpha=0.5, dim=1,
               seed=0)


def test_phase_diagrams_in_one_folder_are_separate_whole_outputs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    common = ["theory", "advise", "--alpha", "0.1", "--no-refine", "--phase-size", "2", "--workers", "1"]
    for name in ("p", "q"):
        code, err = _main(capsys, *common, "--phase-out", f"runs/{name}.png")
        assert code == 0, err
    runs = tmp_path / "runs"
    names = sorted(p.name for p in runs.iterdir())
    assert names == [".ftlab-set-phase-p.json", ".ftlab-set-phase-q.json", "p.csv", "p.csv.meta.json", "p.png",
                     "q.csv", "q.csv.meta.json", "q.png"]  # q did not remove p; no lock file, no folder 'p'


def test_the_python_api_names_the_argument(tmp_path):
    torch = pytest.importorskip("torch")
    from ftlab.deep import absolute_scale_, rebalance_, reinit_readout_

    with pytest.raises(TypeError, match="loss='mymodels:loss' is not callable.*not by the Python API"):
        check_callable("loss", "mymodels:loss")
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got str"):
        rebalance_("resnet18", 0.5)
    with torch.device("meta"):
        net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    for call in (lambda: absolute_scale_(net, 2.0), lambda: reinit_readout_(net, gamma=0.1)):
        with pytest.raises(ValueError, match="model: '0.weight' is on the meta device"):
            call()


def test_interrupt_messages_say_what_is_true(monkeypatch):
    from ftlab.cli.main import Terminated, interrupted_message
    from ftlab.core import results

    monkeypatch.setattr(results, "_OUTCOMES", [])
    text, code = interrupted_message(KeyboardInterrupt())
    assert code == 130 and text.startswith("ftlab: interrupted. Finished points") and "no partial" not in text
    monkeypatch.setattr(results, "_OUTCOMES", [f"{Path('out')}: the unfinished output was discarded; the previous "
                                               "one is unchanged"])
    text, code = interrupted_message(Terminated(15))
    assert code == 143 and text.startswith("ftlab: terminated. out: the unfinished output was discarded")
