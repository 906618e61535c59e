"""Output sets replaced whole, locks by identity, inputs never overwritten.

The fault-injection tests (the ``faults`` fixture of tests/conftest.py) fail every file operation of the write
path in turn -- once as an error (a full disk: the operation raises ``OSError``), once as a kill (from that
operation on nothing reaches the disk, as after SIGKILL) -- and check that the folder then holds the complete
old set or the complete new one, the user's own files unchanged, and no staging leftover after the next run.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftlab.core import results as R
from ftlab.core.results import check_output_place, confined_path, output_lock, staged_output

OLD = {"model.bin": b"old model", "report.json": b'{"old": 1}', "sub/table.csv": b"a\n1\n", "config.json": b"{}"}
NEW = {"model.bin": b"new model", "report.json": b'{"new": 2}', "sub/table.csv": b"a\n2\n", "extra.txt": b"new only"}
USER = {"notes.md": b"the user's own file", "sub/mine.txt": b"also the user's"}


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` except ftlab's own bookkeeping (the lock, manifests, stages)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.relative_to(folder).as_posix().startswith(".ftlab")}


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".ftlab") and not p.name.startswith(".ftlab-set-"))


def _write(stage: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        R.atomic_write_bytes(stage / rel, data)


def _manifest(folder: Path) -> list[str]:
    return json.loads((folder / ".ftlab-set-output.json").read_text())["files"]


@pytest.fixture
def old_set(tmp_path):
    out = tmp_path / "out"
    with staged_output(out) as st:
        _write(st, OLD)
    for rel, data in USER.items():
        (out / rel).write_bytes(data)
    assert _files(out) == {**OLD, **USER}
    return out


def test_a_new_set_replaces_the_old_one_and_keeps_the_users_files(old_set):
    with staged_output(old_set) as st:
        _write(st, NEW)
    assert _files(old_set) == {**NEW, **USER}  # config.json of the old set is gone, notes.md stays
    assert _manifest(old_set) == sorted(NEW) and _leftovers(old_set) == []


def test_a_failed_block_keeps_the_old_set(old_set):
    with pytest.raises(RuntimeError, match="boom"):
        with staged_output(old_set) as st:
            _write(st, {"model.bin": b"half"})
            raise RuntimeError("boom")
    assert _files(old_set) == {**OLD, **USER} and _leftovers(old_set) == []


@pytest.fixture(autouse=True)
def _no_disk_flush(monkeypatch):
    """fsync is counted and failed like every other operation, but does not wait for the disk."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


def _count_ops(tmp_path, monkeypatch, faults) -> list:
    out = tmp_path / "count"
    with staged_output(out) as st:
        _write(st, OLD)
    with monkeypatch.context() as m:
        inj = faults.Injector(m, None, "error")
        with staged_output(out) as st:
            _write(st, NEW)
    return inj.log


@pytest.mark.parametrize("mode", ["error", "kill"])
def test_a_fault_at_any_file_operation_leaves_the_old_or_the_new_set(tmp_path, monkeypatch, faults, mode):
    log = _count_ops(tmp_path, monkeypatch, faults)
    assert len(log) > 20 and any(p.endswith(".ftlab-commit-output") for op, p in log if op == "rename")
    outcomes = {"old": 0, "new": 0}
    for k in range(1, len(log) + 1):
        out = tmp_path / f"{mode}{k}"
        with staged_output(out) as st:
            _write(st, OLD)
        for rel, data in USER.items():
            (out / rel).write_bytes(data)
        raised = True
        with monkeypatch.context() as m:
            faults.Injector(m, k, mode)
            try:
                with staged_output(out) as st:
                    _write(st, NEW)
                raised = False  # a failed clean-up after the commit (the trash is deleted at the next run)
            except (OSError, faults.Killed):
                pass
        with output_lock(out):  # the next run: completes or discards what the fault left
            pass
        state = _files(out)
        assert state in ({**OLD, **USER}, {**NEW, **USER}), f"{mode} at operation {k} {log[k - 1]}: a mixed set"
        which = "old" if state == {**OLD, **USER} else "new"
        assert raised or which == "new", f"{mode} at operation {k} {log[k - 1]}: success reported, old set kept"
        assert _manifest(out) == sorted(OLD if which == "old" else NEW), f"{mode} at {k}: manifest of the other set"
        assert _leftovers(out) == [], f"{mode} at operation {k}: {_leftovers(out)} left after the next run"
        outcomes[which] += 1
    assert outcomes["old"] > 0 and (mode == "error" or outcomes["new"] > 0), outcomes


def test_an_error_during_the_commit_is_undone_at_once(old_set, monkeypatch):
    real, calls = os.replace, []

    def replace(src, dst, **kw):  # the third rename of the commit fails (after two files moved)
        calls.append(dst)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return real(src, dst, **kw)

    with pytest.raises(OSError, match="No space left"):
        with staged_output(old_set) as st:
            _write(st, NEW)
            monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "replace", real)
    assert len(calls) == 3 and _files(old_set) == {**OLD, **USER}  # no next run needed
    assert "discarded" in R.output_outcomes()[-1]


