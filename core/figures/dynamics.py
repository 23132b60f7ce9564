"""Figure builders for circuits over training and for the replication report.

Each returns a `core.figures.bundle.FigureBundle` (screen theme, data rows, provenance), so the
"Training dynamics" page draws and exports exactly what `python -m core replicate` writes.
Inputs are the results of core/pipelines/dynamics.py (Trajectories, Identification, CrossSeedMatrix,
DataShift, FormFunction) and of core/pipelines/attribution.py (AttributionResult, AttributionSummary).
Token axes are logarithmic; checkpoints at 0 tokens have no place there and are named in captions.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Optional, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from core.figures._style import SELECTIVITY_FLOOR, _legend_on_top, short_tokens
from core.figures.bundle import FigureBundle
from core.figures.theme import CANDIDATE_COLOR, CONTROL_COLOR, LAYER_COLORS, PAPER_WIDTH, SCREEN
from core.heads import Head, head_name
from core.pipelines.dynamics import CrossSeedMatrix, DataShift, FormFunction, Trajectories
from core.stats.dynamics import DEFAULT_MARGIN, FORM_FUNCTION_LABELS, IDENTIFIABLE_BAND, Z_THRESHOLD, Identification
from core.results import provenance

Z_CAP = 10.0  # the cross-seed colour scale saturates here; the cells print every value
CLASS_MARKERS = {"hero": ("#D55E00", "triangle-up"), "bloat": ("#0072B2", "triangle-down"), "aligned": ("#999999", "circle")}
LABEL_COLORS = {"form and function": "#009E73", "function without form": "#D55E00",
                "form without function": "#0072B2", "neither": "#BBBBBB"}


def _head_color(i: int) -> str:
    return LAYER_COLORS[i % len(LAYER_COLORS)]


def _positive(tokens: Sequence[float]) -> np.ndarray:
    return np.asarray(tokens, dtype=np.float64) > 0


# ---------------------------------------------------------------------------------------------
# timing: PR rise and threshold crossing on one token axis


def timing_figure(traj: Trajectories, heads: Iterable[Head] | None = None, margin: float = DEFAULT_MARGIN) -> FigureBundle:
    """PR (top) and membership selectivity (bottom, log) of each head against log tokens, sharing x.

    ▲ marks each head's PR rise (PR >= running minimum + margin), ★ its threshold crossing.
    """
    heads = tuple(traj.final_circuit if heads is None else heads)
    timings = traj.timing(heads, margin) if heads else ()
    tokens = np.asarray(traj.tokens, dtype=np.float64)
    keep = _positive(tokens)
    x = tokens[keep].tolist()
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.06)
    rows = []
    for i, timing in enumerate(timings):
        layer, head = timing.head
        name = head_name(timing.head)
        color = _head_color(i)
        pr = traj.pr[:, layer, head]
        sel = traj.membership[:, layer, head]
        fig.add_trace(go.Scatter(x=x, y=pr[keep].tolist(), mode="lines", name=name, legendgroup=name,
                                 line=dict(color=color, width=2),
                                 hovertemplate=f"{name}<br>%{{x:.3s}} tokens<br>PR %{{y:.3f}}<extra></extra>"), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=np.maximum(sel[keep], SELECTIVITY_FLOOR).tolist(), mode="lines", name=name, legendgroup=name,
                                 showlegend=False, line=dict(color=color, width=2),
                                 hovertemplate=f"{name}<br>%{{x:.3s}} tokens<br>%{{y:.3g}}x<extra></extra>"), row=2, col=1)
        if timing.rise.index is not None and timing.rise.tokens and timing.rise.tokens > 0:
            fig.add_trace(go.Scatter(x=[timing.rise.tokens], y=[float(pr[timing.rise.index])], mode="markers",
                                     name=f"{name} PR rise", legendgroup=name, showlegend=False,
                                     marker=dict(symbol="triangle-up", size=13, color=color, line=dict(width=1, color="black")),
                                     hovertemplate=f"{name} PR rise at %{{x:.3s}} tokens<extra></extra>"), row=1, col=1)
        if timing.crossing.index is not None and timing.crossing.tokens and timing.crossing.tokens > 0:
            fig.add_trace(go.Scatter(x=[timing.crossing.tokens], y=[float(max(sel[timing.crossing.index], SELECTIVITY_FLOOR))],
                                     mode="markers", name=f"{name} crossing", legendgroup=name, showlegend=False,
                                     marker=dict(symbol="star", size=15, color=color, line=dict(width=1, color="black")),
                                     hovertemplate=f"{name} crosses at %{{x:.3s}} tokens<extra></extra>"), row=2, col=1)
        for c in range(len(tokens)):
            rows.append({"head_name": name, "revision": traj.revisions[c], "tokens": float(tokens[c]),
                         "pr": float(pr[c]), "membership_selectivity": float(sel[c]),
                         "pr_rise": c == timing.rise.index, "threshold_crossing": c == timing.crossing.index})
    fig.add_hline(y=traj.induction_threshold, line_dash="dash", line_color="#444", line_width=1, row=2, col=1)
    fig.add_annotation(x=0, xref="x2 domain", y=math.log10(traj.induction_threshold), yref="y2", yanchor="bottom",
                       xanchor="left", showarrow=False, font=dict(size=10),
                       text=f"membership threshold {traj.induction_threshold:.3g}x")
    fig.update_xaxes(type="log", row=1, col=1)
    fig.update_xaxes(type="log", title_text="training tokens (log)", row=2, col=1)
    fig.update_yaxes(title_text=f"PR ({traj.definition})", row=1, col=1)
    fig.update_yaxes(type="log", title_text="membership selectivity<br>(uniform baseline, log)", row=2, col=1)
    leads = [t.lead_decades for t in timings if t.lead_decades is not None]
    first = sum(t.rise_first for t in timings)
    title = (f"{traj.model}: PR rise (▲) and threshold crossing (★)" if timings
             else f"{traj.model}: no heads chosen")
    fig.update_layout(template=SCREEN, height=560, title=title)
    _legend_on_top(fig)
    fig.update_layout(margin=dict(l=95))  # room for the two-line axis title beside the log ticks
    dropped = [traj.revisions[i] for i in np.flatnonzero(~keep)]
    caption = (f"PR rise: the first checkpoint where PR ≥ its running minimum + {margin:g}; threshold crossing: the "
               f"first checkpoint with membership selectivity ≥ {traj.induction_threshold:.3g}x. "
               + (f"PR rises first in {first} of {len(timings)} heads; lead (log10 tokens) "
                  + ", ".join(f"{head_name(t.head)} {t.lead_decades:+.2f}" if t.lead_decades is not None
                              else f"{head_name(t.head)} n/a" for t in timings) + ". " if timings else "")
               + (f"Not on the log axis (0 tokens): {', '.join(dropped)}." if dropped else ""))
    prov = provenance(figure="dynamics_timing", model=traj.model, probe_spec=traj.probe_spec, margin=margin,
                      induction_threshold=traj.induction_threshold, pr_definition=traj.definition,
                      heads=[head_name(h) for h in heads], revisions=list(traj.revisions),
                      timings=[t.to_json() for t in timings], median_lead_decades=float(np.median(leads)) if leads else None)
    return FigureBundle("dynamics-timing", fig, tuple(rows), prov, caption, (PAPER_WIDTH, 420))


# ---------------------------------------------------------------------------------------------
# identification: when does the truncated recipe return the final circuit?


def identification_figure(items: Sequence[tuple[str, Identification]]) -> FigureBundle:
    """Jaccard(circuit at t, final circuit) against the fraction of training tokens, one line per model.

    ● marks the earliest identifying checkpoint (Jaccard 1); the shaded band is [SPC]'s 0.3-2%.
    """
    fig = go.Figure()
    rows = []
    lo, hi = IDENTIFIABLE_BAND
    fig.add_vrect(x0=lo, x1=hi, fillcolor="rgba(0,158,115,0.12)", line_width=0, layer="below")
    fig.add_annotation(x=math.log10(math.sqrt(lo * hi)), y=1.08, text="SPC: 0.3-2%", showarrow=False,
                       font=dict(size=10), yref="y")
    for i, (model, ident) in enumerate(items):
        tokens = np.asarray(ident.tokens, dtype=np.float64)
        total = float(tokens[-1]) if tokens.size and tokens[-1] > 0 else 1.0
        frac = tokens / total
        keep = frac > 0
        color = _head_color(i)
        fig.add_trace(go.Scatter(x=frac[keep].tolist(), y=np.asarray(ident.jaccards)[keep].tolist(), mode="lines+markers",
                                 name=model, line=dict(color=color, width=2), marker=dict(size=5),
                                 customdata=np.asarray(ident.sizes)[keep].tolist(),
                                 hovertemplate=f"{model}<br>%{{x:.3%}} of tokens<br>Jaccard %{{y:.2f}}<br>"
                                               "circuit size %{customdata}<extra></extra>"))
        if ident.first_fraction:
            fig.add_trace(go.Scatter(x=[ident.first_fraction], y=[1.0], mode="markers", showlegend=False,
                                     marker=dict(symbol="circle", size=14, color=color, line=dict(width=2, color="black")),
                                     hovertemplate=f"{model}: earliest identifying checkpoint %{{x:.3%}}<extra></extra>"))
        for c in range(tokens.size):
            rows.append({"model": model, "tokens": float(tokens[c]), "fraction_of_training": float(frac[c]),
                         "jaccard_with_final": float(ident.jaccards[c]), "circuit_size": int(ident.sizes[c]),
                         "earliest_identifying": c == ident.first.index, "stable_from_here": c == ident.stable.index})
    fig.update_xaxes(type="log", title_text="fraction of training tokens (log)", tickformat=".2~%")
    fig.update_yaxes(title_text="Jaccard with the final circuit", range=[-0.05, 1.15])
    headline = "; ".join(f"{m}: {'%.3g%%' % (100 * ident.first_fraction) if ident.first_fraction is not None else 'never'}"
                         for m, ident in items)
    fig.update_layout(template=SCREEN, height=380, title=f"earliest checkpoint returning the final circuit ({headline})")
    _legend_on_top(fig)
    caption = ("At each checkpoint t the recipe (run on checkpoints up to t) returns the heads at or above the "
               "membership threshold at t; Jaccard with the final circuit. ● = earliest Jaccard 1; shaded: 0.3-2% of "
               "training tokens, where [SPC] finds the circuit identifiable.")
    prov = provenance(figure="dynamics_identification", models=[m for m, _ in items],
                      identifications={m: ident.to_json() for m, ident in items}, band=list(IDENTIFIABLE_BAND))
    return FigureBundle("dynamics-identification", fig, tuple(rows), prov, caption)


# ---------------------------------------------------------------------------------------------
# cross-seed ablation matrix


def cross_seed_figure(matrix: CrossSeedMatrix, metric: str = "loss") -> FigureBundle:
    """z of ablating each model's circuit (rows) in each model (columns) vs matched-random controls there."""
    n = len(matrix.models)
    z = np.full((n, n), np.nan)
    delta = np.full((n, n), np.nan)
    text = [["" for _ in range(n)] for _ in range(n)]
    rows = []
    for a in range(n):
        for b in range(n):
            cell = matrix.cells[a][b]
            if cell is not None and cell.get(metric, {}).get("z") is not None:
                z[a, b] = float(cell[metric]["z"])
                delta[a, b] = float(cell[metric]["candidate_delta"])
                text[a][b] = f"Δ {delta[a, b]:+.2f}<br>z {z[a, b]:+.1f}"
            else:
                text[a][b] = "—"
            rows.append({"circuit_of": matrix.models[a], "ablated_in": matrix.models[b], "metric": metric,
                         "delta": None if np.isnan(delta[a, b]) else float(delta[a, b]),
                         "z": None if np.isnan(z[a, b]) else float(z[a, b]),
                         "control_mean": None if cell is None else cell.get(metric, {}).get("control_mean"),
                         "jaccard_with_own": None if cell is None else cell.get("jaccard_with_own"),
                         "control_kind": None if cell is None else cell.get("control_kind"),
                         "reason": matrix.reasons[a][b]})
    finite = np.abs(z[np.isfinite(z)])
    cap = float(max(Z_THRESHOLD * 2, min(Z_CAP, finite.max() if finite.size else 1.0)))  # colour saturates at |z| = 10
    fig = go.Figure(go.Heatmap(z=np.where(np.isfinite(z), z, None).tolist(), x=list(matrix.models), y=list(matrix.models),
                               zmid=0, zmin=-cap, zmax=cap, colorscale="RdBu_r", text=text, texttemplate="%{text}",
                               textfont=dict(size=11), colorbar=dict(title=f"z ({metric})"),
                               hovertemplate="circuit of %{y}<br>ablated in %{x}<br>%{text}<extra></extra>"))
    fig.update_xaxes(title_text="ablated in model", side="bottom")
    fig.update_yaxes(title_text="circuit of model", autorange="reversed")
    spec = matrix.specificity(metric)
    md, mo = spec["median_diagonal_z"], spec["median_off_diagonal_z"]
    longest = max((len(m) for m in matrix.models), default=4)
    fig.update_layout(template=SCREEN, height=max(320, 110 + 70 * n), width=max(420, 220 + 110 * n),
                      margin=dict(l=60 + 7 * longest, b=60 + 4 * longest),
                      title=f"cross-seed ablation: z of Δ{metric} against matched-random heads")
    caption = (f"Median z: own model {'n/a' if md is None else f'{md:+.1f}'}, other models "
               f"{'n/a' if mo is None else f'{mo:+.1f}'}. Each cell ablates the row model's final circuit in the column model against "
               f"{matrix.settings.get('n_controls', '?')} matched-random head sets of that model (same layers and counts); "
               f"z = (Δ − control mean) / control std. Diagonal: a circuit in its own model.")
    prov = provenance(figure="cross_seed_matrix", models=list(matrix.models), circuits=list(matrix.circuits),
                      settings=matrix.settings, metric=metric, specificity=spec)
    return FigureBundle("dynamics-cross-seed", fig, tuple(rows), prov, caption,
                        (max(PAPER_WIDTH, 200 + 90 * n), max(300, 100 + 60 * n)))


