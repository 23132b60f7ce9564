"""Figures of the known-circuit benchmark (core/pipelines/benchmark.py): the score table and ROC curves.

Both read the report dict `benchmark()` returns (or its report.json), never the models: the score
table is a heatmap of a measure (ROC AUC by default) per method and task, each cell written with its
interval over seeds, beside a panel of the published anchors (other models, labelled as such); the
ROC curves are one panel per model, a curve per method from its stored per-head scores.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from sklearn.metrics import roc_curve

from core.errors import HeadLabError
from core.figures.bundle import FigureBundle
from core.figures.theme import SCREEN
from core.heads import parse_heads
from core.pipelines.benchmark_report import HEAD_TO_HEAD
from core.results import provenance
from core.stats.recovery import MEASURE_LABELS

METHOD_COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#F0E442", "#000000")
# curves that coincide (two perfect rankings) stay visible: wider first, dashed by turns
METHOD_DASHES = ("solid", "dash", "dot", "dashdot")


def cell_text(row: dict) -> str:
    """A table cell: the value, its interval over seeds when there is one, or why the method has none."""
    if not row.get("n_scored"):
        return "n/a"
    text = f"{row['mean']:.3f}"
    if row.get("low") is not None:
        text += f" [{row['low']:.2f}, {row['high']:.2f}]"
    return text


LEVEL_SLUGS = {"head": "head", "edge": "edge", HEAD_TO_HEAD: "edge-between-heads"}  # score-table level -> file name part


def score_table_figure(report: dict, measure: str = "roc_auc", level: str = "head") -> FigureBundle:
    """Heatmap of `measure` per method (rows) and task (columns) at `level` ("head", "edge" or HEAD_TO_HEAD), each cell its mean
    over seeds and interval; a second panel holds the published anchors (edge ROC AUC on other models, not HeadLab
    runs)."""
    if measure not in MEASURE_LABELS:
        raise HeadLabError(f"unknown measure {measure!r}; use one of {', '.join(MEASURE_LABELS)}.")
    if level not in LEVEL_SLUGS:
        raise HeadLabError(f"unknown level {level!r}; use one of {', '.join(map(repr, LEVEL_SLUGS))}.")
    rows = [r for r in report["table"] if r["measure"] == measure and r.get("level", "head") == level]
    methods = [m["name"] for m in report["methods" if level == "head" else "edge_methods"]]
    if not rows or not methods:
        raise HeadLabError(f"the report has no {level} scores to draw; run the benchmark with {level} methods.")
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    by = {(r["method"], r["task"]): r for r in rows}
    z = [[by[(m, t)]["mean"] if by[(m, t)].get("n_scored") else None for t in tasks] for m in methods]
    text = [[cell_text(by[(m, t)]) for t in tasks] for m in methods]
    published = report.get("published", {}).get("rows", [])
    column = "published (other models)"
    y, x = list(methods), list(tasks) + ([column] if published else [])
    z = [row + ([None] if published else []) for row in z]
    text = [row + ([""] if published else []) for row in text]
    for p in published:
        y.append(f"{p['method']}, {p['task']} ({p['ablation']})")
        z.append([None] * len(tasks) + [p["value"]])
        text.append([""] * len(tasks) + [f"{p['value']:.3f}"])
    fig = go.Figure(go.Heatmap(z=z, x=x, y=y, text=text, texttemplate="%{text}", zmin=0, zmax=1, colorscale="RdBu",
                               zmid=0.5, colorbar=dict(title=measure), hoverongaps=False,
                               hovertemplate="%{y}<br>%{x}<br>%{text}<extra></extra>"))
    if published:  # a rule between HeadLab's rows and the published ones
        fig.add_hline(y=len(methods) - 0.5, line_color="#333", line_width=2)
    fig.update_yaxes(autorange="reversed", automargin=True)
    fig.update_xaxes(side="bottom", tickangle=-30, automargin=True)  # labels under the cells, clear of the title
    height = 200 + 34 * len(y)
    fig.update_layout(template=SCREEN, height=height, margin=dict(l=20, t=90),
                      title=f"known circuits: {level} {MEASURE_LABELS[measure]}"
                      + ("<br><sup>below the rule: published edge ROC AUC, other models</sup>" if published else ""))
    data = [{"method": r["method"], "task": r["task"], "measure": measure, "mean": r.get("mean"), "low": r.get("low"),
             "high": r.get("high"), "n_seeds": r.get("n_seeds"), "baseline_mean": r.get("baseline_mean"),
             "max_p": r.get("max_p"), "not_applicable": "; ".join(r.get("not_applicable", []))} for r in rows]
    data += [{"method": p["method"], "task": p["task"], "measure": p["metric"], "mean": p["value"],
              "source": p["source"], "label": report["published"]["label"]} for p in published]
    caption = (f"{level} {MEASURE_LABELS[measure]} of each method's scores against the true circuit; cell = mean over "
               "a task's seeds [percentile bootstrap interval when there are two or more]; n/a: not applicable "
               "(the report says why). Right panel: published edge ROC AUCs on other models, for scale only.")
    prov = provenance(figure="benchmark_score_table", measure=measure, level=level, benchmark_version=report.get("version"),
                      quick=report.get("quick"), settings=report.get("settings"))
    return FigureBundle(f"benchmark-{LEVEL_SLUGS[level]}-{measure.replace('_', '-')}", fig, tuple(data), prov, caption,
                        paper_size=(260 + 120 * len(x), height))


def roc_points(scores: Sequence, truth_heads: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(false positive rate, true positive rate) of per-head scores [layer, head] against the true heads' names."""
    values = np.asarray(scores, dtype=np.float64)
    truth = np.zeros(values.shape, dtype=bool)
    for layer, head in parse_heads(", ".join(truth_heads)):
        truth[layer, head] = True
    fpr, tpr, _ = roc_curve(truth.ravel(), values.ravel(), drop_intermediate=False)
    return fpr, tpr


