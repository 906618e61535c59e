"""Blame the right party: errors of the user's model, data, loss or module exit 2 naming them; ftlab's own
defects stay "internal error" (exit 1)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import ftlab
from ftlab.cli import main as M
from ftlab.core.usercode import UserCodeError, blame, culprit, load_callable

FTLAB_CODE = Path(ftlab.__file__).parent / "core" / "simulated_defect.py"


def _defined_in(path: Path, source: str, name: str):
    """A function whose code lives in ``path`` (for tracebacks), without writing the file."""
    ns: dict = {}
    exec(compile(source, str(path), "exec"), ns)
    return ns[name]


def test_an_error_in_the_users_code_names_the_input_and_the_place(tmp_path):
    loss = _defined_in(tmp_path / "mymodels.py", "def loss(model, batch):\n    return batch['y'] + 1\n", "loss")
    with pytest.raises(UserCodeError) as info:
        with blame("--loss mymodels:loss, calibration batch 3"):
            loss(None, {})
    msg = str(info.value)
    assert msg.startswith("--loss mymodels:loss, calibration batch 3: KeyError: 'y' (at ")
    assert f"{tmp_path / 'mymodels.py'}:2, in loss)" in msg and "\n" not in msg
    assert isinstance(info.value.__cause__, KeyError)


def test_an_error_raised_inside_a_library_model_is_the_users_input():
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(8, 4))
    with pytest.raises(UserCodeError, match=r"target model, calibration batch 0: RuntimeError: mat1 and mat2 shapes"):
        with blame("target model, calibration batch 0"):
            model(torch.zeros(2, 5))  # a width that does not match the data
    with pytest.raises(UserCodeError, match="RuntimeError: .*(Float|Long|dtype)"):
        with blame("target model, calibration batch 0"):
            model(torch.zeros(2, 8, dtype=torch.long))  # integer inputs


def test_ftlabs_own_defects_are_not_blamed_on_the_user():
    torch = pytest.importorskip("torch")
    bug = _defined_in(FTLAB_CODE, "def bug(*a):\n    return {}['missing']\n", "bug")
    with pytest.raises(KeyError):  # unchanged: the CLI reports it as an internal error
        with blame("target model, calibration batch 0"):
            bug()
    hook = _defined_in(FTLAB_CODE, "import torch\ndef hook(module, args, out):\n    torch.nn.functional.interpolate("
                       "out, size=3, scale_factor=2)\n", "hook")
    model = torch.nn.Linear(4, 4)
    model.register_forward_hook(hook)  # ftlab code called back by torch, failing inside torch
    with pytest.raises(ValueError, match="only one of size or scale_factor") as info:
        with blame("target model, calibration batch 0"):
            model(torch.zeros(1, 2, 4))
    assert not isinstance(info.value, UserCodeError)
    adapter = _defined_in(FTLAB_CODE, "def hf_loss(model, batch):\n    return model(batch)\n", "hf_loss")
    with pytest.raises(UserCodeError, match="source model, calibration batch 2: RuntimeError: mat1 and mat2"):
        with blame("source model, calibration batch 2"):  # ftlab only passes the call on: the model's error
            adapter(model, torch.zeros(1, 5))
    for passing in (MemoryError("37 GiB"), KeyboardInterrupt(), UserCodeError("named already")):
        with pytest.raises(type(passing)) as info:
            with blame("x"):
                raise passing
        assert info.value is passing


@pytest.mark.parametrize("where, code, kind", [("user", 2, "in your code"), ("ftlab", 1, "internal error")])
def test_the_cli_tells_the_users_code_from_ftlabs(monkeypatch, capsys, tmp_path, where, code, kind):
    path = tmp_path / "mine.py" if where == "user" else FTLAB_CODE
    boom = _defined_in(path, "def boom(*a, **k):\n    raise IndexError('Target 7 is out of bounds.')\n", "boom")
    monkeypatch.setattr(M.cli, "main", boom)
    with pytest.raises(SystemExit) as info:
        M.main(["theory", "--help"])
    err = capsys.readouterr().err
    assert info.value.code == code and kind in err and err.count("\n") == 1 and "Target 7" in err
    assert culprit(IndexError())[0] == "library"  # no traceback at all: nobody's code


def test_a_module_that_fails_on_import_is_named(tmp_path):
    (tmp_path / "broken.py").write_text("import torch\nundefined_name\n")
    with pytest.raises(UserCodeError, match=r"--loss: importing '.*broken\.py' failed: NameError: name 'undefined_name' "
                                            r"is not defined \(at .*broken\.py:2, in <module>\)"):
        load_callable(f"{tmp_path}/broken.py:loss", "--loss")
    with pytest.raises(FileNotFoundError, match="--loss: no such Python file"):
        load_callable(f"{tmp_path}/absent.py:loss", "--loss")
    with pytest.raises(ValueError, match="broken.py' has no callable 'loss'"):
        (tmp_path / "broken.py").write_text("x = 1\n")
        load_callable(f"{tmp_path}/broken.py:loss", "--loss")
    with pytest.raises(ValueError, match="expected module:function"):
        load_callable("no_colon", "--data")


CONSOLE = """
import sys
from ftlab.core.usercode import load_callable
assert "" not in sys.path and sys.path[0] != {cwd!r}, sys.path   # like a console script
print(load_callable("mymodels:small", "--source-arch")())
try:
    load_callable("notthere:small", "--source-arch")