# ---------------------------------------------------------------------------------------------
# data shift


def data_shift_figure(shift: DataShift) -> FigureBundle:
    """Jaccard of the shifted run's circuit with the base model's final circuit, over the shifted run."""
    tokens = np.asarray(shift.tokens, dtype=np.float64)
    keep = tokens > 0
    fig = go.Figure(go.Scatter(x=tokens[keep].tolist(), y=np.asarray(shift.jaccards)[keep].tolist(), mode="lines+markers",
                               name=shift.shifted, line=dict(color=CANDIDATE_COLOR, width=2),
                               hovertemplate="%{x:.3s} tokens after the shift<br>Jaccard %{y:.2f}<extra></extra>"))
    fig.update_xaxes(type="log", title_text=f"tokens of continued training on the new data ({shift.shifted}, log)")
    fig.update_yaxes(title_text=f"Jaccard with {shift.base}'s final circuit", range=[-0.05, 1.05])
    fig.update_layout(template=SCREEN, height=340,
                      title=f"circuit across a data shift: final Jaccard {shift.jaccard:.2f}")
    rows = tuple({"revision": r, "tokens": float(t), "jaccard_with_base_final": float(j)}
                 for r, t, j in zip(shift.revisions, tokens, shift.jaccards))
    dropped = [r for r, k in zip(shift.revisions, keep) if not k]
    caption = (f"{shift.base}: {shift.base_circuit or 'none'}; {shift.shifted}: {shift.shifted_circuit or 'none'}; "
               f"circuit = heads at or above {shift.induction_threshold:.3g}x membership selectivity; "
               + (f"not on the log axis (0 tokens): {', '.join(dropped)}." if dropped else ""))
    prov = provenance(figure="data_shift", **shift.to_json())
    return FigureBundle("dynamics-data-shift", fig, rows, prov, caption)


