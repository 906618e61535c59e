"""What a reader is told: sources they can open, one description of --full, README snippets that run as written."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: References to material outside the repository, which a reader cannot open.
OUTSIDE = re.compile(r"\.\./shared|spec/(theory|bico)|\bspec §|\bspec (theory|bico)\.md|\bspec section|\bspec sec\."
                     r"|\bspec's\b|design\.md|offline-data\.md|\bthe (project's )?brief\b|third-party summary",
                     re.IGNORECASE)


def _reader_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "src").rglob("*.py"))]
    return [f for f in files if f.is_file()]


def _lines_matching(pattern: re.Pattern) -> list[str]:
    """``file:line: text`` of every line of the reader's files that ``pattern`` finds."""
    bad = []
    for f in _reader_files():
        for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                bad.append(f"{f.relative_to(ROOT)}:{i}: {line.strip()[:100]}")
    return bad


def test_no_reference_to_files_outside_the_repository():
    assert _lines_matching(OUTSIDE) == []


def test_the_checker_would_catch_an_outside_reference():
    assert OUTSIDE.search("see spec/bico.md §3") and OUTSIDE.search("(the brief's direction)")
    assert not OUTSIDE.search("spec = TaskSpec(rho_pt=0.1)") and not OUTSIDE.search("infer_spec(model)")


def test_readme_help_and_docs_agree_on_the_scale_of_full():
    from click.testing import CliRunner

    from ftlab.cli.main import cli
    from ftlab.report import FULL_SCALE

    runner = CliRunner()
    top = runner.invoke(cli, ["--help"]).output
    rep = runner.invoke(cli, ["reproduce", "--help"]).output
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    phrase = "far below the papers' scale"
    assert phrase in FULL_SCALE
    for name, text in (("ftlab --help", top), ("ftlab reproduce --help", rep), ("README.md", readme)):
        flat = " ".join(text.split())
        assert phrase in flat, f"{name} does not describe --full as {phrase!r}"
        assert "paper size" not in flat and "paper-size" not in flat, f"{name} calls --full paper size"


#: How a project's development speaks of itself ("issue 14", "item 4", "the issue's goal"): a reader never saw it.
HISTORY = re.compile(r"\bissues? ?#?\d+|\bitems? ?\d+\b|\bitem-\d+|\bthe issue'?s?\b|\bas (this|the) issue\b",
                     re.IGNORECASE)


def test_code_docs_and_report_never_speak_of_the_development():
    assert _lines_matching(HISTORY) == []


def test_the_checker_would_catch_the_development_vocabulary():
    for text in ("as issue 14 states", "(item 4)", "the item-4 investigation", "The issue's goal is not met"):
        assert HISTORY.search(text), text
    for text in ("a known issue in torch", "items in a list", "for item in batches", "issues of the user"):
        assert not HISTORY.search(text), text
