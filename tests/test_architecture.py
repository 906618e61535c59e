"""The import rules of docs/architecture.md, checked on the source tree (every import, also inside functions)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: package -> the ftlab packages it may import (itself always allowed; the top-level ``ftlab`` too).
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "models": {"core"},
    "data": {"core"},
    "dln": {"core"},
    "deep": {"core", "models"},
    "transfer": {"core"},
    "experiments": {"core", "models", "data", "dln", "deep", "transfer"},
    "report": {"core", "models", "data", "dln", "deep", "transfer", "experiments"},
    "explore": {"core", "dln"},
    "cli": {"core", "models", "data", "dln", "deep", "transfer", "experiments", "report", "explore"},
}


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "ftlab" else None


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            out.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names if node.module == "ftlab")
        elif isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
    return out


def forbidden_arrows(src: Path = SRC) -> list[str]:
    """``file:line: a -> b`` for every import that breaks :data:`ALLOWED`."""
    bad = []
    for path in sorted((src / "ftlab").rglob("*.py")):
        rel = path.relative_to(src)
        here = rel.parts[1] if len(rel.parts) > 2 else None  # None: a top-level module (ftlab/__init__.py)
        for line, mod in _imports(path):
            if mod.startswith("."):
                bad.append(f"{rel}:{line}: relative import {mod}")
                continue
            there = _package(mod)
            if there is None or there == here or there == "__version__":
                continue
            if here is None:
                bad.append(f"{rel}:{line}: the top-level package imports ftlab.{there}")
            elif there not in ALLOWED.get(here, set()):
                bad.append(f"{rel}:{line}: ftlab.{here} -> ftlab.{there}")
    return bad


def test_every_package_of_src_has_a_rule():
    packages = {p.name for p in (SRC / "ftlab").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages == set(ALLOWED), "add the new package to docs/architecture.md and to ALLOWED"


def test_no_forbidden_import_arrow():
    assert forbidden_arrows() == []


def test_the_checker_catches_a_forbidden_arrow(tmp_path):
    bad = tmp_path / "ftlab" / "transfer"
    bad.mkdir(parents=True)
    (bad / "oops.py").write_text("def f():\n    from ftlab.deep import rescale_\n")
    (tmp_path / "ftlab" / "core").mkdir()
    (tmp_path / "ftlab" / "core" / "ok.py").write_text("import ftlab.report\n")
    assert sorted(forbidden_arrows(tmp_path)) == ["ftlab/core/ok.py:1: ftlab.core -> ftlab.report",
                                                  "ftlab/transfer/oops.py:2: ftlab.transfer -> ftlab.deep"]


@pytest.mark.parametrize("modules", [["ftlab", "ftlab.dln", "ftlab.dln.replica", "ftlab.dln.advisor"],
                                     ["ftlab.cli.main"]])
def test_theory_and_the_cli_entry_import_no_torch(modules):
    code = "import sys\n" + "".join(f"import {m}\n" for m in modules) + "print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
