"""The head inspector's figures: one head's attention row and full pattern on one example, and its
selectivity for every pattern against the class threshold and the null floor.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import plotly.graph_objects as go

from core.figures._style import SELECTIVITY_FLOOR, _hline_log, _legend_on_top
from core.figures.bundle import FigureBundle
from core.figures.theme import CANDIDATE_COLOR, CLASS_COLORS, SCREEN
from core.heads import Head, head_name
from core.results import provenance
from core.tasks.vocab import token_label


def _pattern_marks(query_pos: int, induction_pos: int, duplicate_pos: int) -> dict[str, int]:
    return {"induction (p+1)": int(induction_pos), "duplicate (p)": int(duplicate_pos),
            "previous (q−1)": int(query_pos) - 1, "first (0)": 0}


def attention_row(row: np.ndarray, tokens: Sequence[int], query_pos: int, induction_pos: int, duplicate_pos: int,
                  head: Head, example: int, model: str, revision: str) -> FigureBundle:
    """One head's attention from the query position to every key on one example, pattern targets marked."""
    row = np.asarray(row, dtype=np.float64)[: query_pos + 1]  # keys after q get no attention (causal)
    labels = [token_label(t) for t in list(tokens)[: query_pos + 1]]
    marks = _pattern_marks(query_pos, induction_pos, duplicate_pos)
    colors = ["#B0B0B0"] * len(row)
    mark_colors = {"induction (p+1)": CLASS_COLORS["induction"], "duplicate (p)": CLASS_COLORS["duplicate-token"],
                   "previous (q−1)": CLASS_COLORS["previous-token"], "first (0)": CLASS_COLORS["first-token"]}
    for name, pos in marks.items():
        if 0 <= pos < len(colors):
            colors[pos] = mark_colors[name]
    fig = go.Figure(go.Bar(x=list(range(len(row))), y=row.tolist(), marker_color=colors, customdata=labels,
                           hovertemplate="key %{x} '%{customdata}': %{y:.3f}<extra></extra>", name="attention"))
    for name, pos in marks.items():  # legend entries naming the coloured keys
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"{name} = {pos}",
                                 marker=dict(symbol="square", size=10, color=mark_colors[name])))
    fig.update_layout(template=SCREEN, height=300, title=f"{head_name(head)} attention from q = {query_pos} (example {example})",
                      xaxis_title="key position", yaxis_title="attention")
    _legend_on_top(fig)
    rows = tuple({"example": example, "key": k, "token": int(tokens[k]), "label": labels[k], "attention": float(row[k]),
                  "role": next((n for n, p in marks.items() if p == k), "")} for k in range(len(row)))
    prov = provenance(figure="attention_row", model=model, revision=revision, head=head_name(head), example=example,
                      query_pos=int(query_pos))
    return FigureBundle(f"inspector-{head_name(head)}-row-ex{example}", fig, rows, prov,
                        "coloured keys: the pattern targets at this query position.")


