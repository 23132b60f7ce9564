"""Figure of the proposers-vs-disposer comparison: each proposal's closure z per metric, verdict coloured."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from core.figures.theme import CANDIDATE_COLOR, CONTROL_COLOR, FADED, SCREEN
from core.figures._style import UNRELIABLE_OPACITY, _legend_on_top, _metric_label, z_reliable
from core.figures.bundle import FigureBundle
from core.results import provenance

VERDICT_COLORS = {"pass": CANDIDATE_COLOR, "fail": CONTROL_COLOR, "fails in the wrong direction": "#d62728",
                  "not tested": FADED}
Z_THRESHOLD = 1.8


def proposers_figure(report, metrics=("loss", "top1", "target_logit")) -> FigureBundle:
    """One panel per metric: a bar per proposal with its closure z against the random controls.

    report: core.pipelines.proposers.ProposersReport. Bars are coloured by the paper-rule verdict; the dashed
    lines mark ±1.8, the paper rule's z threshold (damage is z_loss > 0, z_top1 / z_logit < 0).
    """
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=[f"z, {_metric_label(m)}" for m in metrics],
                        horizontal_spacing=0.08)
    methods = [d.proposal.method for d in report.disposals]
    reliable = z_reliable(report.provenance.get("n_controls"))  # below 10 controls: bars greyed out
    shown = set()
    for col, metric in enumerate(metrics, start=1):
        for d in report.disposals:
            z = d.metrics.get(metric, {}).get("z")
            verdict = d.verdict_paper
            fig.add_trace(go.Bar(
                x=[d.proposal.method], y=[0.0 if z is None else z], name=verdict, legendgroup=verdict,
                showlegend=verdict not in shown, marker_color=VERDICT_COLORS.get(verdict, FADED),
                opacity=1.0 if reliable else UNRELIABLE_OPACITY,
                hovertemplate=(f"{d.proposal.method}<br>{', '.join(map(str, d.proposal.heads)) or 'no heads'}"
                               f"<br>z = %{{y:.3g}}<br>{verdict}<extra></extra>")), row=1, col=col)
            shown.add(verdict)
        for level in (Z_THRESHOLD, -Z_THRESHOLD):
            fig.add_hline(y=level, line_dash="dash", line_color="#888", line_width=1, row=1, col=col)
        fig.update_xaxes(categoryorder="array", categoryarray=methods, row=1, col=col)
    fig.update_layout(template=SCREEN, height=420, barmode="group",
                      title=f"proposers vs disposer: {report.provenance.get('model')} @ {report.provenance.get('revision')}")
    _legend_on_top(fig)
    fig.update_layout(margin=dict(t=120), legend=dict(y=1.14))
    rows = tuple(report.rows())
    caption = (f"closure z of each proposal against {report.provenance.get('n_controls')} "
               f"{report.provenance.get('controls')} random controls (seed {report.provenance.get('control_seed')}); "
               "colour = paper-rule verdict; dashed = ±1.8; z uses the controls' population sd (ddof=0)"
               + ("." if reliable else "; greyed: fewer than 10 controls, so z is unreliable (read the verdicts' ranks)."))
    prov = provenance(figure="proposers_vs_disposer", **{k: v for k, v in report.provenance.items() if k != "gradient"})
    return FigureBundle("proposers-vs-disposer", fig, rows, prov, caption)
