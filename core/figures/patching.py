"""Figures of counterfactual patching (core.pipelines.patching.PatchingReport), shared by the app and exports.

- `head_heatmap`: every head's activation-patching score on a layer x head grid (heads are click targets);
- `position_heatmap`: per head and position (rows: heads, columns: positions of the padded batch);
- `attribution_scatter`: attribution patching's rank of each head against activation patching's, Spearman;
- `controls_strip`: a patched group, or a path's senders, against its random controls (and the group's
  upper bound, every head of its layers).

Scores are on the normalized scale (clean run 1, corrupted run 0). A head's *effect* is its score
when denoising (how much it restores) and 1 - score when noising (how much it breaks); ranks put
the largest effect first.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go
from scipy.stats import rankdata

from core.figures._style import _grid_axes, _grid_height, _legend_on_top, picker_trace, rank_z_title
from core.figures.bundle import FigureBundle
from core.figures.theme import CANDIDATE_COLOR, CONTROL_COLOR, LAYER_COLORS, SCREEN, UPPER_BOUND_COLOR
from core.heads import head_name
from core.results import provenance
from core.stats.patching import base_score

SCORE_SCALE = "RdBu_r"  # diverging around the unpatched run's score: red restores/keeps, blue the opposite
SCALE_NOTE = "score: clean run 1, corrupted run 0"


def effect(scores: np.ndarray, direction: str) -> np.ndarray:
    """How much patching moved the run, signed so larger is more: the score (denoise) or 1 - score (noise)."""
    scores = np.asarray(scores, dtype=np.float64)
    return scores if direction == "denoise" else 1.0 - scores


def effect_ranks(scores: np.ndarray, direction: str) -> np.ndarray:
    """Rank of each entry by effect, 1 = the largest; same shape as scores, float.

    Ties share their average rank (scipy.stats.rankdata "average"), the ranking Spearman's rho uses,
    so the ranks drawn beside the rho are the ones it correlates.
    """
    flat = effect(scores, direction).ravel()
    return rankdata(-flat, method="average").reshape(np.shape(scores))


def top_heads(report: Any, n: int = 3) -> list[tuple[int, int]]:
    """The n heads with the largest activation-patching effect (ties in index order)."""
    act = report.activation
    flat = effect(act.scores, act.direction).ravel()
    order = np.argsort(-flat, kind="stable")[: min(n, flat.size)]
    return [tuple(int(i) for i in np.unravel_index(k, np.shape(act.scores))) for k in order]


def _title(report: Any, what: str) -> str:
    """Short enough for a half-width chart; the model and checkpoint are in the provenance."""
    act = report.activation
    return f"{what} ({act.direction}, {act.metric})"


def _prov(report: Any, figure: str) -> dict:
    return provenance(figure=figure, model=report.model, revision=report.revision, settings=report.settings.to_json(),
                      patching=report.provenance)


def _colour_range(values: np.ndarray, direction: str) -> tuple[float, float]:
    """A range symmetric around the unpatched score, so white means "no change"."""
    base = base_score(direction)
    reach = max(float(np.nanmax(np.abs(np.asarray(values) - base))), 1e-9)
    return base - reach, base + reach


def head_heatmap(report: Any) -> FigureBundle:
    """Activation-patching score per head [layer, head]; click a head (or box / lasso several) to pick it."""
    act = report.activation
    scores = np.asarray(act.scores, dtype=np.float64)  # [layer, head]
    n_layers, n_heads = scores.shape
    zmin, zmax = _colour_range(scores, act.direction)
    fig = go.Figure(go.Heatmap(z=scores.tolist(), x=list(range(n_heads)), y=list(range(n_layers)), zmin=zmin, zmax=zmax,
                               colorscale=SCORE_SCALE, hoverinfo="skip", colorbar=dict(title="score")))
    hover = np.vectorize(lambda v: f"score {v:.3f}")(scores)
    fig.add_trace(picker_trace(n_layers, n_heads, hover))
    _grid_axes(fig, n_layers, n_heads)
    fig.update_layout(template=SCREEN, height=_grid_height(n_layers), title=_title(report, "patching per head"))
    ranks = effect_ranks(scores, act.direction)
    rows = tuple({"head": head_name((l, h)), "layer": l, "head_index": h, "score": float(scores[l, h]),
                  "effect_rank": float(ranks[l, h]),
                  "attribution_score": None if report.attribution is None else float(report.attribution.scores[l, h])}
                 for l in range(n_layers) for h in range(n_heads))
    caption = (f"{SCALE_NOTE}; white = the unpatched run ({base_score(act.direction):g}). Identity check: the base run "
               f"patched with itself moves the logits by at most {act.identity_max_diff:.1e}.")
    return FigureBundle("patching-heads", fig, rows, _prov(report, "patching_head_heatmap"), caption)


def position_heatmap(report: Any) -> FigureBundle:
    """Score per head (rows) and position (columns), for a run with per_position patching."""
    act = report.activation
    per = np.asarray(act.position_scores, dtype=np.float64)  # [layer, head, pos]
    n_layers, n_heads, seq_len = per.shape
    names = [head_name((l, h)) for l in range(n_layers) for h in range(n_heads)]
    grid = per.reshape(n_layers * n_heads, seq_len)  # [layer * head, pos]
    zmin, zmax = _colour_range(grid, act.direction)
    fig = go.Figure(go.Heatmap(z=grid.tolist(), x=list(range(seq_len)), y=names, zmin=zmin, zmax=zmax,
                               colorscale=SCORE_SCALE, colorbar=dict(title="score"),
                               hovertemplate="%{y} at position %{x}: %{z:.3f}<extra></extra>"))
    fig.update_yaxes(title_text="head", autorange="reversed", type="category")
    fig.update_xaxes(title_text="position (padded batch)")
    fig.update_layout(template=SCREEN, height=max(320, 120 + 14 * len(names)),
                      title=_title(report, "patching per head and position"))
    rows = tuple({"head": names[i], "position": t, "score": float(grid[i, t])}
                 for i in range(len(names)) for t in range(seq_len))
    caption = f"{SCALE_NOTE}; " + " ".join(act.notes)
    return FigureBundle("patching-positions", fig, rows, _prov(report, "patching_position_heatmap"), caption)


def attribution_scatter(report: Any) -> FigureBundle:
    """Attribution patching's rank (y) against activation patching's (x) per head; rank 1 = largest effect."""
    act, attr = report.activation, report.attribution
    n_layers, n_heads = act.scores.shape
    x, y = effect_ranks(act.scores, act.direction), effect_ranks(attr.scores, act.direction)
    fig = go.Figure()
    total = n_layers * n_heads
    fig.add_trace(go.Scatter(x=[1, total], y=[1, total], mode="lines", line=dict(color="#bbb", dash="dot"),
                             hoverinfo="skip", showlegend=False))
    for layer in range(n_layers):
        names = [head_name((layer, h)) for h in range(n_heads)]
        fig.add_trace(go.Scatter(
            x=x[layer].tolist(), y=y[layer].tolist(), mode="markers", name=f"layer {layer}", customdata=names,
            text=[f"{n}: activation {act.scores[layer, h]:.3f}, attribution {attr.scores[layer, h]:.3f}"
                  for h, n in enumerate(names)],
            hovertemplate="%{text}<extra></extra>",
            marker=dict(color=LAYER_COLORS[layer % len(LAYER_COLORS)], size=9)))
    rho = "undefined" if report.spearman is None else f"{report.spearman:.2f}"
    fig.update_xaxes(title_text="activation patching rank (1 = largest effect)", range=[total + 0.5, 0.5])
    fig.update_yaxes(title_text="attribution patching rank", range=[total + 0.5, 0.5])
    fig.update_layout(template=SCREEN, height=440, title=f"attribution vs activation patching: Spearman ρ = {rho}")
    _legend_on_top(fig)
    rows = tuple({"head": head_name((l, h)), "activation_score": float(act.scores[l, h]),
                  "attribution_score": float(attr.scores[l, h]), "activation_rank": float(x[l, h]),
                  "attribution_rank": float(y[l, h])} for l in range(n_layers) for h in range(n_heads))
    caption = ("attribution patching: grad · (source z − base z) per head, one forward and backward per chunk; "
               "points on the dotted diagonal rank alike. Click or lasso heads to pick them.")
    return FigureBundle("patching-attribution-ranks", fig, rows, _prov(report, "patching_attribution_scatter"), caption)


def controls_strip(report: Any, which: str) -> FigureBundle:
    """The patched group ("group") or path ("path") against its random controls, on the normalized scale."""
    result = report.group if which == "group" else report.path
    name = str(result.selection) if which == "group" else f"{result.senders} → {result.receivers} ({','.join(result.components)})"
    controls = np.asarray(result.control_scores, dtype=np.float64)
    jitter = np.random.RandomState(0).uniform(-0.18, 0.18, size=controls.size)  # fixed: the same picture every time
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=jitter.tolist(), y=controls.tolist(), mode="markers", name="random controls",
                             marker=dict(color=CONTROL_COLOR, size=7, opacity=0.8),
                             hovertemplate="control: %{y:.3f}<extra></extra>"))
    fig.add_trace(go.Scatter(x=[1.0], y=[result.score], mode="markers", name=which,
                             marker=dict(color=CANDIDATE_COLOR, size=14, symbol="diamond"),
                             hovertemplate=f"{which}: %{{y:.3f}}<extra></extra>"))
    ticks, labels = [0.0, 1.0], ["controls", which]
    rows = [{"condition": f"control {i}", "score": float(s)} for i, s in enumerate(controls)]
    rows.append({"condition": which, "heads": name, "score": float(result.score), **result.stats})
    if which == "group":
        fig.add_trace(go.Scatter(x=[2.0], y=[result.upper_bound_score], mode="markers", name="every head of its layers",
                                 marker=dict(color=UPPER_BOUND_COLOR, size=11, symbol="triangle-up"),
                                 hovertemplate="upper bound: %{y:.3f}<extra></extra>"))
        ticks, labels = ticks + [2.0], labels + ["upper"]
        rows.append({"condition": "upper bound", "score": float(result.upper_bound_score)})
    for level, label in ((0.0, "corrupted"), (1.0, "clean")):
        fig.add_hline(y=level, line_color="#999", line_width=1, line_dash="dot", annotation_text=label)
    fig.update_xaxes(tickmode="array", tickvals=ticks, ticktext=labels, range=[-0.5, ticks[-1] + 0.5], showgrid=False)
    fig.update_yaxes(title_text="score (clean 1, corrupted 0)")
    s = result.stats
    fig.update_layout(template=SCREEN, height=400,
                      title=f"{name} vs {controls.size} {result.control_sets.kind} controls: "
                            + rank_z_title(s["rank"], s["p"], controls.size, s["z"]))
    _legend_on_top(fig)
    caption = ("rank 1 = the most effect; p = rank / (controls + 1); z uses the controls' population sd (ddof=0), "
               "greyed below 10 controls. controls: random head sets patched the same way (same layers and sizes when matched); "
               + ("path controls are random sender sets into the same receivers." if which == "path" else
                  "upper: every head of the group's layers patched together."))
    return FigureBundle(f"patching-{which}-controls", fig, tuple(rows), _prov(report, f"patching_{which}_controls"), caption)


def patching_bundles(report: Any) -> list[FigureBundle]:
    """Every figure a patching report has data for (for exports)."""
    bundles = [head_heatmap(report)]
    if report.activation.position_scores is not None:
        bundles.append(position_heatmap(report))
    if report.attribution is not None:
        bundles.append(attribution_scatter(report))
    bundles += [controls_strip(report, which) for which in ("group", "path") if getattr(report, which) is not None]
    return bundles
