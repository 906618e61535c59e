"""Faults, interrupted and concurrent runs: nothing lost, nothing half-written, one clear line."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftlab.core import results as R
from ftlab.core.results import atomic_write_text, output_lock, staged_output


def _ftlab(*args, timeout=120, **kw):
    return subprocess.run([sys.executable, "-m", "ftlab.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, **kw)


def test_files_get_the_users_umask(tmp_path):
    old = os.umask(0o022)
    try:
        p = atomic_write_text(tmp_path / "a.txt", "x")
    finally:
        os.umask(old)
    assert (p.stat().st_mode & 0o777) == 0o644


def test_a_full_disk_names_the_target_and_keeps_the_old_file(tmp_path, monkeypatch):
    p = atomic_write_text(tmp_path / "curve.csv", "old")

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(R.os, "fsync", no_space)
    with pytest.raises(OSError) as info:
        atomic_write_text(p, "new")
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(p)
    assert p.read_text() == "old" and [f.name for f in tmp_path.iterdir()] == ["curve.csv"]


def test_staged_output_is_all_or_nothing(tmp_path):
    out = tmp_path / "out"
    with staged_output(out) as st:
        (st / "a.txt").write_text("1")
        (st / "b.txt").write_text("1")
    assert sorted(p.name for p in out.iterdir()) == [".ftlab-set-output.json", "a.txt", "b.txt"]
    with pytest.raises(RuntimeError):
        with staged_output(out) as st:
            (st / "a.txt").write_text("2")
            raise RuntimeError("failed after the first file")
    assert (out / "a.txt").read_text() == "1" and (out / "b.txt").read_text() == "1"  # previous set intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging folder left behind
    assert sorted(p.name for p in out.iterdir()) == [".ftlab-set-output.json", "a.txt", "b.txt"]


def test_a_second_run_on_the_same_out_is_refused(tmp_path):
    with output_lock(tmp_path / "results"):
        with pytest.raises(ValueError, match=f"in use by another ftlab run \\(pid {os.getpid()}"):
            with output_lock(tmp_path / "results"):
                pass
    with output_lock(tmp_path / "results"):  # released afterwards
        pass


def test_out_under_a_file_is_one_line_exit_2(tmp_path):
    (tmp_path / "file").write_text("x")
    r = _ftlab("theory", "curve", "--alpha", "0.1", "--out", str(tmp_path / "file" / "sub"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Not a directory" in r.stderr and "file" in r.stderr


@pytest.mark.parametrize("args, expect", [
    (["theory", "curve", "--alpha", "0.1", "--workers", "0"], "workers=0"),
    (["reproduce", "dln", "--workers", "0"], "workers=0"),
    (["theory", "curve", "--alphas", "0.01:0.5:100000000"], "pass --yes"),
    (["theory", "advise", "--alpha", "0.1", "--phase-out", "p.txt"], "must end in .png"),
    (["theory", "advise", "--alpha", "0.1", "--phase-out", "p.png", "--phase-size", "100000"], "pass --yes"),
    (["theory", "simulate", "--dim", "100000"], "GiB of memory"),
    (["theory", "metrics", "--c", "1e308"], "c=1e+308 is out of range"),
    (["theory", "metrics", "--lam", "-1", "--gamma", "0"], "zero saddle"),
    (["theory", "simulate", "--lam", "-1", "--gamma", "0"], "zero saddle"),
    (["reproduce", "dln", "--figure", "nosuchfig"], "figure='nosuchfig' is unknown"),
])
def test_bad_input_is_refused_before_any_work(tmp_path, args, expect):
    r = _ftlab(*args, "--out", str(tmp_path / "o")) if args[0] == "reproduce" else _ftlab(*args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert expect in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists() and not (tmp_path / "p.png").exists()


def test_advised_parameters_round_trip_into_the_cli(monkeypatch, capsys):
    from ftlab.cli.output import emit

    emit([{"best_lam": -0.9999999, "best_c": 1.2345678901e-3, "error": 0.123456789}], "table",
         exact=("best_c", "best_lam"))
    out = capsys.readouterr().out
    assert "-0.9999999" in out and "0.0012345678901" in out and "0.123457" in out


def _children(pid: int) -> list[int]:
    kids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(d.name))
    return kids


SLOW_SWEEP = """
import time
from ftlab.core.sweep import run_sweep
from tests.core.test_reliability import sleepy
run_sweep(sleepy, [{"x": i} for i in range(40)], workers=2)
"""


def sleepy(x):
    time.sleep(30)
    return {"x": x}


@pytest.mark.skipif(not Path("/proc").exists(), reason="needs /proc")
def test_workers_end_when_their_parent_is_killed():
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", SLOW_SWEEP], cwd=root)
    try:
        deadline = time.time() + 30
        workers: list[int] = []
        while time.time() < deadline and len(workers) < 2:
            time.sleep(0.3)
            workers = _children(proc.pid)
        assert len(workers) >= 2, "the pool did not start"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        time.sleep(3)
        alive = [w for w in workers if Path(f"/proc/{w}").exists()
                 and "zombie" not in (Path(f"/proc/{w}/status").read_text().lower())]
        assert alive == [], f"orphaned workers still running: {alive}"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigint_says_how_to_resume_and_keeps_the_store(tmp_path):
    out = tmp_path / "curve"
    proc = subprocess.Popen([sys.executable, "-m", "ftlab.cli.main", "theory", "curve", "--alphas", "0.05:0.45:8",
                             "--seeds", "40", "--dim", "300", "--workers", "1", "--out", str(out)],
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            # a shell without job control starts background jobs with SIGINT ignored, and an
                            # ignored SIGINT is inherited: give the child the default action, as a terminal does
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    while time.time() < deadline and not (out / "simulations.jsonl").exists():
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "run the same command again to resume" in err and "Traceback" not in err
    assert (out / "simulations.jsonl").exists() and not (out / "curve.csv").exists()  # no partial output set


def _boom_at_2(x):
    if x == 2:
        raise RuntimeError("boom")
    return {"x": x}


def _ident(x):
    return {"x": x}


@pytest.mark.parametrize("workers", [1, 2])
def test_stage_lines_off_a_terminal(capsys, workers):
    from ftlab.core import progress as P
    from ftlab.core.sweep import run_sweep

    P.set_stage_lines(True)
    try:
        run_sweep(_ident, [{"x": i} for i in range(3)], workers=workers, desc="demo")
        err = capsys.readouterr().err.splitlines()
        assert err[0] == "ftlab: demo (3 items): started" and err[-1].startswith("ftlab: demo (3 items): done in ")
        with pytest.raises(RuntimeError):
            run_sweep(_boom_at_2, [{"x": i} for i in range(3)], workers=workers, desc="failing")
        assert "ftlab: failing (3 items): stopped after" in capsys.readouterr().err
        P.set_quiet(True)
        run_sweep(_ident, [{"x": i} for i in range(3)], workers=1, desc="quiet")
        assert capsys.readouterr().err == ""
    finally:
        P.set_stage_lines(False)
        P.set_quiet(False)