# ---------------------------------------------------------------------------------------------
# form vs function


def form_function_figure(ff: FormFunction, metric: str = "target_logit") -> FigureBundle:
    """Per checkpoint: the circuit's selectivity (form, x, log) against its closure z (function, y).

    Points follow training order; colour = the form/function label. Lines: the membership threshold
    and z = ∓1.8 (the closure threshold on the damaging side).
    """
    sign = 1.0 if metric == "loss" else -1.0  # damage direction: loss up, logit/accuracy down
    x = np.maximum(np.asarray(ff.form_score, dtype=np.float64), SELECTIVITY_FLOOR)
    y = np.array([np.nan if c.get(metric, {}).get("z") is None else float(c[metric]["z"]) for c in ff.cells])
    labels = ff.labels
    tokens = np.asarray(ff.tokens, dtype=np.float64)
    fig = go.Figure(go.Scatter(x=x.tolist(), y=np.where(np.isfinite(y), y, None).tolist(), mode="lines",
                               line=dict(color="#CCCCCC", width=1), showlegend=False, hoverinfo="skip"))
    for label in FORM_FUNCTION_LABELS:
        idx = [i for i, l in enumerate(labels) if l == label]
        if not idx:
            continue
        fig.add_trace(go.Scatter(
            x=x[idx].tolist(), y=[None if not np.isfinite(y[i]) else float(y[i]) for i in idx], mode="markers",
            name=f"{label} ({len(idx)})", marker=dict(size=10, color=LABEL_COLORS[label], line=dict(width=1, color="#333")),
            customdata=[[ff.revisions[i], short_tokens(tokens[i])] for i in idx],
            hovertemplate="%{customdata[0]} (%{customdata[1]} tokens)<br>selectivity %{x:.3g}x<br>z %{y:+.2f}<extra></extra>"))
    fig.add_vline(x=ff.induction_threshold, line_dash="dash", line_color="#444", line_width=1)
    fig.add_hline(y=sign * Z_THRESHOLD, line_dash="dot", line_color="#444", line_width=1)
    fig.update_xaxes(type="log", title_text="form: mean membership selectivity of the circuit (log)")
    fig.update_yaxes(title_text=f"function: closure z of Δ{metric}")
    counts = ff.counts()
    fig.update_layout(template=SCREEN, height=420, title=f"{ff.model}: form vs function of {ff.circuit}")
    _legend_on_top(fig)
    rows = tuple({"revision": ff.revisions[i], "tokens": float(tokens[i]), "form_score": float(ff.form_score[i]),
                  "form": ff.form[i], "function": ff.function[i], "label": labels[i],
                  "closure_verdict": ff.cells[i].get("closure_verdict"),
                  **{f"delta_{m}": ff.cells[i].get(m, {}).get("candidate_delta") for m in ("loss", "top1", "target_logit")},
                  **{f"z_{m}": ff.cells[i].get(m, {}).get("z") for m in ("loss", "top1", "target_logit")}}
                 for i in range(len(labels)))
    caption = (f"{len(labels)} checkpoints: function without form {counts['function without form']}, form without "
               f"function {counts['form without function']}. "
               f"function = the closure verdict passes ({ff.settings.get('closure_rule', 'paper rule')}), "
               f"{ff.settings.get('n_controls', '?')} matched-random controls per checkpoint; form = mean membership "
               f"selectivity ≥ {ff.induction_threshold:.3g}x.")
    prov = provenance(figure="form_vs_function", model=ff.model, circuit=str(ff.circuit), settings=ff.settings,
                      counts=counts)
    return FigureBundle("dynamics-form-function", fig, rows, prov, caption)


