"""FigureBundle and its export: what every figure builder returns, and how it becomes files.

A builder (one module per view: spectral, screen, ablation, inspector, attribution, coactivation,
dynamics, proposers) takes results and returns a `FigureBundle`: the figure in the screen theme, its
data as rows, and its provenance (core.results.provenance). Pages draw the figure and offer the
exports; `python -m core export` writes the same bundles. `paper_version` restyles any figure for
print, and `export_figure` writes PNG/SVG/PDF through kaleido (Debian's chromium) plus the data as
CSV and JSON with provenance.
"""

from __future__ import annotations

import atexit
import copy
import csv
import io
import json
import os
import shutil
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import plotly.graph_objects as go

from core.choices import IMAGE_FORMATS
from core.errors import HeadLabError
from core.figures._style import PICKER
from core.figures.theme import PAPER, PAPER_HEIGHT, PAPER_SCALE, PAPER_WIDTH
from core.results import json_default
from core.workspace import atomic_write_bytes



@dataclass(frozen=True, eq=False)
class FigureBundle:
    """What a page draws and an export writes: figure (screen theme), data rows, provenance.

    name: file stem for exports ("spectral-pr-trajectories"); caption: one line naming the variant.
    """

    name: str
    figure: go.Figure
    rows: tuple[dict, ...]
    provenance: dict
    caption: str = ""
    paper_size: tuple[int, int] = (PAPER_WIDTH, PAPER_HEIGHT)

    def csv_bytes(self) -> bytes:
        return rows_to_csv(self.rows)

    def json_bytes(self) -> bytes:
        return json_bytes(self.rows, self.provenance)

    def image_bytes(self, fmt: str) -> bytes:
        return figure_bytes(self.figure, fmt, size=self.paper_size)


def _ensure_browser() -> None:
    """Point kaleido at Debian's chromium; it never downloads a browser."""
    if os.environ.get("BROWSER_PATH"):
        return
    for candidate in ("/usr/bin/chromium", shutil.which("chromium") or "", shutil.which("chromium-browser") or ""):
        if candidate and Path(candidate).exists():
            os.environ["BROWSER_PATH"] = candidate
            return
    raise HeadLabError("figure export needs Debian's chromium: run `apt-get install chromium` (make app does it).")


_KALEIDO_LOCK = threading.Lock()
_KALEIDO_STARTED = False


def _kaleido_server() -> None:
    """Start kaleido's persistent browser once per process: later exports take ~0.2 s, not ~3 s."""
    global _KALEIDO_STARTED
    if _KALEIDO_STARTED:
        return
    import kaleido  # lazy: optional, only figure export needs it (and Debian's chromium behind it)

    kaleido.start_sync_server(silence_warnings=True)
    atexit.register(kaleido.stop_sync_server, silence_warnings=True)
    _KALEIDO_STARTED = True


def paper_version(fig: go.Figure, width: int = PAPER_WIDTH, height: int = PAPER_HEIGHT) -> go.Figure:
    """A copy restyled for print: white, serif, no gridlines, print size, no click targets."""
    out = go.Figure(copy.deepcopy(fig))
    out.data = tuple(trace for trace in out.data if getattr(trace, "meta", None) != PICKER)
    out.update_layout(template=PAPER, width=width, height=height, dragmode=False)
    out.update_xaxes(showgrid=False)
    out.update_yaxes(showgrid=False)
    return out


def figure_bytes(fig: go.Figure, fmt: str, paper: bool = True,
                 size: tuple[int, int] = (PAPER_WIDTH, PAPER_HEIGHT)) -> bytes:
    """PNG (high resolution), SVG or PDF bytes of a figure, for download buttons and export."""
    if fmt not in IMAGE_FORMATS:
        raise HeadLabError(f"unknown image format '{fmt}'; use one of {', '.join(IMAGE_FORMATS)}.")
    _ensure_browser()
    target = paper_version(fig, *size) if paper else fig
    scale = PAPER_SCALE if fmt == "png" else 1
    with _KALEIDO_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "kopts ignored when using a server"
        try:
            _kaleido_server()
            return target.to_image(format=fmt, scale=scale)
        except Exception as exc:  # a broken or missing browser: say what to do
            raise HeadLabError(
                f"figure export failed ({type(exc).__name__}: {str(exc)[:160]}); check that Debian's chromium "
                "runs (`chromium --headless --version`) or reinstall it with `apt-get install chromium`."
            ) from None


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


def json_bytes(rows: Sequence[dict], provenance: dict) -> bytes:
    return json.dumps({"provenance": provenance, "data": list(rows)}, indent=2, default=json_default).encode()


def export_figure(fig: go.Figure, out_stem: Path, rows: Sequence[dict], provenance: dict,
                  formats: Sequence[str] = IMAGE_FORMATS,
                  size: tuple[int, int] = (PAPER_WIDTH, PAPER_HEIGHT)) -> list[Path]:
    """Write `<stem>.png/.svg/.pdf` (paper theme) plus `<stem>.csv` and `<stem>.json` (data + provenance)."""
    out_stem = Path(out_stem)
    written = []
    for fmt in formats:
        path = out_stem.with_suffix(f".{fmt}")
        atomic_write_bytes(path, figure_bytes(fig, fmt, size=size))
        written.append(path)
    csv_path = out_stem.with_suffix(".csv")
    atomic_write_bytes(csv_path, rows_to_csv(rows))
    json_path = out_stem.with_suffix(".json")
    atomic_write_bytes(json_path, json_bytes(rows, provenance))
    return written + [csv_path, json_path]


def export_bundle(bundle: FigureBundle, out_dir: Path, prefix: str = "",
                  formats: Sequence[str] = IMAGE_FORMATS) -> list[Path]:
    """Write one bundle as `<out_dir>/<prefix><name>.*`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return export_figure(bundle.figure, out_dir / f"{prefix}{bundle.name}", bundle.rows, bundle.provenance,
                         formats, bundle.paper_size)
