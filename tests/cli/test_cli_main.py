"""Exit statuses of the ftlab command: user errors 2 (one line), bugs 1 ("internal error"), never mixed up."""

import errno
from pathlib import Path

import pytest

import ftlab
from ftlab.cli import main as M


def raiser(exc, where: Path):
    """A function that raises ``exc`` from code whose file is ``where`` (decides whose error it is)."""
    ns = {"EXC": exc}
    exec(compile("def boom(*a, **k):\n    raise EXC\n", str(where), "exec"), ns)
    return ns["boom"]


#: A file inside ftlab's own package: an exception raised there is ftlab's defect.
FTLAB_CODE = Path(ftlab.__file__).parent / "cli" / "simulated_defect.py"


def _run(monkeypatch, capsys, exc, argv=("theory", "--help"), where=FTLAB_CODE):
    monkeypatch.setattr(M.cli, "main", raiser(exc, where))
    with pytest.raises(SystemExit) as info:
        M.main(list(argv))
    return info.value.code, capsys.readouterr().err


@pytest.mark.parametrize("exc", [ValueError("lam=2 is out of range: must be in [-1, 1]"),
                                 FileNotFoundError(errno.ENOENT, "No such file or directory", "x.safetensors"),
                                 OSError(errno.ENOSPC, "No space left on device", "out/curve.csv"),
                                 MemoryError("the run needs 37 GiB")])
def test_user_errors_exit_2_with_one_line(monkeypatch, capsys, exc):
    code, err = _run(monkeypatch, capsys, exc)
    assert code == 2 and err.startswith("ftlab: error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_bugs_exit_1_and_say_so(monkeypatch, capsys):
    for exc in (TypeError("unsupported operand"), KeyError("w"), AttributeError("x")):
        code, err = _run(monkeypatch, capsys, exc)
        assert code == 1 and "internal error" in err and "Traceback" not in err
    monkeypatch.setattr(M, "_VERBOSE", 1)
    code, err = _run(monkeypatch, capsys, TypeError("unsupported operand"))
    assert code == 1 and "Traceback" in err


def test_messages_name_the_path():
    assert M._one_line(OSError(errno.EROFS, "Read-only file system", "/ro/out")) == "Read-only file system: /ro/out"
