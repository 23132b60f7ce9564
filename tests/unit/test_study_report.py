"""The study report's head-role table on the committed reports: a direct effect is printed only where it was
measured (Gemma-3's post-attention norm leaves no frozen-scale share per head, and its study says so)."""

from __future__ import annotations

import json
from pathlib import Path

from core.cli.study_run import report_markdown

REPORTS = Path(__file__).resolve().parents[2] / "docs" / "real-models"


def _roles_rows(markdown: str) -> list[str]:
    section = markdown[markdown.index("### Head roles"):]
    section = section[:section.index("###", 3)]  # up to the next section
    return [line for line in section.splitlines() if line.startswith("| L")]


def test_direct_effects_not_measured_are_not_printed_as_zeros():
    gemma = report_markdown(json.loads((REPORTS / "gemma3-270m-ioi" / "report.json").read_text()))
    rows = _roles_rows(gemma)
    assert rows and all("| not measured |" in row for row in rows)
    assert "largest direct effects" not in gemma and "direct effects not measured" in gemma


def test_measured_direct_effects_are_printed():
    smollm2 = report_markdown(json.loads((REPORTS / "smollm2-135m-ioi" / "report.json").read_text()))
    assert _roles_rows(smollm2) and not any("not measured" in row for row in _roles_rows(smollm2))
    assert "the largest direct effects, whatever their label" in smollm2
