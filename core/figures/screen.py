"""Step 2 figures, the pattern screen: selectivity heatmap and strip per pattern, the class map, the
class fractions over training and the animated heatmap.

Selectivity is drawn on a log scale (values below SELECTIVITY_FLOOR at the floor); inputs are
[layer, head] grids or [checkpoint, pattern, layer, head] stacks from core.stats.selectivity.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np
import plotly.graph_objects as go

from core.errors import HeadLabError
from core.figures._style import (SELECTIVITY_FLOOR, _grid_axes, _grid_height, _hline_log, _legend_on_top, _log10,
                                 _log_ticks, picker_trace, short_tokens)
from core.figures.bundle import FigureBundle
from core.figures.theme import CLASS_COLORS, CLASS_SHORT, LAYER_COLORS, SCREEN, SELECTIVITY_SCALE
from core.heads import head_name
from core.results import provenance
from core.stats.selectivity import ScreenResult, classify


@dataclass(frozen=True, eq=False)
class ScreenMarks:
    """What a selectivity heatmap marks besides its colours: the class threshold, the null floor and the
    induction-circuit members, with the baselines that the numbers were measured against.

    membership: [layer, head] induction selectivity against `membership_baseline`; a head is a member
    at >= induction_threshold. noise_floor: one pooled null floor (a per-head floor is not drawn).
    """

    class_threshold: float = 30.0
    noise_floor: float | None = None
    baseline: str = "random"
    membership: np.ndarray | None = None
    induction_threshold: float | None = None
    membership_baseline: str = "uniform"

    def __post_init__(self) -> None:
        if self.class_threshold <= 0:
            raise HeadLabError(f"the class threshold must be positive, not {self.class_threshold}.")
        if self.noise_floor is not None and self.noise_floor < 0:
            raise HeadLabError(f"the null floor must be a selectivity >= 0, not {self.noise_floor}.")
        if self.induction_threshold is not None and self.induction_threshold <= 0:
            raise HeadLabError(f"the induction threshold must be positive, not {self.induction_threshold}.")
        if self.membership is not None and np.ndim(self.membership) != 2:
            raise HeadLabError(f"membership must be a [layer, head] grid, not shape {np.shape(self.membership)}.")

    @classmethod
    def of(cls, screen: ScreenResult) -> "ScreenMarks":
        """The marks of one checkpoint's screen result."""
        floor = screen.noise_floor
        return cls(screen.threshold, None if floor is None or np.ndim(floor) else float(floor), screen.baseline,
                   screen.membership, screen.induction_threshold, screen.membership_baseline)


