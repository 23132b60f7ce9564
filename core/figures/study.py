"""Figures of a real model's study report (`python -m core study`), drawn from the report's JSON alone."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from core.figures.bundle import FigureBundle
from core.figures.theme import LAYER_COLORS, SCREEN

SMALL = (480, 360)  # paper size of the committed PNGs: small files


def head_map(values: list, title: str, colour_label: str, name: str, caption: str, provenance: dict,
             signed: bool = False) -> FigureBundle:
    """A [layer, head] heatmap of one per-head figure (signed: a diverging scale centred on 0)."""
    grid = np.asarray(values, dtype=np.float64)
    n_layers, n_heads = grid.shape
    limit = float(np.nanmax(np.abs(grid))) or 1.0
    fig = go.Figure(go.Heatmap(z=grid, x=list(range(n_heads)), y=list(range(n_layers)),
                               colorscale="RdBu" if signed else "Viridis", reversescale=signed,
                               zmin=-limit if signed else None, zmax=limit if signed else None,
                               colorbar=dict(title=dict(text=colour_label))))
    fig.update_xaxes(title_text="head", dtick=1)
    fig.update_yaxes(title_text="layer", autorange="reversed")
    fig.update_layout(template=SCREEN, title=title, height=max(360, 14 * n_layers + 120))
    rows = tuple({"layer": l, "head": h, "value": float(grid[l, h])} for l in range(n_layers) for h in range(n_heads))
    return FigureBundle(name, fig, rows, provenance, caption, paper_size=SMALL)


def curves_figure(curves: dict, title: str, name: str, caption: str, provenance: dict) -> FigureBundle:
    """Faithfulness against the fraction of edges kept, per method: the top edges by |score| (CMD's curve, solid)
    and by signed score (CPR's curve, dashed, when the record has it) (log x, MIB's fractions)."""
    fig = go.Figure()
    rows = []
    for i, (method, c) in enumerate(curves.items()):
        color = LAYER_COLORS[i % len(LAYER_COLORS)]
        fig.add_trace(go.Scatter(x=c["fractions"], y=c["faithfulness"], mode="lines+markers", showlegend=True,
                                 line=dict(color=color), name=f"{method} by |score| (CMD {c['cmd']:.2f})"))
        signed = c.get("faithfulness_signed") or []
        if signed:
            fig.add_trace(go.Scatter(x=c["fractions"], y=signed, mode="lines+markers", showlegend=True,
                                     line=dict(color=color, dash="dash"), name=f"{method} by signed score (CPR {c['cpr']:.2f})"))
        rows += [{"method": method, "fraction": f, "faithfulness": v, "faithfulness_signed": signed[j] if signed else None}
                 for j, (f, v) in enumerate(zip(c["fractions"], c["faithfulness"]))]
    for level in (0.0, 1.0):
        fig.add_hline(y=level, line_color="#999", line_width=1, line_dash="dot")
    fig.update_xaxes(title_text="fraction of edges kept", type="log")
    fig.update_yaxes(title_text="faithfulness (full model 1)")
    fig.update_layout(template=SCREEN, title=title, height=400, legend=dict(orientation="h", y=-0.25))
    return FigureBundle(name, fig, tuple(rows), provenance, caption, paper_size=SMALL)


def study_figures(report: dict) -> list[FigureBundle]:
    """The report's figures: induction selectivity under both probes, or patching, roles and faithfulness (IOI)."""
    prov = {"model": report["model"], "revision": report["revision"], "task": report["task"],
            "settings": report["settings"]}
    model = report["model"]
    bundles = []
    if "induction" in report:
        for task in ("induction", "induction-repeat"):
            sel = report["induction"][f"screen_{task}"]["membership_selectivity"]["induction"]
            bundles.append(head_map(np.log10(np.maximum(np.asarray(sel), 1e-3)).tolist(),
                                    f"{model}: induction selectivity, {task} probe (log10, x uniform)",
                                    "log10 x", f"study-{task}-selectivity",
                                    f"induction selectivity per head under the {task} probe", prov))
    if "ioi" in report:
        ioi = report["ioi"]
        bundles.append(head_map(ioi["patching"]["scores"], f"{model}: IOI activation patching (top heads exact)",
                                "score", "study-ioi-patching", "denoising patching score per head (clean 1, "
                                "corrupted 0); heads outside the top-k carry attribution's estimate", prov, signed=True))
        roles = ioi.get("roles")
        if roles:
            bundles.append(head_map(roles["direct_effect"], f"{model}: direct effect on the logit difference",
                                "logit diff", "study-ioi-direct-effect",
                                "each head's write at END through the frozen final norm, on W_U[IO] - W_U[S]", prov,
                                signed=True))
        curves = {m: ioi[f"edges_{m}"]["curve"] for m in ("eap", "eap-ig") if "curve" in ioi.get(f"edges_{m}", {})}
        if "random_edges" in ioi:
            curves["random"] = ioi["random_edges"]
        if curves:
            bundles.append(curves_figure(curves, f"{model}: IOI faithfulness at MIB's edge fractions", "study-ioi-faithfulness",
                                     "faithfulness of the top edges (other edges patched from the ABC prompts)", prov))
    return bundles
