"""Step 1 figures, the spectral signal: PR trajectories per head, the PR-integral ranking and grid.

Inputs are core.stats.spectral.SpectralResult (pr [checkpoint, layer, head], tokens [checkpoint],
integral [layer, head]); tokens <= 0 have no place on a log axis and are left out.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np
import plotly.graph_objects as go

from core.figures._style import _grid_axes, _grid_height, _legend_on_top, picker_trace
from core.figures.bundle import FigureBundle
from core.figures.theme import CANDIDATE_COLOR, CONTROL_COLOR, FADED, LAYER_COLORS, PAPER_WIDTH, SCREEN
from core.heads import Head, head_name
from core.results import provenance


def _pr_label(definition: str) -> str:
    return {"entropy": "PR (entropy effective rank, uncentered)",
            "classic": "PR (classic participation ratio, centered)"}.get(definition, f"PR ({definition})")


def pr_trajectories(spectral: Any, model: str, probe_spec: dict, highlight: Iterable[Head] = (),
                    current_tokens: float | None = None) -> FigureBundle:
    """PR of every head over log training tokens: one line per head, coloured by layer.

    spectral: core.stats.spectral.SpectralResult (pr [checkpoint, layer, head], tokens [checkpoint]).
    Checkpoints with tokens <= 0 have no place on a log axis and are left out (named in the caption).
    """
    pr = np.asarray(spectral.pr, dtype=np.float64)  # [checkpoint, layer, head]
    tokens = np.asarray(spectral.tokens, dtype=np.float64)
    keep = tokens > 0
    _, n_layers, n_heads = pr.shape
    highlight = set(highlight)
    revisions = list(spectral.revisions) or [str(i) for i in range(len(tokens))]
    fig = go.Figure()
    rows = []
    for layer in range(n_layers):
        for head in range(n_heads):
            name = head_name((layer, head))
            bright = not highlight or (layer, head) in highlight
            # legend: each highlighted head by name, the other heads once per layer
            others = [h for h in range(n_heads) if (layer, h) not in highlight]
            if (layer, head) in highlight:
                label, shown = name, True
            else:
                label, shown = f"layer {layer}", head == others[0]
            fig.add_trace(go.Scatter(
                x=tokens[keep].tolist(), y=pr[keep, layer, head].tolist(), mode="lines", name=label,
                legendgroup=name if (layer, head) in highlight else f"layer {layer}", showlegend=bool(shown),
                line=dict(color=LAYER_COLORS[layer % len(LAYER_COLORS)], width=2.6 if (layer, head) in highlight else 1.2),
                opacity=1.0 if bright else 0.25, customdata=[name] * int(keep.sum()),
                hovertemplate=f"{name}<br>%{{x:.3s}} tokens<br>PR %{{y:.3f}}<extra></extra>",
            ))
            for c in range(len(tokens)):
                rows.append({"revision": revisions[c], "tokens": float(tokens[c]), "layer": layer, "head": head,
                             "head_name": name, "pr": float(pr[c, layer, head])})
    if current_tokens is not None and current_tokens > 0:
        fig.add_vline(x=float(current_tokens), line_dash="dot", line_color="#444", line_width=1)
    fig.update_layout(template=SCREEN, title=f"PR trajectories per head ({spectral.definition})",
                      xaxis_title="training tokens (log)", yaxis_title=_pr_label(spectral.definition),
                      height=460, hovermode="closest")
    fig.update_xaxes(type="log")
    dropped = [revisions[i] for i in np.flatnonzero(~keep)]
    caption = (f"PR definition: {_pr_label(spectral.definition)}; one line per head, coloured by layer"
               + (f"; highlighted: {', '.join(head_name(h) for h in sorted(highlight))}" if highlight else "")
               + (f"; not on the log axis (0 tokens): {', '.join(dropped)}" if dropped else "") + ".")
    prov = provenance(figure="pr_trajectories", model=model, probe_spec=probe_spec, pr_definition=spectral.definition,
                      revisions=revisions, tokens=tokens.tolist())
    return FigureBundle("spectral-pr-trajectories", fig, tuple(rows), prov, caption, (PAPER_WIDTH, 380))


def pr_integral_ranking(spectral: Any, model: str, probe_spec: dict, k: int | None = None) -> FigureBundle:
    """Every head's PR-integral, best first, the top K coloured by layer and the rest grey."""
    integral = np.asarray(spectral.integral, dtype=np.float64)  # [layer, head]
    k = int(spectral.k if k is None else k)
    ranking = list(spectral.ranking)
    names = [head_name(h) for h in ranking]
    values = [float(integral[h]) for h in ranking]
    colors = [LAYER_COLORS[h[0] % len(LAYER_COLORS)] if i < k else FADED for i, h in enumerate(ranking)]
    fig = go.Figure(go.Bar(x=names, y=values, marker_color=colors, customdata=names,
                           hovertemplate="%{x}: %{y:.3f}<extra></extra>", name="PR-integral"))
    if 0 < k < len(ranking):
        fig.add_vline(x=k - 0.5, line_dash="dash", line_color="#444", line_width=1,
                      annotation_text=f"top-K = {k}", annotation_position="top right")
    fig.update_layout(template=SCREEN, title=f"PR-integral ranking ({spectral.definition}, {spectral.rule})",
                      yaxis_title="∫ max(PR − 1, 0) d ln tokens", height=380,
                      showlegend=False, bargap=0.15)
    fig.update_xaxes(tickangle=-60, showgrid=False)
    rows = tuple({"rank": i + 1, "head_name": n, "layer": h[0], "head": h[1], "pr_integral": v, "top_k": i < k}
                 for i, (n, h, v) in enumerate(zip(names, ranking, values)))
    caption = (f"PR definition: {_pr_label(spectral.definition)}; integral rule: {spectral.rule} on ln(tokens); "
               f"top-K = {k} of {len(ranking)} heads in colour.")
    prov = provenance(figure="pr_integral_ranking", model=model, probe_spec=probe_spec,
                      pr_definition=spectral.definition, rule=spectral.rule, k=k,
                      revisions=list(spectral.revisions), dropped_checkpoints=list(spectral.dropped))
    return FigureBundle("spectral-pr-integral", fig, rows, prov, caption)


