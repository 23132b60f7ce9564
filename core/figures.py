"""Plotly figure builders shared by the app's pages and the headless CLI export.

Builders take results (arrays, dataclasses) and return `go.Figure`s in the screen theme;
`paper_version` restyles any of them for print, and `export_figure` writes PNG/SVG/PDF through
kaleido (Debian's chromium) plus the figure's data as CSV and JSON with provenance.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import os
import shutil
from pathlib import Path
from typing import Sequence

import plotly.graph_objects as go

from assets.theme import PAPER, PAPER_HEIGHT, PAPER_SCALE, PAPER_WIDTH, SCREEN
from core.errors import HeadLabError
from core.workspace import atomic_write_bytes, atomic_write_json

IMAGE_FORMATS = ("png", "svg", "pdf")


def _ensure_browser() -> None:
    """Point kaleido at Debian's chromium; it never downloads a browser."""
    if os.environ.get("BROWSER_PATH"):
        return
    for candidate in ("/usr/bin/chromium", shutil.which("chromium") or "", shutil.which("chromium-browser") or ""):
        if candidate and Path(candidate).exists():
            os.environ["BROWSER_PATH"] = candidate
            return
    raise HeadLabError("figure export needs Debian's chromium: run `apt-get install chromium` (make app does it).")


def screen_version(fig: go.Figure) -> go.Figure:
    fig.update_layout(template=SCREEN)
    return fig


def paper_version(fig: go.Figure, width: int = PAPER_WIDTH, height: int = PAPER_HEIGHT) -> go.Figure:
    """A copy restyled for print: white, serif, no gridlines, print size."""
    out = go.Figure(copy.deepcopy(fig))
    out.update_layout(template=PAPER, width=width, height=height)
    out.update_xaxes(showgrid=False)
    out.update_yaxes(showgrid=False)
    return out


def figure_bytes(fig: go.Figure, fmt: str, paper: bool = True) -> bytes:
    """PNG (high resolution), SVG or PDF bytes of a figure, for download buttons."""
    if fmt not in IMAGE_FORMATS:
        raise HeadLabError(f"unknown image format '{fmt}'; use one of {', '.join(IMAGE_FORMATS)}.")
    _ensure_browser()
    target = paper_version(fig) if paper else fig
    scale = PAPER_SCALE if fmt == "png" else 1
    return target.to_image(format=fmt, scale=scale)


def rows_to_csv(rows: Sequence[dict]) -> bytes:
    if not rows:
        return b""
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue().encode()


def export_figure(fig: go.Figure, out_stem: Path, rows: Sequence[dict], provenance: dict,
                  formats: Sequence[str] = IMAGE_FORMATS) -> list[Path]:
    """Write `<stem>.png/.svg/.pdf` (paper theme) plus `<stem>.csv` and `<stem>.json` (data + provenance)."""
    out_stem = Path(out_stem)
    written = []
    for fmt in formats:
        path = out_stem.with_suffix(f".{fmt}")
        atomic_write_bytes(path, figure_bytes(fig, fmt))
        written.append(path)
    csv_path = out_stem.with_suffix(".csv")
    atomic_write_bytes(csv_path, rows_to_csv(rows))
    json_path = out_stem.with_suffix(".json")
    atomic_write_json(json_path, {"provenance": provenance, "data": list(rows)})
    return written + [csv_path, json_path]


def json_bytes(rows: Sequence[dict], provenance: dict) -> bytes:
    return json.dumps({"provenance": provenance, "data": list(rows)}, indent=2).encode()