def selectivity_heatmap(sel: np.ndarray, pattern: str, model: str, probe_spec: dict, revision: str,
                        tokens: float | None = None, marks: ScreenMarks = ScreenMarks()) -> FigureBundle:
    """One pattern's selectivity [layer, head] on a log colour scale, thresholds and null floor marked.

    Colour = log10 selectivity; ○ = at least the class threshold (30x); ★ = an induction-circuit member
    (induction only: `marks.membership` [layer, head], the induction selectivity against the membership
    baseline, at least `marks.induction_threshold`); × = at or below the null floor (induction only).
    customdata of the heatmap holds the raw selectivity (what core returned).
    """
    class_threshold, noise_floor, baseline = marks.class_threshold, marks.noise_floor, marks.baseline
    membership, induction_threshold = marks.membership, marks.induction_threshold
    membership_baseline = marks.membership_baseline
    sel = np.asarray(sel, dtype=np.float64)  # [layer, head]
    n_layers, n_heads = sel.shape
    z = _log10(sel)
    lo, hi = -1.0, 3.0  # the colour scale spans 0.1x .. 1000x; values beyond take the end colours
    marks = [class_threshold] + ([noise_floor] if noise_floor else [])
    tickvals, ticktext = _log_ticks(lo, hi, marks)
    fig = go.Figure(go.Heatmap(
        z=z.tolist(), x=list(range(n_heads)), y=list(range(n_layers)), customdata=sel.tolist(),
        zmin=lo, zmax=hi, colorscale=SELECTIVITY_SCALE, hoverinfo="skip", name=f"{pattern} selectivity",
        colorbar=dict(title="selectivity", tickvals=tickvals, ticktext=ticktext),
    ))
    is_induction = pattern == "induction"
    member = np.zeros(sel.shape, dtype=bool)
    if is_induction and membership is not None and induction_threshold is not None:
        member = np.nan_to_num(np.asarray(membership, dtype=np.float64), nan=-np.inf) >= induction_threshold
    medium = np.argwhere((sel >= class_threshold) & ~member)
    strong = np.argwhere(member)
    if len(medium):
        fig.add_trace(go.Scatter(x=medium[:, 1].tolist(), y=medium[:, 0].tolist(), mode="markers",
                                 name=f"≥ {class_threshold:g}x (class)", hoverinfo="skip",
                                 marker=dict(symbol="circle-open", size=16, color="black", line=dict(width=2.5))))
    if len(strong):
        fig.add_trace(go.Scatter(x=strong[:, 1].tolist(), y=strong[:, 0].tolist(), mode="markers",
                                 name=f"induction member (≥ {induction_threshold:.3g}x vs {membership_baseline})",
                                 hoverinfo="skip",
                                 marker=dict(symbol="star", size=16, color="black", line=dict(width=1, color="white"))))
    below = np.zeros((0, 2), dtype=int)
    if is_induction and noise_floor:
        below = np.argwhere(sel <= noise_floor)
        if len(below):
            fig.add_trace(go.Scatter(x=below[:, 1].tolist(), y=below[:, 0].tolist(), mode="markers",
                                     name=f"≤ null floor ({noise_floor:.3g}x)", hoverinfo="skip",
                                     marker=dict(symbol="x-thin", size=8, color="#bbbbbb", line=dict(width=1.5, color="#bbbbbb"))))
    hover = np.vectorize(lambda v: f"{v:.3g}x")(sel)
    fig.add_trace(picker_trace(n_layers, n_heads, hover))
    when = f"{revision}" + (f", {short_tokens(tokens)} tokens" if tokens and tokens > 0 else "")
    fig.update_layout(template=SCREEN, title=f"{pattern} selectivity at {when}", height=_grid_height(n_layers, 380))
    _legend_on_top(fig)
    _grid_axes(fig, n_layers, n_heads)
    floor_set = {tuple(x) for x in below.tolist()}
    member_values = None if membership is None else np.asarray(membership, dtype=np.float64)
    rows = tuple({"revision": revision, "pattern": pattern, "layer": l, "head": h, "head_name": head_name((l, h)),
                  "selectivity": float(sel[l, h]), "at_least_class_threshold": bool(sel[l, h] >= class_threshold),
                  "induction_member": bool(member[l, h]) if is_induction and member_values is not None else None,
                  "membership_selectivity": float(member_values[l, h]) if is_induction and member_values is not None else None,
                  "at_or_below_null_floor": (l, h) in floor_set if is_induction and noise_floor else None}
                 for l in range(n_layers) for h in range(n_heads))
    floor_text = (f"null floor T = max(2, null p99) = {noise_floor:.3g}x (induction null)" if noise_floor
                  else "no null floor at this checkpoint")
    member_text = (f"★ induction-circuit member: induction selectivity against the {membership_baseline} baseline "
                   f"≥ {induction_threshold:.3g}x (50x at T = 256, scaled to this probe length)"
                   if is_induction and induction_threshold is not None and membership is not None else "")
    caption = (f"selectivity = mean attention to the {pattern} target / mean attention to the {baseline} baseline; "
               f"log colour; ○ ≥ {class_threshold:g}x (class); " + (member_text + "; " if member_text else "")
               + f"{floor_text}.")
    prov = provenance(figure="selectivity_heatmap", model=model, probe_spec=probe_spec, revision=revision,
                      tokens=tokens, pattern=pattern, baseline=baseline, class_threshold=class_threshold,
                      induction_threshold=induction_threshold, membership_baseline=membership_baseline,
                      noise_floor=noise_floor)
    return FigureBundle(f"screen-{pattern}-selectivity", fig, rows, prov, caption)


