"""Every command and snippet of the README runs as written, in order, in an empty folder."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def blocks() -> list[tuple[str, str]]:
    """``(language, code)`` of every fenced block tagged python or bash."""
    return [(lang, code) for lang, code in BLOCK.findall(README.read_text(encoding="utf-8")) if lang in ("python", "bash")]


def commands(code: str) -> list[str]:
    """The ``ftlab ...`` commands of a bash block (continuation lines joined, comments dropped)."""
    joined = code.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        line = line.split("  #")[0].strip()
        if line.startswith("ftlab "):
            out.append(line)
    return out


def test_readme_has_runnable_blocks():
    kinds = [lang for lang, _ in blocks()]
    assert kinds.count("python") >= 3 and kinds.count("bash") >= 2
    assert sum(len(commands(c)) for lang, c in blocks() if lang == "bash") >= 5


@pytest.mark.filterwarnings("ignore")
def test_every_readme_command_and_snippet_runs(tmp_path):
    env_cmd = [sys.executable, "-c", "from ftlab.cli.main import main; main()"]
    for lang, code in blocks():
        if lang == "python":
            r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, f"README snippet failed:\n{code}\n{r.stderr[-2000:]}"
        else:
            for cmd in commands(code):
                args = cmd.split()[1:]
                r = subprocess.run(env_cmd + args, cwd=tmp_path, capture_output=True, text=True, timeout=600)
                assert r.returncode == 0, f"README command failed: {cmd}\n{r.stderr[-2000:]}"
    assert (tmp_path / "runs" / "curve" / "curve.csv").exists()
    assert (tmp_path / "runs" / "transfer" / "model.safetensors").exists()