KILL_CHILD = r"""
import os, signal, sys
from ftlab.core import results as R
out, k = sys.argv[1], int(sys.argv[2])
OPS = sys.argv[3].split(",")
NEW = {"model.bin": b"new model", "report.json": b'{"new": 2}', "sub/table.csv": b"a\n2\n", "extra.txt": b"new only"}
count = [0]
def wrap(name, real):
    def op(*a, **kw):
        if not (name == "unlink" and str(a[0]).endswith(".ftlab.lock")):
            count[0] += 1
            if count[0] == k:
                os.kill(os.getpid(), signal.SIGKILL)
        return real(*a, **kw)
    return op
for name in OPS:
    setattr(os, name, wrap(name, getattr(os, name)))
with R.staged_output(out) as st:
    for rel, data in NEW.items():
        R.atomic_write_bytes(st / rel, data)
"""


def test_sigkill_during_the_commit_leaves_old_or_new_after_the_next_run(tmp_path, monkeypatch, faults):
    log = _count_ops(tmp_path, monkeypatch, faults)
    commit = next(i for i, (op, p) in enumerate(log, 1) if op == "rename" and p.split(" -> ")[1].endswith("-commit-output"))
    seen = set()
    for k in sorted({1, commit - 1, commit, commit + 1, commit + 3, len(log)}):
        out = tmp_path / f"k{k}"
        with staged_output(out) as st:
            _write(st, OLD)
        (out / "notes.md").write_bytes(USER["notes.md"])
        r = subprocess.run([sys.executable, "-c", KILL_CHILD, str(out), str(k), ",".join(faults.OPS)], capture_output=True,
                           timeout=60)
        assert r.returncode == -signal.SIGKILL, r.stderr
        if k <= commit:
            assert _files(out) == {**OLD, "notes.md": USER["notes.md"]}, (k, commit)  # before the commit point: untouched
        with output_lock(out):
            pass
        state = _files(out)
        assert state in ({**OLD, "notes.md": USER["notes.md"]}, {**NEW, "notes.md": USER["notes.md"]}), k
        assert _leftovers(out) == [], (k, _leftovers(out))
        seen.add("old" if state["model.bin"] == OLD["model.bin"] else "new")
    assert seen == {"old", "new"}