def selectivity_strip(sel: np.ndarray, pattern: str, model: str, probe_spec: dict, revision: str,
                      class_threshold: float = 30.0, noise_floor: float | None = None) -> FigureBundle:
    """Every head's selectivity for one pattern by layer (log y), with the class threshold and null floor as lines."""
    sel = np.asarray(sel, dtype=np.float64)
    n_layers, n_heads = sel.shape
    jitter = np.random.RandomState(0).uniform(-0.25, 0.25, size=sel.shape)  # fixed: same picture every time
    fig = go.Figure()
    for layer in range(n_layers):
        names = [head_name((layer, h)) for h in range(n_heads)]
        fig.add_trace(go.Scatter(
            x=(layer + jitter[layer]).tolist(), y=np.maximum(sel[layer], SELECTIVITY_FLOOR).tolist(), mode="markers",
            name=f"layer {layer}", marker=dict(color=LAYER_COLORS[layer % len(LAYER_COLORS)], size=8),
            customdata=names, hovertemplate="%{customdata}: %{y:.3g}x<extra></extra>"))
    lines = [(class_threshold, f"{class_threshold:g}x class", "dash")]
    if pattern == "induction" and noise_floor:
        lines.append((noise_floor, f"null floor {noise_floor:.3g}x", "dot"))
    for value, label, dash in lines:
        _hline_log(fig, value, label, dash, right=dash == "dot")
    fig.update_layout(template=SCREEN, title=f"{pattern} selectivity by layer at {revision}", height=360,
                      xaxis_title="layer", yaxis_title="selectivity (log)", showlegend=False)
    fig.update_yaxes(type="log", dtick=1)
    step = 1 if n_layers <= 16 else 2  # 30 layers' labels in a half-width column turned on their side: every other one
    fig.update_xaxes(tickmode="array", tickvals=list(range(0, n_layers, step)), tickangle=0)
    rows = tuple({"revision": revision, "pattern": pattern, "layer": l, "head": h, "selectivity": float(sel[l, h])}
                 for l in range(n_layers) for h in range(n_heads))
    prov = provenance(figure="selectivity_strip", model=model, probe_spec=probe_spec, revision=revision,
                      pattern=pattern, class_threshold=class_threshold, noise_floor=noise_floor)
    return FigureBundle(f"screen-{pattern}-strip", fig, rows, prov,
                        "lines: the class threshold and (induction) the null floor.")


def class_map(classes: np.ndarray, model: str, probe_spec: dict, revision: str,
              class_threshold: float = 30.0) -> FigureBundle:
    """Each head's class (its most selective pattern at >= threshold, else unspecialized) on the grid."""
    classes = np.asarray(classes, dtype=object)  # [layer, head]
    n_layers, n_heads = classes.shape
    names = list(CLASS_COLORS)
    codes = np.vectorize(lambda c: names.index(c) if c in names else len(names) - 1)(classes).astype(float)
    n = len(names)
    scale = []
    for i, name in enumerate(names):  # a stepped colour scale: code i -> its class colour
        scale += [[i / n, CLASS_COLORS[name]], [(i + 1) / n, CLASS_COLORS[name]]]
    text = np.vectorize(lambda c: CLASS_SHORT.get(c, c))(classes)
    fig = go.Figure(go.Heatmap(z=codes.tolist(), x=list(range(n_heads)), y=list(range(n_layers)), zmin=-0.5,
                               zmax=n - 0.5, colorscale=scale, showscale=False, text=text.tolist(),
                               texttemplate="%{text}", textfont=dict(size=10), hoverinfo="skip",
                               customdata=classes.tolist(), xgap=1, ygap=1))
    present = [c for c in names if (classes == c).any()]
    for name in present:  # legend entries
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name,
                                 marker=dict(symbol="square", size=12, color=CLASS_COLORS[name],
                                             line=dict(width=0.5, color="#888"))))
    fig.add_trace(picker_trace(n_layers, n_heads, classes))
    fig.update_layout(template=SCREEN, title=f"head classes at {revision} (best pattern ≥ {class_threshold:g}x)",
                      height=_grid_height(n_layers, 380))
    _legend_on_top(fig)
    _grid_axes(fig, n_layers, n_heads)
    rows = tuple({"revision": revision, "layer": l, "head": h, "head_name": head_name((l, h)), "class": str(classes[l, h])}
                 for l in range(n_layers) for h in range(n_heads))
    prov = provenance(figure="class_map", model=model, probe_spec=probe_spec, revision=revision,
                      class_threshold=class_threshold)
    return FigureBundle("screen-class-map", fig, rows, prov,
                        f"class = the most selective pattern when ≥ {class_threshold:g}x, else unspecialized.")


