"""The ablation lab's figures: the pickable head grid, the candidate-vs-controls strip per metric and
each probe example's damage.

Inputs are core.ablation AblationResults: per-condition metrics [example] and, per metric, the
candidate delta, control deltas, z and p. Damage is a delta signed so that positive is worse.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from core.ablation.study import example_damage, worst_examples
from core.figures._style import (GRID_CELL_PX, _grid_axes, _legend_on_top, _log10, _log_ticks, _metric_label,
                                 rank_z_title)
from core.figures.bundle import FigureBundle
from core.figures.theme import CANDIDATE_COLOR, CONTROL_COLOR, PAPER_WIDTH, SCREEN, SELECTIVITY_SCALE, UPPER_BOUND_COLOR
from core.heads import Head, head_name
from core.results import provenance


MIN_VERTICAL_COLORBAR_PX = 240  # a grid shorter than this draws its colour bar below it
COLORBAR_PX = 320  # that bar's length: room for its five tick labels


def head_grid(values: np.ndarray, selected: Iterable[Head], model: str, revision: str, title: str,
              value_label: str = "induction selectivity", log: bool = True,
              classes: np.ndarray | None = None) -> FigureBundle:
    """The pickable [layer, head] grid: a scatter of square markers (plotly heatmaps emit no selection events).

    Colour = the value (log10 when `log`), selected heads drawn with a thick black outline.
    customdata = "L{l}H{h}" so a click, box or lasso names the heads.
    """
    values = np.asarray(values, dtype=np.float64)  # [layer, head]
    n_layers, n_heads = values.shape
    selected = set(selected)
    layers, heads = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")
    flat_l, flat_h = layers.ravel(), heads.ravel()
    names = [head_name((int(l), int(h))) for l, h in zip(flat_l, flat_h)]
    color = _log10(values).ravel() if log else values.ravel()
    lo, hi = float(color.min()), float(color.max())
    if log:
        lo, hi = -1.0, 3.0  # 0.1x .. 1000x; only the membership threshold is labelled (the grid is small)
        tickvals, ticktext = _log_ticks(lo, hi, (50,))
        colorbar = dict(title=dict(text=value_label.replace(" ", "<br>", 1)), tickvals=tickvals, ticktext=ticktext)
    else:
        colorbar = dict(title=dict(text=value_label))
    is_sel = np.array([(int(l), int(h)) in selected for l, h in zip(flat_l, flat_h)])
    cell = int(min(GRID_CELL_PX, max(14, 960 // max(n_heads, 1))))  # px per head, so the squares tile the plot
    plot_height = cell * n_layers
    if plot_height < MIN_VERTICAL_COLORBAR_PX:  # a few layers: a vertical bar this short crowds its ticks; lay it below
        colorbar.update(orientation="h", x=0, xanchor="left", y=-70 / plot_height, yanchor="top", thickness=14,
                        lenmode="pixels", len=COLORBAR_PX, title=dict(text=value_label, side="top"))
        margin = dict(l=60, r=max(40, COLORBAR_PX + 20 - cell * n_heads), t=50, b=140)
    else:
        margin = dict(l=60, r=150, t=50, b=55)  # r: room for the colour bar
    cls = [""] * len(names) if classes is None else [str(c) for c in np.asarray(classes, dtype=object).ravel()]
    hover = [f"{n}<br>{value_label}: {v:.3g}{'x' if log else ''}" + (f"<br>{c}" if c else "")
             for n, v, c in zip(names, values.ravel(), cls)]
    fig = go.Figure(go.Scatter(
        x=flat_h.tolist(), y=flat_l.tolist(), mode="markers", name="heads", customdata=names, text=hover,
        hovertemplate="%{text}<extra></extra>",
        marker=dict(symbol="square", size=cell - 3, color=color.tolist(), colorscale=SELECTIVITY_SCALE,
                    cmin=lo, cmax=hi, colorbar=colorbar,
                    line=dict(width=np.where(is_sel, 4, 0.5).tolist(),
                              color=np.where(is_sel, "black", "#bbbbbb").tolist())),
        unselected=dict(marker=dict(opacity=0.55)),
    ))
    if is_sel.any():  # a visible mark that survives the theme and print; not "x", which the screen uses for the null floor
        fig.add_trace(go.Scatter(x=flat_h[is_sel].tolist(), y=flat_l[is_sel].tolist(), mode="markers",
                                 name=f"selected ({int(is_sel.sum())})", hoverinfo="skip",
                                 marker=dict(symbol="circle", size=max(6, cell // 3), color="white",
                                             line=dict(width=2, color="black"))))
    width = margin["l"] + margin["r"] + cell * n_heads
    height = margin["t"] + margin["b"] + plot_height
    fig.update_layout(template=SCREEN, title=dict(text=title, font=dict(size=13)), height=height, width=width,
                      showlegend=False, margin=margin)
    _grid_axes(fig, n_layers, n_heads)
    rows = tuple({"layer": int(l), "head": int(h), "head_name": n, "value": float(v), "selected": bool(s)}
                 for l, h, n, v, s in zip(flat_l, flat_h, names, values.ravel(), is_sel))
    prov = provenance(figure="head_grid", model=model, revision=revision, value=value_label,
                      selected=[head_name(h) for h in sorted(selected)])
    return FigureBundle("ablation-head-grid", fig, rows, prov,
                        "click a head to add it, click it again to remove it; Box / Lasso Select in the chart's "
                        "toolbar adds every head you drag over; selected heads are outlined in black with a white dot.",
                        (PAPER_WIDTH, max(220, 60 * n_layers + 100)))


def ablation_strip(result: Any, model: str, revision: str, metrics: Sequence[str] | None = None) -> FigureBundle:
    """Per metric: the control deltas as a strip, the candidate delta and the upper bound, with the z-score.

    result: core.ablation.study.AblationResult (stats[metric] holds candidate_delta, control_deltas, z, ...).
    """
    metrics = [m for m in (metrics or result.stats.keys()) if m in result.stats]
    titles = []
    for m in metrics:
        entry = result.stats[m]
        ranked = entry.get("rank") is not None  # no rank: a running preview
        n = entry.get("n_controls", len(entry.get("control_deltas", ())))
        # three short lines (metric, rank and p, z): four panels side by side leave each title ~250 px
        titles.append(f"<b>{m}</b><br>" + rank_z_title(entry['rank'], entry['p'], n, entry.get('z')).replace(" · ", "<br>")
                      if ranked else f"<b>{m}</b>")
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=titles, horizontal_spacing=0.08)
    rng = np.random.RandomState(0)  # fixed jitter: the same picture every time
    rows = []
    # the axes and zero lines of every panel set in one layout update: plotly validates the whole layout at each
    # update_xaxes or add_hline, which made this figure take 0.17 s, and the lab draws it as a study runs
    axes: dict[str, dict] = {}
    zero_lines = []
    for i, metric in enumerate(metrics, start=1):
        entry = result.stats[metric]
        controls = np.asarray(entry["control_deltas"], dtype=np.float64)
        jitter = rng.uniform(-0.18, 0.18, size=controls.size)
        fig.add_trace(go.Scatter(x=jitter.tolist(), y=controls.tolist(), mode="markers", name="matched-random controls",
                                 legendgroup="controls", showlegend=i == 1,
                                 marker=dict(color=CONTROL_COLOR, size=7, opacity=0.8),
                                 hovertemplate="control: %{y:.4g}<extra></extra>"), row=1, col=i)
        fig.add_trace(go.Scatter(x=[1.0], y=[entry["candidate_delta"]], mode="markers", name="candidate",
                                 legendgroup="candidate", showlegend=i == 1,
                                 error_y=dict(type="data", symmetric=False,
                                              array=[entry["candidate_ci"][1] - entry["candidate_delta"]],
                                              arrayminus=[entry["candidate_delta"] - entry["candidate_ci"][0]],
                                              color=CANDIDATE_COLOR, thickness=1.5, width=4),
                                 marker=dict(color=CANDIDATE_COLOR, size=14, symbol="diamond"),
                                 hovertemplate="candidate: %{y:.4g}<extra></extra>"), row=1, col=i)
        ticks, labels = [0.0, 1.0], ["controls", "cand."]
        if entry.get("upper_bound_delta") is not None:
            fig.add_trace(go.Scatter(x=[2.0], y=[entry["upper_bound_delta"]], mode="markers", name="upper bound",
                                     legendgroup="upper", showlegend=i == 1,
                                     marker=dict(color=UPPER_BOUND_COLOR, size=11, symbol="triangle-up"),
                                     hovertemplate="upper bound: %{y:.4g}<extra></extra>"), row=1, col=i)
            ticks.append(2.0)
            labels.append("upper")
        suffix = "" if i == 1 else str(i)
        zero_lines.append(dict(type="line", xref=f"x{suffix} domain", x0=0, x1=1, yref=f"y{suffix}", y0=0, y1=0,
                               line=dict(color="#999", width=1)))
        axes[f"xaxis{suffix}"] = dict(tickmode="array", tickvals=ticks, ticktext=labels, range=[-0.5, ticks[-1] + 0.5],
                                      showgrid=False, tickangle=0)
        axes[f"yaxis{suffix}"] = dict(title_text=_metric_label(metric))
        rows += [{"metric": metric, "condition": f"control {j}", "delta": float(d), "z": entry.get("z")}
                 for j, d in enumerate(controls)]
        rows.append({"metric": metric, "condition": "candidate", "delta": float(entry["candidate_delta"]),
                     "ci_low": entry["candidate_ci"][0], "ci_high": entry["candidate_ci"][1], "z": entry.get("z"),
                     "p": entry.get("p")})
        if entry.get("upper_bound_delta") is not None:
            rows.append({"metric": metric, "condition": "upper bound", "delta": float(entry["upper_bound_delta"])})
    n_ctrl = len(result.controls)
    fig.update_annotations(font_size=12)
    fig.update_layout(axes, shapes=zero_lines, template=SCREEN, height=440,
                      title=f"ablating {result.selection} ({result.mode}) vs {n_ctrl} {result.control_sets.kind} controls")
    _legend_on_top(fig)
    fig.update_layout(margin=dict(t=150), legend=dict(y=1.25))  # room for the three-line subplot titles
    caption = ("deltas from the clean run, mean over probe examples; candidate with its 95% bootstrap interval; "
               "z = (candidate − control mean) / control std.")
    prov = provenance(figure="ablation_strip", model=model, revision=revision, selection=str(result.selection),
                      verdicts={k: v.to_json() for k, v in result.verdicts.items()}, ablation=result.provenance,
                      control_sets=result.control_sets.to_json())
    return FigureBundle("ablation-strip", fig, tuple(rows), prov, caption, (max(PAPER_WIDTH, 180 * len(metrics)), 300))


def per_example_damage(result: Any, model: str, revision: str, metric: str = "loss",
                       top: int | None = None) -> FigureBundle:
    """Each probe example's damage from the candidate ablation (largest first), with the mean control damage.

    damage = delta signed so that positive is worse (loss up; top-1, top-5, target logit down).
    """
    cand = example_damage(result.clean, result.candidate, metric)  # [example]
    if result.controls:
        ctrl = np.mean([example_damage(result.clean, c, metric) for c in result.controls], axis=0)  # [example]
    else:
        ctrl = np.zeros_like(cand)
    ex = worst_examples(cand, top or None)
    order = np.asarray(ex, dtype=int)
    fig = go.Figure()
    fig.add_trace(go.Bar(x=list(range(len(ex))), y=cand[order].tolist(), name="candidate", marker_color=CANDIDATE_COLOR,
                         customdata=ex, hovertemplate="example %{customdata}: %{y:.4g}<extra></extra>"))
    fig.add_trace(go.Scatter(x=list(range(len(ex))), y=ctrl[order].tolist(), mode="markers", name="mean of controls",
                             marker=dict(color=CONTROL_COLOR, size=5), customdata=ex,
                             hovertemplate="example %{customdata}: %{y:.4g}<extra></extra>"))
    fig.update_layout(template=SCREEN, height=340, title=f"per-example damage ({metric}), worst first",
                      xaxis_title="probe examples, ranked by damage", yaxis_title=f"damage ({_metric_label(metric)}, + = worse)",
                      bargap=0.05)
    _legend_on_top(fig)
    rows = tuple({"rank": r + 1, "example": e, "metric": metric, "candidate_damage": float(cand[e]),
                  "control_mean_damage": float(ctrl[e]), "clean": float(result.clean.values(metric)[e])}
                 for r, e in enumerate(ex))
    prov = provenance(figure="per_example_damage", model=model, revision=revision, metric=metric,
                      selection=str(result.selection), ablation=result.provenance)
    return FigureBundle(f"ablation-per-example-{metric}", fig, rows, prov,
                        "damage is signed so that positive means worse; grey: the mean over the controls.")


def ablation_bundles(result: Any, model: str, revision: str) -> list[FigureBundle]:
    """The ablation lab's result figures."""
    return [ablation_strip(result, model, revision), per_example_damage(result, model, revision, "loss")]