def closure_splits_figure(model: str, summary: dict) -> FigureBundle:
    """z of each metric for every closure split (control kind x examples) of a co-activation candidate.

    summary: core.pipelines.coactivation.CoactivationReport.summary() (its "closure" list).
    """
    metrics = ("loss", "top1", "top5", "target_logit")
    fig = go.Figure()
    rows = []
    for i, split in enumerate(summary.get("closure") or []):
        label = f"{split['kind']}, {split['split']} ({split['n']} ex.): {split['verdict_paper']}"
        fig.add_trace(go.Bar(x=list(metrics), y=[split["z"][m] for m in metrics], name=label,
                             marker_color=_head_color(i)))
        rows += [{"kind": split["kind"], "split": split["split"], "n_examples": split["n"], "metric": m,
                  "delta": split["delta"][m], "z": split["z"][m], "verdict_paper": split["verdict_paper"],
                  "verdict_reference": split["verdict_reference"]} for m in metrics]
    fig.add_hline(y=Z_THRESHOLD, line_dash="dot", line_color="#444", line_width=1)
    fig.add_hline(y=-Z_THRESHOLD, line_dash="dot", line_color="#444", line_width=1)
    fig.update_layout(template=SCREEN, height=380, barmode="group", yaxis_title="z against random controls",
                      title=f"{model}: closure of the co-activation candidate")
    _legend_on_top(fig)
    caption = (f"candidate {', '.join(summary.get('candidate', []))}. z = (candidate Δ − control mean) / control std per metric; damage is loss up and top-1, top-5, target "
               f"logit down; dotted: ±{Z_THRESHOLD:g}. Splits: all examples, or on / off the discovery stratum.")
    prov = provenance(figure="closure_splits", model=model, summary=summary)
    return FigureBundle("closure-splits", fig, tuple(rows), prov, caption)