def class_fractions_over_training(sel_by_checkpoint: np.ndarray, patterns: Sequence[str], tokens: Sequence[float],
                                  revisions: Sequence[str], model: str, probe_spec: dict,
                                  class_threshold: float = 30.0, current_tokens: float | None = None) -> FigureBundle:
    """Share of heads in each class over training. sel_by_checkpoint: [checkpoint, pattern, layer, head]."""
    sel = np.asarray(sel_by_checkpoint, dtype=np.float64)
    tokens = np.asarray(tokens, dtype=np.float64)
    keep = tokens > 0
    fractions = {p: [] for p in patterns}
    for c in range(sel.shape[0]):
        classes = classify(sel[c], patterns, class_threshold)
        for p in patterns:
            fractions[p].append(float(np.mean(classes == p)))
    fig = go.Figure()
    rows = []
    for p in patterns:
        fig.add_trace(go.Scatter(x=tokens[keep].tolist(), y=np.asarray(fractions[p])[keep].tolist(), mode="lines+markers",
                                 name=p, line=dict(color=CLASS_COLORS.get(p)), marker=dict(size=4)))
        rows += [{"revision": revisions[c], "tokens": float(tokens[c]), "class": p, "fraction": fractions[p][c]}
                 for c in range(sel.shape[0])]
    if current_tokens and current_tokens > 0:
        fig.add_vline(x=float(current_tokens), line_dash="dot", line_color="#444", line_width=1)
    fig.update_layout(template=SCREEN, title=f"share of heads per class over training (≥ {class_threshold:g}x)",
                      xaxis_title="training tokens (log)", yaxis_title="fraction of heads", height=340)
    fig.update_xaxes(type="log")
    prov = provenance(figure="class_fractions", model=model, probe_spec=probe_spec, class_threshold=class_threshold,
                      revisions=list(revisions))
    return FigureBundle("screen-class-fractions", fig, tuple(rows), prov,
                        "each checkpoint's heads classified at the class threshold.")