def _ftlab(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "ftlab.cli.main", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def test_sigterm_discards_the_unfinished_output_and_says_so(tmp_path):
    out = tmp_path / "curve"
    first = _ftlab("theory", "curve", "--alpha", "0.1", "--out", str(out))
    assert first.wait(timeout=120) == 0
    before = _files(out)
    proc = _ftlab("theory", "curve", "--alphas", "0.05:0.45:8", "--seeds", "40", "--dim", "300", "--workers", "1",
                  "--out", str(out))
    deadline = time.time() + 60
    while time.time() < deadline and not (out / "simulations.jsonl").exists():
        time.sleep(0.2)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "terminated" in err and "no partial output was written" not in err and "Traceback" not in err
    assert {k: v for k, v in _files(out).items() if k != "simulations.jsonl"} == before  # the old curve, whole
    assert _leftovers(out) == []  # no staging folder, no lock file


def test_the_lock_goes_by_the_folder_not_its_spelling(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from ftlab.core.results import output_lock\n"
                               f"with output_lock({str(real)!r}):\n    print('held', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for spelling in (tmp_path / "alias", tmp_path / "alias" / ".." / "real", Path(os.path.relpath(real))):
            with pytest.raises(ValueError, match=f"in use by another ftlab run \\(pid {holder.pid}"):
                with output_lock(spelling):
                    pass
    finally:
        holder.communicate("", timeout=30)
    assert sorted(p.name for p in real.iterdir()) == []  # the lock file is gone with its run
    with output_lock(tmp_path / "alias") as place:
        assert place == real.resolve() and (real / ".ftlab.lock").exists()
    assert not (real / ".ftlab.lock").exists()


def test_a_failed_run_leaves_no_folder_it_created(tmp_path):
    with pytest.raises(ValueError, match="bad model"):
        with output_lock(tmp_path / "a" / "b" / "out"):
            raise ValueError("bad model")
    assert list(tmp_path.iterdir()) == []  # neither out nor its parents
    with pytest.raises(NotADirectoryError):
        (tmp_path / "file").write_text("x")
        with output_lock(tmp_path / "file" / "out"):
            pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_an_output_folder_on_another_filesystem_through_a_symlink(tmp_path):
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another filesystem")
    target = shm / f"ftlab-test-{os.getpid()}-{time.time_ns()}"
    target.mkdir()
    try:
        (tmp_path / "out").symlink_to(target)
        r = subprocess.run([sys.executable, "-m", "ftlab.cli.main", "theory", "curve", "--alpha", "0.1", "--out",
                            str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert {"curve.csv", "curve.png"} <= set(_files(target)) and _leftovers(target) == []
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing beside the link
    finally:
        import shutil

        shutil.rmtree(target, ignore_errors=True)


def _mount(*args) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


def test_a_mount_point_and_a_writable_folder_under_a_read_only_parent(tmp_path):
    """--out is a tmpfs mount point inside a read-only bind mount: nothing can be created beside it."""
    parent = tmp_path / "ro"
    (parent / "out").mkdir(parents=True)
    if not _mount("--bind", str(parent), str(parent)):
        pytest.skip("mounting needs privileges this test run does not have")
    try:
        assert _mount("-t", "tmpfs", "none", str(parent / "out"))
        assert _mount("-o", "remount,ro,bind", str(parent))
        with pytest.raises(OSError):
            (parent / "x").write_text("read-only parent")
        r = subprocess.run([sys.executable, "-m", "ftlab.cli.main", "theory", "curve", "--alpha", "0.1", "--out",
                            str(parent / "out")], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert {"curve.csv", "curve.png"} <= set(_files(parent / "out")) and _leftovers(parent / "out") == []
        r = subprocess.run([sys.executable, "-m", "ftlab.cli.main", "theory", "curve", "--alpha", "0.1", "--out",
                            str(parent / "new")], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Read-only file system" in r.stderr
        assert "creating the output folder in" in r.stderr and str(parent) in r.stderr
    finally:
        subprocess.run(["umount", str(parent / "out")], capture_output=True)
        subprocess.run(["umount", str(parent)], capture_output=True)


@pytest.mark.parametrize("spelling, how", [("same", "is"), ("parent", "contains"), ("child", "lies inside"),
                                           ("link", "is")])
def test_an_output_folder_that_touches_an_input_is_refused(tmp_path, spelling, how):
    model = tmp_path / "models" / "hf"
    model.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "link").symlink_to(model)
    out = {"same": model, "parent": tmp_path / "models", "child": model / "out", "link": tmp_path / "link"}[spelling]
    with pytest.raises(ValueError, match=f"{how} the input --target-base"):
        check_output_place(out, {"--data": None, "--target-base": model})
    assert check_output_place(tmp_path / "elsewhere", {"--target-base": model}) == (tmp_path / "elsewhere").resolve()
    file_input = model / "model.safetensors"
    with pytest.raises(ValueError, match="contains the input --source-base"):
        check_output_place(tmp_path / "link", {"--source-base": file_input})


def test_names_from_untrusted_files_stay_in_their_folder(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "secret.safetensors").write_bytes(b"x")
    (folder / "escape.safetensors").symlink_to(tmp_path / "secret.safetensors")
    for bad in ("../secret.safetensors", str(tmp_path / "secret.safetensors"), "escape.safetensors", "", 3, "a/../../x"):
        with pytest.raises(ValueError, match="index.json"):
            confined_path(folder, bad, source="model.safetensors.index.json, field 'weight_map'")
    assert confined_path(folder, "sub/shard-1.safetensors", source="s") == folder / "sub" / "shard-1.safetensors"


def test_a_manifest_cannot_make_ftlab_delete_outside_its_folder(tmp_path):
    out = tmp_path / "out"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    with staged_output(out) as st:
        _write(st, {"a.txt": b"1"})
    (out / ".ftlab-set-output.json").write_text(json.dumps({"files": ["a.txt", "../victim.txt"]}))
    with pytest.raises(ValueError, match="points outside"):
        with staged_output(out) as st:
            _write(st, {"b.txt": b"2"})
    assert victim.read_text() == "keep me" and _files(out) == {"a.txt": b"1"}


def test_ctrl_c_during_the_commit_is_held_until_the_set_is_in_place(old_set, monkeypatch):
    real, sent = os.replace, []

    def replace(src, dst, **kw):
        if ".ftlab-commit-" in str(src) and not sent:  # the first rename that installs a file of the new set
            sent.append(True)
            signal.raise_signal(signal.SIGINT)
        return real(src, dst, **kw)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        with staged_output(old_set) as st:
            _write(st, NEW)
    monkeypatch.setattr(os, "replace", real)
    assert sent and _files(old_set) == {**NEW, **USER} and _leftovers(old_set) == []
    assert R.output_outcomes()[-1].endswith("the new output is complete")


def test_set_files_named_like_ftlabs_bookkeeping_stay_apart(tmp_path):
    """A set may hold files called plan.json or replaced/...; ftlab's own names start with .ftlab (refused in a set)."""
    out = tmp_path / "out"
    first = {"plan.json": b"mine 1", "replaced/x.txt": b"mine 1"}
    second = {"plan.json": b"mine 2", "replaced/x.txt": b"mine 2"}
    for files in (first, second):
        with staged_output(out) as st:
            _write(st, files)
        assert _files(out) == files and _leftovers(out) == []
    with pytest.raises(RuntimeError, match="ftlab's own"):
        with staged_output(out) as st:
            _write(st, {".ftlab-plan.json": b"x"})
    assert _files(out) == second