def pr_integral_grid(spectral: Any, model: str, probe_spec: dict) -> FigureBundle:
    """The PR-integral as a [layer, head] grid (clickable), top-K heads outlined."""
    integral = np.asarray(spectral.integral, dtype=np.float64)
    n_layers, n_heads = integral.shape
    fig = go.Figure(go.Heatmap(z=integral.tolist(), x=list(range(n_heads)), y=list(range(n_layers)),
                               colorscale="Blues", colorbar=dict(title="PR-integral"), hoverinfo="skip"))
    top = list(spectral.top_heads)
    if top:
        fig.add_trace(go.Scatter(x=[h for _, h in top], y=[l for l, _ in top], mode="markers", name=f"top-K ({len(top)})",
                                 marker=dict(symbol="square-open", size=12, color=CANDIDATE_COLOR,
                                             line=dict(width=2.5)), hoverinfo="skip"))
    fig.add_trace(picker_trace(n_layers, n_heads, np.round(integral, 3)))
    fig.update_layout(template=SCREEN, title="PR-integral per head (□ top-K; click to inspect)",
                      height=_grid_height(n_layers), showlegend=False)
    _grid_axes(fig, n_layers, n_heads)
    rows = tuple({"layer": l, "head": h, "head_name": head_name((l, h)), "pr_integral": float(integral[l, h]),
                  "top_k": (l, h) in top} for l in range(n_layers) for h in range(n_heads))
    prov = provenance(figure="pr_integral_grid", model=model, probe_spec=probe_spec,
                      pr_definition=spectral.definition, rule=spectral.rule, k=spectral.k)
    return FigureBundle("spectral-pr-integral-grid", fig, rows, prov,
                        f"PR definition: {_pr_label(spectral.definition)}; outlined: top-K = {spectral.k}.")


def head_pr(spectral: Any, head: Head, model: str, probe_spec: dict, current_tokens: float | None = None) -> FigureBundle:
    """One head's PR trajectory, against the median and range of every head."""
    pr = np.asarray(spectral.pr, dtype=np.float64)  # [checkpoint, layer, head]
    tokens = np.asarray(spectral.tokens, dtype=np.float64)
    keep = tokens > 0
    flat = pr[keep].reshape(int(keep.sum()), -1)
    x = tokens[keep].tolist()
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x + x[::-1], y=flat.max(axis=1).tolist() + flat.min(axis=1)[::-1].tolist(),
                             fill="toself", fillcolor="rgba(150,150,150,0.2)", line=dict(width=0), name="all heads (range)",
                             hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=x, y=np.median(flat, axis=1).tolist(), mode="lines", name="median head",
                             line=dict(color=CONTROL_COLOR, dash="dash")))
    fig.add_trace(go.Scatter(x=x, y=pr[keep, head[0], head[1]].tolist(), mode="lines+markers", name=head_name(head),
                             line=dict(color=LAYER_COLORS[head[0] % len(LAYER_COLORS)], width=3)))
    if current_tokens and current_tokens > 0:
        fig.add_vline(x=float(current_tokens), line_dash="dot", line_color="#444", line_width=1)
    fig.update_layout(template=SCREEN, height=320, title=f"{head_name(head)} PR trajectory ({spectral.definition})",
                      xaxis_title="training tokens (log)", yaxis_title=_pr_label(spectral.definition))
    _legend_on_top(fig)
    fig.update_xaxes(type="log")
    revisions = list(spectral.revisions) or [str(i) for i in range(len(tokens))]
    rows = tuple({"revision": revisions[c], "tokens": float(tokens[c]), "head_name": head_name(head),
                  "pr": float(pr[c, head[0], head[1]]), "median_pr": float(np.median(pr[c]))} for c in range(len(tokens)))
    prov = provenance(figure="head_pr", model=model, probe_spec=probe_spec, head=head_name(head),
                      pr_definition=spectral.definition)
    return FigureBundle(f"inspector-{head_name(head)}-pr", fig, rows, prov,
                        f"PR definition: {_pr_label(spectral.definition)}.")


def spectral_bundles(report: Any, highlight: Iterable[Head] = ()) -> list[FigureBundle]:
    """Step 1 figures of a core.pipelines.recipe.ScreenReport."""
    highlight = tuple(highlight) or tuple(report.spectral.top_heads)
    return [pr_trajectories(report.spectral, report.model, report.probe_spec, highlight),
            pr_integral_ranking(report.spectral, report.model, report.probe_spec)]