def selectivity_animation(sel_by_checkpoint: np.ndarray, patterns: Sequence[str], pattern: str,
                          tokens: Sequence[float], revisions: Sequence[str], model: str, probe_spec: dict) -> FigureBundle:
    """The pattern's selectivity heatmap animated over checkpoints (plotly frames with a play button)."""
    sel = np.asarray(sel_by_checkpoint, dtype=np.float64)[:, list(patterns).index(pattern)]  # [checkpoint, L, H]
    z = _log10(sel)
    lo, hi = -1.0, 3.0
    tickvals, ticktext = _log_ticks(lo, hi, (30, 50))
    n_layers, n_heads = sel.shape[1:]
    labels = [f"{r} ({t:.3g} tok)" for r, t in zip(revisions, tokens)]

    def heat(c: int) -> go.Heatmap:
        return go.Heatmap(z=z[c].tolist(), customdata=sel[c].tolist(), x=list(range(n_heads)), y=list(range(n_layers)),
                          zmin=lo, zmax=hi, colorscale=SELECTIVITY_SCALE,
                          colorbar=dict(title="selectivity", tickvals=tickvals, ticktext=ticktext),
                          hovertemplate="L%{y}H%{x}: %{customdata:.3g}x<extra></extra>")

    last = len(revisions) - 1
    fig = go.Figure(data=[heat(last)], frames=[go.Frame(data=[heat(c)], name=labels[c]) for c in range(len(revisions))])
    steps = [dict(method="animate", label=r, args=[[labels[c]], dict(mode="immediate", frame=dict(duration=0, redraw=True))])
             for c, r in enumerate(revisions)]
    fig.update_layout(
        template=SCREEN, title=f"{pattern} selectivity over training", height=_grid_height(n_layers) + 120,
        sliders=[dict(active=last, steps=steps, currentvalue=dict(prefix="checkpoint: "), pad=dict(t=40))],
        updatemenus=[dict(type="buttons", showactive=False, x=0, y=-0.35, xanchor="left", buttons=[
            dict(label="▶ play", method="animate",
                 args=[None, dict(frame=dict(duration=350, redraw=True), fromcurrent=False, transition=dict(duration=0))]),
            dict(label="❚❚", method="animate", args=[[None], dict(mode="immediate", frame=dict(duration=0))])])],
    )
    _grid_axes(fig, n_layers, n_heads)
    rows = tuple({"revision": revisions[c], "tokens": float(tokens[c]), "pattern": pattern, "layer": l, "head": h,
                  "selectivity": float(sel[c, l, h])}
                 for c in range(len(revisions)) for l in range(n_layers) for h in range(n_heads))
    prov = provenance(figure="selectivity_animation", model=model, probe_spec=probe_spec, pattern=pattern,
                      revisions=list(revisions))
    return FigureBundle(f"screen-{pattern}-animation", fig, rows, prov,
                        "press play to watch the screen form over training (exports show the final checkpoint).")


def screen_bundles(report: Any, checkpoint_index: int = -1, patterns: Sequence[str] | None = None,
                   here: Any = None) -> list[FigureBundle]:
    """Step 2 figures of a ScreenReport at one checkpoint: a heatmap and strip per pattern, the class map, fractions.

    here: that checkpoint's ScreenResult (membership and null floor); the report's final one by default
    when the checkpoint is the final one.
    """
    final = report.final
    names = tuple(final.patterns)
    index = checkpoint_index % len(report.checkpoints)
    ckpt = report.checkpoints[index]
    sel = report.selectivity_by_checkpoint[index]  # [pattern, layer, head]
    if here is None and index == len(report.checkpoints) - 1:
        here = final
    # the class threshold and baseline are the report's; floor and membership are this checkpoint's
    marks = ScreenMarks(final.threshold, None, final.baseline, None, final.induction_threshold,
                        final.membership_baseline)
    if here is not None:
        marks = replace(ScreenMarks.of(here), class_threshold=final.threshold, baseline=final.baseline)
    out = []
    for pattern in patterns or names:
        p = names.index(pattern)
        out.append(selectivity_heatmap(sel[p], pattern, report.model, report.probe_spec, ckpt.revision, ckpt.tokens,
                                       marks))
        out.append(selectivity_strip(sel[p], pattern, report.model, report.probe_spec, ckpt.revision,
                                     final.threshold, marks.noise_floor))
    out.append(class_map(classify(sel, names, final.threshold), report.model, report.probe_spec, ckpt.revision,
                         final.threshold))
    out.append(class_fractions_over_training(report.selectivity_by_checkpoint, names, [c.tokens for c in report.checkpoints],
                                             [c.revision for c in report.checkpoints], report.model, report.probe_spec,
                                             final.threshold, ckpt.tokens))
    return out
