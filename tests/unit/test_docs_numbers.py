"""Every measured figure in the README, docs/performance.md and docs/patching.md comes from a committed measurement.

A figure is a number written with a decimal point (2.49, 0.80, 1.4e-06) in the prose, outside code and
link targets; integers (counts, shapes, steps) are not checked. It is found when some number in
docs/measurements/*.json or docs/replication/*/report.json, rounded to the figure's decimals (or to
its two significant digits, in scientific notation), equals it, or equals it as a percentage.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECKED = [REPO / "README.md", REPO / "docs" / "performance.md", REPO / "docs" / "patching.md", REPO / "docs" / "edges.md"]
SOURCES = [*sorted((REPO / "docs" / "measurements").glob("*.json")), *sorted((REPO / "docs" / "replication").glob("*/report.json")),
           *sorted((REPO / "docs" / "real-models").glob("*/report.json"))]  # `study` reports (issue 42)
CHECKED += sorted((REPO / "docs" / "real-models").glob("*/report.md"))

CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)
LINK_TARGET = re.compile(r"\]\([^)]*\)")
ARXIV = re.compile(r"arXiv \d+\.\d+")
FIGURE = re.compile(r"(?<![\w.])(\d+\.\d+(?:e[-+]?\d+)?)(?![\w.]*\d)")


def figures(text: str) -> list[str]:
    """The decimal figures of a Markdown text's prose: [text as written]."""
    prose = ARXIV.sub("", LINK_TARGET.sub("]", CODE.sub("", text)))
    return FIGURE.findall(prose)


def _numbers(value) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)] if math.isfinite(value) else []
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in _numbers(v)]
    return []


def matches(figure: str, value: float) -> bool:
    """Whether `value` (or 100 x value) reads as `figure` at the figure's precision."""
    for v in (abs(value), abs(value) * 100):
        if "e" in figure:
            if f"{v:.1e}" == f"{float(figure):.1e}":
                return True
        elif f"{v:.{len(figure.split('.')[1])}f}" == figure:
            return True
    return False


def test_the_figure_rule_on_hand_made_text():
    text = "ratio **2.49x** (`bench probe 9.99`), see [x](a/1.5.json), arXiv 2605.24059, 3 layers, 1.4e-06, v2.13.0"
    assert figures(text) == ["2.49", "1.4e-06"]
    assert matches("2.49", 2.4928) and matches("0.80", 0.8037) and matches("91.87", 0.9187)
    assert matches("1.4e-06", 1.430511e-06) and not matches("2.50", 2.4928)


@pytest.fixture(scope="module")
def measured() -> list[float]:
    assert SOURCES, "no committed measurement files under docs/"
    return [x for path in SOURCES for x in _numbers(json.loads(path.read_text()))]


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_figure_is_in_a_committed_measurement(path, measured):
    missing = [f for f in figures(path.read_text()) if not any(matches(f, v) for v in measured)]
    assert missing == [], f"{path.name}: figures with no committed measurement: {missing}"