def roc_figure(report: dict, models: Sequence[str] | None = None) -> FigureBundle:
    """One panel per model: each applicable method's ROC curve over the heads, AUC in the legend, chance dashed."""
    results = [r for r in report["results"] if models is None or r["case"]["name"] in models]
    if not results:
        raise HeadLabError("no model of the report to draw; name models the benchmark ran.")
    cols = min(3, len(results))
    n_rows = -(-len(results) // cols)
    fig = make_subplots(rows=n_rows, cols=cols, subplot_titles=[r["case"]["name"] for r in results],
                        horizontal_spacing=0.08, vertical_spacing=0.12)
    colors = {m["name"]: METHOD_COLORS[i % len(METHOD_COLORS)] for i, m in enumerate(report["methods"])}
    styles = {m["name"]: dict(dash=METHOD_DASHES[i % len(METHOD_DASHES)], width=max(1.5, 5 - 0.5 * i))
              for i, m in enumerate(report["methods"])}
    data, shown = [], set()
    for index, result in enumerate(results):
        row, col = index // cols + 1, index % cols + 1
        truth = result["case"]["truth"]
        for entry in result["methods"]:
            if entry.get("scores") is None:
                continue
            fpr, tpr = roc_points(entry["scores"], truth)
            auc = entry["recovery"]["roc_auc"]["value"]
            name = entry["method"]
            fig.add_trace(go.Scatter(x=fpr, y=tpr, mode="lines", line=dict(color=colors.get(name), **styles.get(name, {})),
                                     name=name, legendgroup=name, showlegend=name not in shown,
                                     hovertemplate=f"{name}<br>AUC {auc:.3f}<br>FPR %{{x:.2f}}, TPR %{{y:.2f}}<extra></extra>"),
                          row=row, col=col)
            shown.add(name)
            data += [{"model": result["case"]["name"], "method": name, "fpr": float(f), "tpr": float(t), "auc": auc}
                     for f, t in zip(fpr, tpr)]
        fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", line=dict(color="#999", dash="dash", width=1),
                                 showlegend=False, hoverinfo="skip"), row=row, col=col)
        fig.update_xaxes(range=[0, 1], title_text="false positive rate" if row == n_rows else None, row=row, col=col)
        fig.update_yaxes(range=[0, 1.02], title_text="true positive rate" if col == 1 else None, row=row, col=col)
    fig.update_layout(template=SCREEN, height=330 * n_rows + 110, margin=dict(t=110),
                      title="ROC curves over heads, per known model")
    caption = ("each method's ROC curve over the heads of one known model (tied scores form one step, so a "
               "constant score is the diagonal); dashed: chance.")
    prov = provenance(figure="benchmark_roc", models=[r["case"]["name"] for r in results],
                      benchmark_version=report.get("version"), quick=report.get("quick"))
    return FigureBundle("benchmark-roc", fig, tuple(data), prov, caption, paper_size=(300 * cols + 160, 300 * n_rows + 140))
