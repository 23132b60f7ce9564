"""Drawing helpers every figure module shares: log colour scales, the [layer, head] grid, legends, pickers.

Grids of heads are indexed [layer, head]: x = head, y = layer (layer 0 at the top). Grids that a
page lets the user click carry a "picker" trace (square markers, customdata = "L{l}H{h}"), because
plotly heatmaps emit no selection events; `core.figures.bundle.paper_version` drops the pickers.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np
import plotly.graph_objects as go

from core.heads import Head, head_name, parse_heads
from core.stats.inference import MIN_RELIABLE_Z_CONTROLS, format_z

PICKER = "picker"  # trace meta of the invisible click targets on heatmaps
SELECTIVITY_FLOOR = 1e-3  # log scale: selectivity below this is drawn at this value
GRID_CELL_PX = 40  # one head's square in a pickable grid
Z_GREY = "#aaaaaa"  # a z from fewer than MIN_RELIABLE_Z_CONTROLS controls is drawn in this colour
UNRELIABLE_OPACITY = 0.35  # bars of such a z


def z_reliable(n_controls: int | None) -> bool:
    """Whether a z from n_controls controls is drawn in full (>= 10 controls) or greyed out."""
    return n_controls is not None and int(n_controls) >= MIN_RELIABLE_Z_CONTROLS


def rank_z_title(rank: int | None, p: float | None, n_controls: int, z: float | None) -> str:
    """A panel title leading with the rank among controls and its p; z after, greyed below 10 controls.

    e.g. "rank 1/21, p = 0.048 · z = +2.3 (20 ctrl)"; plotly renders the <span> colour.
    """
    z_text = f"z = {format_z(z)} ({n_controls} ctrl)"
    if not z_reliable(n_controls):
        z_text = f"<span style='color:{Z_GREY}'>{z_text}</span>"
    if rank is None or p is None:
        return z_text
    return f"rank {rank}/{n_controls + 1}, p = {p:.2g} · {z_text}"


def short_tokens(tokens: float) -> str:
    """A token count as researchers read it: 950, 12.3k, 4.1M, 2B (never 4.1e+06)."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if tokens >= scale:
            return f"{tokens / scale:.3g}{unit}"
    return f"{tokens:.0f}"


def _log10(values: np.ndarray) -> np.ndarray:
    return np.log10(np.maximum(np.nan_to_num(np.asarray(values, dtype=np.float64), nan=SELECTIVITY_FLOOR),
                               SELECTIVITY_FLOOR))


def _log_ticks(lo: float, hi: float, marks: Iterable[float] = ()) -> tuple[list[float], list[str]]:
    """Tick positions (log10) and labels "30x" for a log colour bar from 10**lo to 10**hi.

    The marks (thresholds, null floor) are always labelled; a decade too close to a mark is left out.
    """
    marked = [float(v) for v in marks if v and v > 0 and lo <= math.log10(v) <= hi]
    decades = [v for v in (0.001, 0.01, 0.1, 1, 10, 100, 1000, 10_000, 100_000) if lo <= math.log10(v) <= hi]
    values = set(marked) | {v for v in decades if all(abs(math.log10(v) - math.log10(m)) > 0.35 for m in marked)}
    ordered = sorted(values)
    return [math.log10(v) for v in ordered], [f"{v:.3g}x" if v < 1000 else f"{v:.0f}x" for v in ordered]


def _grid_axes(fig: go.Figure, n_layers: int, n_heads: int, row: int | None = None, col: int | None = None) -> None:
    """Head grid axes: x = head, y = layer (layer 0 on top), fixed (a drag selects, it never pans).

    The drag mode is left to Streamlit: a click picks a head, and the chart's toolbar switches to box or
    lasso selection (how picks add up is the page's choice: Streamlit does not pass the shift key).
    """
    kw = {} if row is None else {"row": row, "col": col}
    fig.update_xaxes(title_text="head", tickmode="array", tickvals=list(range(n_heads)),
                     range=[-0.5, n_heads - 0.5], showgrid=False, zeroline=False, fixedrange=True, **kw)
    fig.update_yaxes(title_text="layer", tickmode="array", tickvals=list(range(n_layers)),
                     range=[n_layers - 0.5, -0.5], showgrid=False, zeroline=False, fixedrange=True, **kw)


def _grid_height(n_layers: int, minimum: int = 300) -> int:
    return max(minimum, int(140 + GRID_CELL_PX * max(n_layers, 2)))


def _legend_on_top(fig: go.Figure) -> go.Figure:
    """A horizontal legend between the title and the plot, clear of the axis titles below."""
    fig.update_layout(legend=dict(orientation="h", x=0, xanchor="left", y=1.0, yanchor="bottom",
                                  bgcolor="rgba(255,255,255,0)"),
                      title=dict(y=0.98, yanchor="top"), margin=dict(t=95))
    return fig


def _hline_log(fig: go.Figure, value: float, label: str, dash: str = "solid", right: bool = False) -> None:
    """A labelled horizontal line on a log y axis (plotly places the line in data units, its label in log10)."""
    fig.add_hline(y=float(value), line_dash=dash, line_color="#444", line_width=1)
    fig.add_annotation(x=1 if right else 0, xref="paper", xanchor="right" if right else "left",
                       y=math.log10(max(float(value), SELECTIVITY_FLOOR)), yref="y", yanchor="bottom",
                       text=label, showarrow=False, font=dict(size=10))


def picker_trace(n_layers: int, n_heads: int, hover: np.ndarray | None = None) -> go.Scatter:
    """Invisible square markers on every cell of a [layer, head] grid: click/box/lasso targets."""
    layers, heads = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")
    names = [head_name((int(l), int(h))) for l, h in zip(layers.ravel(), heads.ravel())]
    text = names if hover is None else [f"{n}: {t}" for n, t in zip(names, np.asarray(hover).ravel())]
    return go.Scatter(
        x=heads.ravel().tolist(), y=layers.ravel().tolist(), mode="markers", name="pick", meta=PICKER,
        # transparent colour, not opacity 0: plotly ignores fully transparent (opacity 0) points for clicks
        # small: hover and clicks go to the nearest cell centre whatever size the heatmap is drawn at
        marker=dict(symbol="square", size=8, color="rgba(255,255,255,0.004)", line=dict(width=0)),
        selected=dict(marker=dict(color="rgba(255,255,255,0.004)")),
        unselected=dict(marker=dict(color="rgba(255,255,255,0.004)")),
        customdata=names, text=text, hovertemplate="%{text}<extra></extra>", showlegend=False,
    )


def heads_from_points(points: Iterable[dict]) -> list[Head]:
    """Heads named by selection points (customdata "L1H3", or x = head, y = layer on a grid)."""
    out: list[Head] = []
    for point in points or ():
        data = point.get("customdata")
        if isinstance(data, (list, tuple)):
            data = data[0] if data else None
        if isinstance(data, str) and data:
            out.extend(parse_heads(data).heads)
    return sorted(set(out))


def _metric_label(metric: str) -> str:
    """Axis label of an ablation metric's delta."""
    return {"loss": "Δ loss (nats)", "top1": "Δ top-1", "top5": "Δ top-5", "target_logit": "Δ target logit"}.get(metric, metric)