# ---------------------------------------------------------------------------------------------
# [HHG] attribution


def attribution_ranks_figure(result: Any) -> FigureBundle:
    """Gradient rank against causal rank per component (core.pipelines.attribution.AttributionResult), classes marked."""
    fig = go.Figure()
    n = len(result.components)
    fig.add_trace(go.Scatter(x=[1, n], y=[1, n], mode="lines", line=dict(color="#BBBBBB", dash="dash"), showlegend=False,
                             hoverinfo="skip"))
    for kind, (color, symbol) in CLASS_MARKERS.items():
        idx = [i for i, c in enumerate(result.classes) if c == kind]
        if not idx:
            continue
        fig.add_trace(go.Scatter(
            x=[result.rank_G[i] for i in idx], y=[result.rank_C[i] for i in idx], mode="markers+text",
            text=[result.components[i] for i in idx], textposition="top center", textfont=dict(size=9),
            name=f"{kind} ({len(idx)})", marker=dict(size=11, color=color, symbol=symbol),
            hovertemplate="%{text}<br>rank G %{x}<br>rank C %{y}<extra></extra>"))
    fig.update_xaxes(title_text="rank of gradient magnitude G (1 = smallest)")
    fig.update_yaxes(title_text="rank of causal importance C (1 = smallest)")
    rho = "undefined" if result.rho is None else f"{result.rho:+.2f}"
    fig.update_layout(template=SCREEN, height=440, title=f"{result.model} ({result.task}): Spearman rho = {rho}")
    _legend_on_top(fig)
    rows = tuple({"component": c, "G": g, "C": cc, "rank_G": rg, "rank_C": rc, "d": d, "class": k}
                 for c, g, cc, rg, rc, d, k in zip(result.components, result.G, result.C, result.rank_G, result.rank_C,
                                                   result.d, result.classes))
    prov = provenance(figure="attribution_ranks", model=result.model, task=result.task, rho=result.rho,
                      settings=result.settings.to_json(), ood_length=result.ood_length)
    return FigureBundle(f"hhg-ranks-{result.task}", fig, rows, prov,
                        f"d = rank_G − rank_C; bloat: d ≥ {result.settings.threshold:g}, hero: d ≤ −{result.settings.threshold:g}.")