def attention_pattern(pattern: np.ndarray, tokens: Sequence[int], query_pos: int, head: Head, example: int,
                      model: str, revision: str, window: int = 256) -> FigureBundle:
    """One head's full attention pattern [query, key] on one example, the probed query row outlined.

    Long sequences show the last `window` positions up to the query (a browser draws that many cells).
    """
    pattern = np.asarray(pattern, dtype=np.float64)  # [q, k]
    start = max(0, int(query_pos) + 1 - window)
    stop = max(int(query_pos) + 1, min(pattern.shape[0], start + window))
    pattern = pattern[start:stop, start:stop]
    n = pattern.shape[0]
    positions = list(range(start, stop))
    labels = [f"{i}:{token_label(t)}" for i, t in zip(positions, list(tokens)[start:stop])]
    fig = go.Figure(go.Heatmap(z=pattern.tolist(), x=positions, y=positions, colorscale="Greys", zmin=0,
                               zmax=1, colorbar=dict(title="attention"),
                               customdata=[[labels[k] for k in range(n)] for _ in range(n)],
                               hovertemplate="q %{y} → key %{customdata}: %{z:.3f}<extra></extra>"))
    fig.add_shape(type="rect", x0=start - 0.5, x1=stop - 0.5, y0=query_pos - 0.5, y1=query_pos + 0.5,
                  line=dict(color=CANDIDATE_COLOR, width=2))
    fig.update_layout(template=SCREEN, height=480, width=560, title=f"{head_name(head)} full pattern (example {example})",
                      xaxis_title="key position", yaxis_title="query position")
    fig.update_yaxes(autorange="reversed", showgrid=False)
    fig.update_xaxes(showgrid=False)
    rows = tuple({"example": example, "query": start + q, "key": start + k, "attention": float(pattern[q, k])}
                 for q in range(n) for k in range(q + 1))
    prov = provenance(figure="attention_pattern", model=model, revision=revision, head=head_name(head), example=example,
                      query_pos=int(query_pos))
    return FigureBundle(f"inspector-{head_name(head)}-pattern-ex{example}", fig, rows, prov,
                        f"outlined: the probed query row q = {query_pos}.", (420, 380))


def head_scores(sel_head: Sequence[float], patterns: Sequence[str], head: Head, model: str, revision: str,
                class_threshold: float = 30.0, noise_floor: float | None = None, membership: float | None = None,
                induction_threshold: float | None = None, membership_baseline: str = "uniform") -> FigureBundle:
    """One head's selectivity for every pattern (log y), the class threshold and the null floor.

    Induction-circuit membership is judged on another baseline, so it is stated in the title, not drawn.
    """
    values = np.asarray(sel_head, dtype=np.float64)
    fig = go.Figure(go.Bar(x=list(patterns), y=np.maximum(values, SELECTIVITY_FLOOR).tolist(),
                           marker_color=[CLASS_COLORS.get(p, "#888") for p in patterns],
                           hovertemplate="%{x}: %{y:.3g}x<extra></extra>", name="selectivity"))
    _hline_log(fig, class_threshold, f"{class_threshold:g}x class", "dash")
    if noise_floor:
        _hline_log(fig, noise_floor, f"null floor {noise_floor:.3g}x (induction)", "dot", right=True)
    title = f"{head_name(head)} selectivity per pattern at {revision}"
    if membership is not None and induction_threshold is not None:
        verdict = "member" if membership >= induction_threshold else "not a member"
        title += (f"<br><sup>induction membership {membership:.3g}x vs {membership_baseline} baseline "
                  f"(threshold {induction_threshold:.3g}x): {verdict}</sup>")
    # a fixed range with headroom: autorange on log bars cut the tallest bar at the top
    shown = np.maximum(values, SELECTIVITY_FLOOR)
    top = max([float(shown.max()), class_threshold] + ([noise_floor] if noise_floor else []))
    fig.update_layout(template=SCREEN, height=380, title=title, yaxis_title="selectivity (log)", showlegend=False,
                      margin=dict(t=80, b=100))
    fig.update_yaxes(type="log", dtick=1, range=[math.log10(SELECTIVITY_FLOOR), math.log10(top) + 0.5])
    fig.update_xaxes(tickangle=-35, automargin=True)  # pattern names ("duplicate-token") fit a narrow column
    rows = tuple({"head_name": head_name(head), "pattern": p, "selectivity": float(v)} for p, v in zip(patterns, values))
    if membership is not None:
        rows += ({"head_name": head_name(head), "pattern": f"induction membership ({membership_baseline})",
                  "selectivity": float(membership)},)
    prov = provenance(figure="head_scores", model=model, revision=revision, head=head_name(head),
                      class_threshold=class_threshold, induction_threshold=induction_threshold,
                      membership_baseline=membership_baseline, noise_floor=noise_floor)
    return FigureBundle(f"inspector-{head_name(head)}-scores", fig, rows, prov,
                        "the null floor applies to induction selectivity.")
