"""Progress off a terminal: start, periodic and end lines of a long loop."""

from __future__ import annotations

from ftlab.core import progress as P


def test_a_long_loop_off_a_terminal_says_how_far_it_got(capsys, monkeypatch):
    monkeypatch.setattr(P, "PERIOD", 0.0)  # every item is "long enough" for a line
    P.set_stage_lines(True)
    try:
        assert list(P.progress(range(3), desc="solves", total=3)) == [0, 1, 2]
    finally:
        P.set_stage_lines(False)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "ftlab: solves (3 items): started"
    assert [e.split(" after ")[0] for e in err[1:4]] == ["ftlab: solves: 1/3", "ftlab: solves: 2/3", "ftlab: solves: 3/3"]
    assert err[-1].startswith("ftlab: solves (3 items): done in ")


def test_a_short_loop_prints_only_its_start_and_end(capsys):
    P.set_stage_lines(True)
    try:
        list(P.progress(range(5), desc="quick", total=5))
    finally:
        P.set_stage_lines(False)
    assert len(capsys.readouterr().err.splitlines()) == 2