def attribution_layers_figure(per_layer: Sequence[dict], label: str) -> FigureBundle:
    """Heroes and bloats per layer, summed over the analysed models."""
    layers = [int(r["layer"]) for r in per_layer]
    fig = go.Figure()
    for kind, key in (("hero", "heroes"), ("bloat", "bloats")):
        fig.add_trace(go.Bar(x=[f"layer {l}" for l in layers], y=[int(r[key]) for r in per_layer], name=key,
                             marker_color=CLASS_MARKERS[kind][0]))
    fig.update_layout(template=SCREEN, height=340, barmode="group", title=f"heroes and bloats per layer ({label})",
                      yaxis_title="count over models")
    _legend_on_top(fig)
    rows = tuple({"layer": int(r["layer"]), "heroes": int(r["heroes"]), "bloats": int(r["bloats"])} for r in per_layer)
    return FigureBundle("hhg-layers", fig, rows, provenance(figure="attribution_layers", label=label),
                        "[HHG]: bloats concentrate in layer 1, heroes in layer 3.")


def rho_figure(rhos: dict[str, Sequence[Optional[float]]], published: dict[str, float]) -> FigureBundle:
    """Spearman rho per seed for each task, with the published mean as a line."""
    fig = go.Figure()
    rows = []
    rng = np.random.RandomState(0)  # fixed jitter
    for i, (task, values) in enumerate(rhos.items()):
        vals = [v for v in values if v is not None]
        fig.add_trace(go.Scatter(x=(i + rng.uniform(-0.12, 0.12, len(vals))).tolist(), y=vals, mode="markers",
                                 name=f"{task} seeds", marker=dict(size=9, color=CONTROL_COLOR)))
        if vals:
            fig.add_trace(go.Scatter(x=[i - 0.3, i + 0.3], y=[float(np.mean(vals))] * 2, mode="lines",
                                     name=f"{task} HeadLab mean", line=dict(color=CANDIDATE_COLOR, width=3)))
        if task in published:
            fig.add_trace(go.Scatter(x=[i - 0.3, i + 0.3], y=[published[task]] * 2, mode="lines",
                                     name=f"{task} published", line=dict(color="black", dash="dash")))
        rows += [{"task": task, "seed_index": j, "rho": v} for j, v in enumerate(values)]
    fig.update_xaxes(tickmode="array", tickvals=list(range(len(rhos))), ticktext=list(rhos))
    fig.update_yaxes(title_text="Spearman rho(G, C)", range=[-1, 1])
    fig.update_layout(template=SCREEN, height=360, title="gradient vs causal agreement per seed")
    _legend_on_top(fig)
    return FigureBundle("hhg-rho", fig, tuple(rows), provenance(figure="attribution_rho", published=published),
                        "grey: one seed each; orange: HeadLab mean; dashed: the published mean.")


__all__ = ["attribution_layers_figure", "attribution_ranks_figure", "closure_splits_figure", "cross_seed_figure", "data_shift_figure",
           "form_function_figure", "identification_figure", "rho_figure", "timing_figure"]