except ValueError as e:
    print(e)
try:
    load_callable("needsdep:f", "--loss")
except ValueError as e:
    print(type(e).__name__, e)
"""


def test_a_module_in_the_current_folder_imports_as_the_help_shows(tmp_path):
    (tmp_path / "mymodels.py").write_text("def small():\n    return 'a small model'\n")
    (tmp_path / "needsdep.py").write_text("import a_dependency_that_is_not_installed\n")
    r = subprocess.run([sys.executable, "-I", "-c", CONSOLE.format(cwd=str(tmp_path))], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "a small model"
    assert lines[1].startswith("--source-arch: cannot import 'notthere': no module 'notthere' on Python's path or in "
                               "the current folder")
    assert "give the file instead, e.g. path/to/notthere.py:small" in lines[1]
    assert lines[2].startswith("UserCodeError --loss: importing 'needsdep' failed: ModuleNotFoundError: No module "
                               "named 'a_dependency_that_is_not_installed'")


MODELS = """
import torch
def a():
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
def loss(model, batch):
    return torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"])
"""


@pytest.mark.parametrize("case", ["labels out of range", "module fails on import"])
def test_ftlab_transfer_blames_the_users_loss_and_module(tmp_path, monkeypatch, capsys, case):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    monkeypatch.chdir(tmp_path)
    Path("m.py").write_text(MODELS if case == "labels out of range" else MODELS + "\nraise RuntimeError('no GPU here')\n")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
    for name in ("a", "a_ft", "b"):
        save_file({k: v + (0.1 if name == "a_ft" else 0) for k, v in net.state_dict().items()}, f"{name}.safetensors")
    save_file({"x": torch.randn(8, 4), "y": torch.full((8,), 7)}, "cal.safetensors")  # 3 classes, label 7
    with pytest.raises(SystemExit) as info:
        M.main(["transfer", "--source-base", "a.safetensors", "--source-finetuned", "a_ft.safetensors", "--target-base",
                "b.safetensors", "--source-arch", "m.py:a", "--target-arch", "m.py:a", "--data", "cal.safetensors",
                "--loss", "m.py:loss", "--method", "bico", "--out", "out"])
    stage_line = re.compile(r"ftlab: .*: (started|done in .*|stopped after .*|\d+(/\d+)? after .*)$")  # progress
    err = [line for line in capsys.readouterr().err.splitlines() if not stage_line.match(line)]
    assert info.value.code == 2 and len(err) == 1 and err[0].startswith("ftlab: error: "), err
    err = err[0]
    assert ("Target 7 is out of bounds" in err if case == "labels out of range" else "no GPU here" in err)
    assert "m.py" in err and not Path("out").exists()
