"""Figures of the gradient-vs-causal analysis [HHG], shared by the app page and exports.

Builders take core.pipelines.attribution results and return `core.figures.bundle.FigureBundle`s (figure in
the screen theme, data rows, provenance), like the other core/figures modules:

- `rank_scatter`: one model's gradient rank against its causal rank, the aligned band around the
  diagonal, heroes and bloats labelled, coloured by layer (heads are click targets: customdata);
- `rho_strip`: Spearman rho of every seed, per task or settings group, with mean +- std;
- `hero_bloat_heatmap`: over seeds, how often each component is a hero / a bloat, on a
  layer x (heads + MLP) grid;
- `joint_ablation_bars`: each bloat / hero ablated alone, the sum of those damages, and all of them
  ablated together, with both superadditivity ratios.

Ranks are ascending (rank 1 = smallest G or C) and d = rank_G - rank_C, as in core.pipelines.attribution:
bloats (large gradient, small effect) lie above the band, heroes below it.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from core.errors import HeadLabError
from core.figures._style import _legend_on_top
from core.figures.bundle import FigureBundle
from core.figures.theme import CANDIDATE_COLOR, CONTROL_COLOR, LAYER_COLORS, PAPER_HEIGHT, PAPER_WIDTH, SCREEN
from core.pipelines.attribution_results import AttributionResult, AttributionSummary, parse_component, summarize
from core.results import provenance

# Published mean rho over 10 seeds [HHG] (METHODS.md, "Reported figures to compare against").
PAPER_RHO = {"reverse": 0.72, "sort": 0.27}
BAND_COLOR = "rgba(127,127,127,0.15)"
CLASS_LABEL = {"hero": "hidden hero", "bloat": "gradient bloat", "aligned": "aligned"}


def _layer_color(layer: int) -> str:
    return LAYER_COLORS[int(layer) % len(LAYER_COLORS)]


def _rule_parts(threshold: float, rule: str) -> tuple[str, str]:
    """(hero condition, bloat condition) on d under the threshold rule: "d ≤ −6", "d ≥ 6" (paper)."""
    t = f"{threshold:g}"
    return (f"d ≤ −{t}", f"d ≥ {t}") if rule == "paper" else (f"d < −{t}", f"d > {t}")


def _rule_text(threshold: float, rule: str) -> str:
    """How the threshold rule classifies d, in words."""
    hero, bloat = _rule_parts(threshold, rule)
    return f"bloat: {bloat}, hero: {hero} ({rule} rule)"


def _settings_text(settings: Any) -> str:
    return (f"gradient {settings.gradient_variant} ({settings.n_batches} OOD batches of {settings.batch_size}), "
            f"{settings.ablation_mode} ablation, {settings.n_examples} evaluation examples")


def band_polygon(n: int, threshold: float) -> tuple[list[float], list[float]]:
    """Vertices (x, y) of the aligned band |y − x| < threshold inside the square [0.5, n + 0.5]²."""
    lo, hi, t = 0.5, n + 0.5, float(threshold)
    if t >= hi - lo:  # the band covers the whole square
        return [lo, lo, hi, hi, lo], [lo, hi, hi, lo, lo]
    xs = [lo, lo, hi - t, hi, hi, lo + t, lo]
    ys = [lo, lo + t, hi, hi, hi - t, lo, lo]
    return xs, ys


# ---------------------------------------------------------------------------------------------
# one model


def rank_scatter(result: AttributionResult) -> FigureBundle:
    """Gradient rank (y) against causal rank (x) for every component, the aligned band, heroes and bloats named.

    One trace per layer (its colour); heads are circles, MLPs diamonds. customdata per point is
    [pick name, component, G, C, d, class]: the pick name is the head ("L1H3"), empty for an MLP,
    so a click or lasso names heads only (the ablation lab ablates heads).
    """
    comps = list(result.components)
    n = len(comps)
    rank_g, rank_c, d = (np.asarray(v, dtype=np.float64) for v in (result.rank_G, result.rank_C, result.d))  # [component]
    layers = [parse_component(c)[0] for c in comps]
    is_mlp = [parse_component(c)[1] is None for c in comps]
    t, rule = result.settings.threshold, result.settings.rule
    fig = go.Figure()
    band_x, band_y = band_polygon(n, t)
    fig.add_trace(go.Scatter(x=band_x, y=band_y, fill="toself", fillcolor=BAND_COLOR, mode="lines",
                             line=dict(width=0), name=f"aligned band (|d| < {t:g})", hoverinfo="skip"))
    edge = [0.5, n + 0.5]
    fig.add_trace(go.Scatter(x=edge, y=edge, mode="lines", line=dict(color="#444", width=1, dash="dash"),
                             name="rank_G = rank_C", hoverinfo="skip", showlegend=False))
    for layer in sorted(set(layers)):
        idx = [i for i, l in enumerate(layers) if l == layer]
        labels = [comps[i] if result.classes[i] != "aligned" else "" for i in idx]
        fig.add_trace(go.Scatter(
            x=rank_c[idx].tolist(), y=rank_g[idx].tolist(), mode="markers+text", name=f"layer {layer}",
            text=labels, textposition="top center", textfont=dict(size=10, color=_layer_color(layer)),
            marker=dict(color=_layer_color(layer), size=11, symbol=["diamond" if is_mlp[i] else "circle" for i in idx],
                        line=dict(width=[2 if result.classes[i] != "aligned" else 0.5 for i in idx], color="black")),
            customdata=[["" if is_mlp[i] else comps[i], comps[i], result.G[i], result.C[i], d[i],
                         CLASS_LABEL[result.classes[i]]] for i in idx],
            hovertemplate=("%{customdata[1]}: %{customdata[5]}<br>G %{customdata[2]:.3g} (rank %{y:g})"
                           "<br>C %{customdata[3]:.3f} (rank %{x:g})<br>d = %{customdata[4]:+g}<extra></extra>"),
        ))
    rho = "undefined" if result.rho is None else f"{result.rho:.2f}"
    ticks = list(range(1, n + 1, max(1, n // 10)))
    fig.update_layout(template=SCREEN, height=520,
                      title=f"{result.model}: G rank vs C rank, ρ = {rho}",
                      xaxis_title="causal rank (C: drop in OOD exact match; 1 = smallest)",
                      yaxis_title="gradient rank (G; 1 = smallest)", hovermode="closest")
    fig.update_xaxes(range=edge, tickmode="array", tickvals=ticks, constrain="domain")
    fig.update_yaxes(range=edge, tickmode="array", tickvals=ticks, scaleanchor="x", scaleratio=1, constrain="domain")
    _legend_on_top(fig)
    rows = tuple({"component": c, "layer": layers[i], "head": parse_component(c)[1], "kind": "mlp" if is_mlp[i] else "head",
                  "G": float(result.G[i]), "C": float(result.C[i]), "rank_G": float(rank_g[i]), "rank_C": float(rank_c[i]),
                  "d": float(d[i]), "class": result.classes[i]} for i, c in enumerate(comps))
    caption = (f"above the band: gradient bloats (large gradient, small effect); below: hidden heroes. "
               f"band: aligned components, |d| < {t:g} with d = rank_G − rank_C ({_rule_text(t, rule)}); "
               f"labelled: heroes and bloats; colour: layer; ◆ MLP. OOD length {result.ood_length} "
               f"(clean exact match {result.clean_accuracy:.2f}); {_settings_text(result.settings)}.")
    prov = provenance(figure="rank_scatter", model=result.model, revision=result.revision, task=result.task,
                      settings=result.settings.to_json(), ood_length=result.ood_length, rho=result.rho,
                      rho_p=result.rho_p, notes=list(result.notes), analysis=result.provenance)
    return FigureBundle(f"attribution-{result.model}-rank-scatter", fig, rows, prov, caption, (420, 440))


def joint_ablation_bars(result: AttributionResult) -> FigureBundle:
    """Per kind (bloats, heroes): each member ablated alone, the sum of those damages, and all ablated jointly.

    Damage = clean OOD exact match minus the ablated one. The dotted line is the clean accuracy
    (the most any ablation can remove). Panel titles carry both superadditivity ratios, or why undefined.
    """
    joints = (result.joint_bloats, result.joint_heroes)
    titles = []
    for joint in joints:
        if joint.ratio_to_mean is not None:
            titles.append(f"{joint.kind}: joint / mean single = {joint.ratio_to_mean:.1f}×, "
                          f"joint / sum = {joint.ratio_to_sum:.2f}")
        else:
            titles.append(f"{joint.kind}: ratios {joint.reason.rstrip('.')}")
    fig = make_subplots(rows=1, cols=2, subplot_titles=[_wrap(t) for t in titles], horizontal_spacing=0.1)
    rows: list[dict] = []
    for col, joint in enumerate(joints, start=1):
        if not joint.components:
            fig.add_annotation(x=0.5, y=0.5, xref=f"x{'' if col == 1 else col} domain", yref=f"y{'' if col == 1 else col} domain",
                               text=f"no {joint.kind}", showarrow=False, font=dict(size=13, color="#777"))
            fig.update_xaxes(showticklabels=False, row=1, col=col)
            fig.update_yaxes(showticklabels=False, row=1, col=col)
            continue
        members = list(joint.components)
        singles = [float(v) for v in joint.single_damages]
        layers = [parse_component(c)[0] for c in members]
        fig.add_trace(go.Bar(x=members, y=singles, marker_color=[_layer_color(l) for l in layers], name="alone",
                             showlegend=False, hovertemplate="%{x} alone: %{y:.3f}<extra></extra>"), row=1, col=col)
        summed = float(np.sum(singles))
        fig.add_trace(go.Bar(x=["sum of singles"], y=[summed], marker_color=CONTROL_COLOR, showlegend=False,
                             name="sum of singles", hovertemplate="sum of singles: %{y:.3f}<extra></extra>"), row=1, col=col)
        fig.add_trace(go.Bar(x=["joint"], y=[joint.joint_damage], marker_color=CANDIDATE_COLOR, showlegend=False,
                             name="joint", hovertemplate="all together: %{y:.3f}<extra></extra>"), row=1, col=col)
        fig.add_hline(y=result.clean_accuracy, line_dash="dot", line_color="#444", line_width=1, row=1, col=col,
                      annotation_text=f"clean {result.clean_accuracy:.2f}", annotation_position="top left",
                      annotation_font_size=10)
        fig.update_yaxes(title_text="drop in OOD exact match" if col == 1 else None, row=1, col=col)
        rows += [{"kind": joint.kind, "bar": "alone", "component": c, "layer": l, "damage": v}
                 for c, l, v in zip(members, layers, singles)]
        rows.append({"kind": joint.kind, "bar": "sum of singles", "component": ",".join(members), "damage": summed})
        rows.append({"kind": joint.kind, "bar": "joint", "component": ",".join(members), "damage": joint.joint_damage,
                     "ratio_to_mean": joint.ratio_to_mean, "ratio_to_sum": joint.ratio_to_sum, "reason": joint.reason})
    fig.update_annotations(font_size=11)
    fig.update_layout(template=SCREEN, height=420, title=f"{result.model}: alone vs together",
                      bargap=0.25, margin=dict(t=130))
    fig.update_xaxes(tickangle=-45)
    caption = (f"OOD length {result.ood_length}, {result.settings.ablation_mode} ablation. "
               "damage = clean OOD exact match − exact match with the component(s) ablated; colour: layer; "
               "grey: the sum of the single damages; orange: all ablated together (joint / sum > 1: superadditive); "
               "dotted: the clean accuracy.")
    prov = provenance(figure="joint_ablation_bars", model=result.model, revision=result.revision, task=result.task,
                      settings=result.settings.to_json(), ood_length=result.ood_length,
                      clean_accuracy=result.clean_accuracy, joint_bloats=result.joint_bloats.to_json(),
                      joint_heroes=result.joint_heroes.to_json())
    return FigureBundle(f"attribution-{result.model}-joint-ablation", fig, tuple(rows), prov, caption,
                        (PAPER_WIDTH, PAPER_HEIGHT))


def _wrap(text: str, width: int = 30) -> str:
    """Break a subplot title into lines of at most ~width characters (plotly does not wrap)."""
    words, lines, line = text.split(), [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "<br>".join(lines + [line])


# ---------------------------------------------------------------------------------------------
# over seeds


def _summaries(data: Any) -> list[AttributionSummary]:
    """A summary, summaries, or per-model results (grouped by task, settings and components, in order)."""
    if isinstance(data, AttributionSummary):
        return [data]
    items = list(data)
    if not items:
        raise HeadLabError("no analysed models to draw; run the analysis on at least one model first.")
    if all(isinstance(x, AttributionSummary) for x in items):
        return items
    if all(isinstance(x, AttributionResult) for x in items):
        groups: dict[tuple, list[AttributionResult]] = {}
        for r in items:
            groups.setdefault((r.task, r.settings, r.components), []).append(r)
        return [summarize(group) for group in groups.values()]
    raise HeadLabError("give AttributionSummary objects or AttributionResult objects, not a mix.")


def _group_labels(summaries: Sequence[AttributionSummary]) -> list[str]:
    """The task of each group; groups of one task analysed differently also name the settings that differ."""
    labels = []
    for s in summaries:
        same_task = [o for o in summaries if o.task == s.task]
        label = s.task
        if len(same_task) > 1:
            mine, others = s.settings.to_json(), [o.settings.to_json() for o in same_task if o is not s]
            differ = [k for k in mine if k != "task" and any(o[k] != mine[k] for o in others)]
            label += " (" + ", ".join(f"{k}={mine[k]}" for k in differ) + ")" if differ else f" #{same_task.index(s) + 1}"
        labels.append(label)
    return labels


def rho_strip(data: Any, highlight: str | None = None, paper_reference: bool = True) -> FigureBundle:
    """Spearman rho(G, C) of every seed, one column per task (or settings group), with mean ± std (ddof 0).

    data: an AttributionSummary, several, or per-model AttributionResults. highlight: a model drawn
    larger in orange. paper_reference: a short dashed line at the published mean for the task.
    Models with an undefined rho (G or C constant) are left out and counted in the caption.
    """
    summaries = _summaries(data)
    labels = _group_labels(summaries)
    jitter = np.random.RandomState(0)  # fixed: the same picture every time
    fig = go.Figure()
    rows: list[dict] = []
    undefined = 0
    for col, (s, label) in enumerate(zip(summaries, labels)):
        defined = [(m, float(r)) for m, r in zip(s.models, s.rhos) if r is not None]
        undefined += len(s.models) - len(defined)
        x = (col + jitter.uniform(-0.15, 0.15, size=len(defined))).tolist()
        colors = [CANDIDATE_COLOR if m == highlight else CONTROL_COLOR for m, _ in defined]
        sizes = [13 if m == highlight else 8 for m, _ in defined]
        fig.add_trace(go.Scatter(x=x, y=[r for _, r in defined], mode="markers", name=f"{label} seeds", showlegend=False,
                                 marker=dict(color=colors, size=sizes, line=dict(width=0.5, color="white")),
                                 customdata=[m for m, _ in defined], hovertemplate="%{customdata}: ρ = %{y:.3f}<extra></extra>"))
        if s.rho_mean is not None:
            fig.add_trace(go.Scatter(x=[col + 0.3], y=[s.rho_mean], mode="markers", name="mean ± std", showlegend=col == 0,
                                     legendgroup="mean", marker=dict(color="black", size=10, symbol="line-ew-open",
                                                                     line=dict(width=3)),
                                     error_y=dict(type="data", array=[s.rho_std or 0.0], color="black", thickness=1.5, width=6),
                                     hovertemplate=f"{label}: mean ρ = %{{y:.3f}} ± {s.rho_std or 0:.3f}<extra></extra>"))
        if paper_reference and s.task in PAPER_RHO:
            fig.add_trace(go.Scatter(x=[col - 0.3, col + 0.4], y=[PAPER_RHO[s.task]] * 2, mode="lines",
                                     name="published mean [HHG]", showlegend=col == 0, legendgroup="paper",
                                     line=dict(color=CANDIDATE_COLOR, dash="dash", width=1.5),
                                     hovertemplate=f"published mean for {s.task}: {PAPER_RHO[s.task]}<extra></extra>"))
        rows += [{"group": label, "task": s.task, "model": m, "rho": r} for m, r in defined]
        rows.append({"group": label, "task": s.task, "model": None, "statistic": "mean ± std (ddof 0)", "rho": s.rho_mean,
                     "rho_std": s.rho_std, "n_models": s.n_models, "n_defined": len(defined)})
    fig.add_hline(y=0, line_color="#999", line_width=1)
    fig.update_layout(template=SCREEN, height=380, title="Spearman ρ(G, C) per seed", yaxis_title="Spearman ρ",
                      showlegend=True)
    fig.update_xaxes(tickmode="array", tickvals=list(range(len(summaries))),
                     ticktext=[f"{l}<br>n = {s.n_models}" for l, s in zip(labels, summaries)],
                     range=[-0.6, len(summaries) - 0.4], showgrid=False)
    fig.update_yaxes(range=[-1.05, 1.05])
    _legend_on_top(fig)
    caption = ("one point per seed (model); black: mean ± population std over the seeds"
               + ("; dashed: the published mean (reverse 0.72, sort 0.27)" if paper_reference else "")
               + (f"; {undefined} model(s) with an undefined ρ (G or C constant) left out" if undefined else "") + ".")
    prov = provenance(figure="rho_strip", groups=[{"label": l, **s.to_json()} for l, s in zip(labels, summaries)],
                      highlight=highlight, paper_rho=PAPER_RHO if paper_reference else None)
    return FigureBundle("attribution-rho-strip", fig, tuple(rows), prov, caption, (380, PAPER_HEIGHT))


def component_grid(components: Sequence[str]) -> tuple[int, list[str], dict[str, tuple[int, int]]]:
    """Layout of components on a layer x (heads + MLP) grid: (n_layers, column labels, {component: (row, col)})."""
    parsed = {c: parse_component(c) for c in components}
    n_layers = max(l for l, _ in parsed.values()) + 1
    n_heads = max((h for _, h in parsed.values() if h is not None), default=-1) + 1
    has_mlp = any(h is None for _, h in parsed.values())
    columns = [f"H{h}" for h in range(n_heads)] + (["MLP"] if has_mlp else [])
    cells = {c: (l, n_heads if h is None else h) for c, (l, h) in parsed.items()}
    return n_layers, columns, cells


def hero_bloat_heatmap(summary: AttributionSummary) -> FigureBundle:
    """Over seeds: the fraction of models in which each component is a hidden hero (left) / a gradient bloat (right).

    Grid: rows = layers (layer 0 on top), columns = heads then the layer's MLP (absent for a heads-only
    analysis). Cell text: count / number of models. z of each heatmap is [layer, column] fractions.
    """
    if summary.n_models < 1:
        raise HeadLabError("the summary holds no models; run the analysis on at least one model first.")
    n = summary.n_models
    n_layers, columns, cells = component_grid(summary.components)
    hero_rule, bloat_rule = _rule_parts(summary.settings.threshold, summary.settings.rule)
    titles = [f"hidden heroes ({hero_rule})", f"gradient bloats ({bloat_rule})"]
    fig = make_subplots(rows=1, cols=2, subplot_titles=titles, horizontal_spacing=0.08)
    rows: list[dict] = []
    scale = [[0.0, "#ffffff"], [1.0, "#08306b"]]
    for col, (kind, counts) in enumerate((("hero", summary.hero_counts), ("bloat", summary.bloat_counts)), start=1):
        z = np.full((n_layers, len(columns)), np.nan)  # [layer, column]; NaN: no such component
        text = np.full((n_layers, len(columns)), "", dtype=object)
        for comp, count in zip(summary.components, counts):
            r, c = cells[comp]
            z[r, c] = count / n
            text[r, c] = f"{count}/{n}"
            rows.append({"kind": kind, "component": comp, "layer": r, "column": columns[c], "count": int(count),
                         "n_models": n, "fraction": count / n})
        names = np.full((n_layers, len(columns)), "", dtype=object)
        for comp, (r, c) in cells.items():
            names[r, c] = comp
        fig.add_trace(go.Heatmap(z=z.tolist(), x=columns, y=list(range(n_layers)), zmin=0, zmax=1, colorscale=scale,
                                 text=text.tolist(), texttemplate="%{text}", textfont=dict(size=11),
                                 customdata=names.tolist(), xgap=2, ygap=2, showscale=col == 2,
                                 colorbar=dict(title="fraction<br>of seeds", tickformat=".0%"),
                                 hovertemplate=f"%{{customdata}}: {kind} in %{{text}} seeds (%{{z:.0%}})<extra></extra>"),
                      row=1, col=col)
        fig.update_xaxes(title_text="head / MLP", showgrid=False, row=1, col=col)
        fig.update_yaxes(title_text="layer" if col == 1 else None, tickmode="array", tickvals=list(range(n_layers)),
                         autorange="reversed", showgrid=False, row=1, col=col)
    fig.update_annotations(font_size=12)
    fig.update_layout(template=SCREEN, height=max(300, 170 + 45 * n_layers), margin=dict(t=95),
                      title=f"{summary.task}: how often each component is a hero / a bloat over {n} seeds")
    caption = (f"cell: in how many of the {n} analysed models the component is a hidden hero (left) or a gradient bloat "
               f"(right); {_rule_text(summary.settings.threshold, summary.settings.rule)}; {_settings_text(summary.settings)}"
               + (f"; {len(summary.skipped)} model(s) skipped" if summary.skipped else "")
               + ("" if "MLP" in columns else "; heads only (reduced analysis: the models have no single MLP output)") + ".")
    prov = provenance(figure="hero_bloat_heatmap", task=summary.task, models=list(summary.models),
                      settings=summary.settings.to_json(), skipped=[list(s) for s in summary.skipped])
    return FigureBundle(f"attribution-{summary.task}-hero-bloat-frequency", fig, tuple(rows), prov, caption,
                        (PAPER_WIDTH, max(220, 110 + 40 * n_layers)))


# ---------------------------------------------------------------------------------------------
# figure sets for exports


def attribution_bundles(result: AttributionResult | None = None, summaries: Sequence[AttributionSummary] = ()) -> list[FigureBundle]:
    """One model's figures (rank scatter, joint ablation bars) and, given summaries, the seed-level ones."""
    out: list[FigureBundle] = []
    if result is not None:
        out += [rank_scatter(result), joint_ablation_bars(result)]
    if summaries:
        out.append(rho_strip(list(summaries), highlight=None if result is None else result.model))
        out += [hero_bloat_heatmap(s) for s in summaries]
    return out
