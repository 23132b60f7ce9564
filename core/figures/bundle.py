"""Plotly figure builders shared by the app's pages and the headless CLI export.

Builders take results (arrays, ScreenReport, AblationResult) and return a `FigureBundle`: the
figure in the screen theme, its data as rows, and its provenance. Pages draw the figure and offer
the exports; `python -m core export` writes the same bundles. `paper_version` restyles any figure
for print, and `export_figure` writes PNG/SVG/PDF through kaleido (Debian's chromium) plus the
data as CSV and JSON with provenance.

Grids of heads are indexed [layer, head]: x = head, y = layer (layer 0 at the top). Grids that a
page lets the user click carry a "picker" trace (square markers, customdata = "L{l}H{h}"), because
plotly heatmaps emit no selection events; `paper_version` drops invisible pickers.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import math
import os
import shutil
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from core.figures.theme import (CANDIDATE_COLOR, CLASS_COLORS, CLASS_SHORT, CONTROL_COLOR, FADED, LAYER_COLORS,
                          PAPER, PAPER_HEIGHT, PAPER_SCALE, PAPER_WIDTH, SCREEN, SELECTIVITY_SCALE,
                          UPPER_BOUND_COLOR)
from core.errors import HeadLabError
from core.heads import head_name
from core.workspace import atomic_write_bytes

IMAGE_FORMATS = ("png", "svg", "pdf")
DATA_FORMATS = ("csv", "json")
PICKER = "picker"  # trace meta of the invisible click targets on heatmaps
SELECTIVITY_FLOOR = 1e-3  # log scale: selectivity below this is drawn at this value
GRID_CELL_PX = 40  # one head's square in a pickable grid

Head = tuple[int, int]


# ---------------------------------------------------------------------------------------------
# bundles, themes, export


@dataclass(frozen=True, eq=False)
class FigureBundle:
    """What a page draws and an export writes: figure (screen theme), data rows, provenance.

    name: file stem for exports ("spectral-pr-trajectories"); caption: one line naming the variant.
    """

    name: str
    figure: go.Figure
    rows: tuple[dict, ...]
    provenance: dict
    caption: str = ""
    paper_size: tuple[int, int] = (PAPER_WIDTH, PAPER_HEIGHT)

    def csv_bytes(self) -> bytes:
        return rows_to_csv(self.rows)

    def json_bytes(self) -> bytes:
        return json_bytes(self.rows, self.provenance)

    def image_bytes(self, fmt: str) -> bytes:
        return figure_bytes(self.figure, fmt, size=self.paper_size)


def package_versions() -> dict:
    """Versions that can change the numbers, read without importing the heavy packages."""
    from importlib.metadata import PackageNotFoundError, version

    import core

    out = {"headlab": getattr(core, "__version__", "unknown")}
    for package in ("torch", "transformers", "transformer-lens", "numpy", "plotly"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "absent"
    return out


def provenance(**fields_: Any) -> dict:
    """A provenance record: the caller's fields plus package versions."""
    out = {k: v for k, v in fields_.items() if v is not None}
    out["versions"] = package_versions()
    return out


def _ensure_browser() -> None:
    """Point kaleido at Debian's chromium; it never downloads a browser."""
    if os.environ.get("BROWSER_PATH"):
        return
    for candidate in ("/usr/bin/chromium", shutil.which("chromium") or "", shutil.which("chromium-browser") or ""):
        if candidate and Path(candidate).exists():
            os.environ["BROWSER_PATH"] = candidate
            return
    raise HeadLabError("figure export needs Debian's chromium: run `apt-get install chromium` (make app does it).")


_KALEIDO_LOCK = threading.Lock()
_KALEIDO_STARTED = False


def _kaleido_server() -> None:
    """Start kaleido's persistent browser once per process: later exports take ~0.2 s, not ~3 s."""
    global _KALEIDO_STARTED
    if _KALEIDO_STARTED:
        return
    import atexit

    import kaleido

    kaleido.start_sync_server(silence_warnings=True)
    atexit.register(kaleido.stop_sync_server, silence_warnings=True)
    _KALEIDO_STARTED = True


def screen_version(fig: go.Figure) -> go.Figure:
    fig.update_layout(template=SCREEN)
    return fig


def paper_version(fig: go.Figure, width: int = PAPER_WIDTH, height: int = PAPER_HEIGHT) -> go.Figure:
    """A copy restyled for print: white, serif, no gridlines, print size, no click targets."""
    out = go.Figure(copy.deepcopy(fig))
    out.data = tuple(trace for trace in out.data if getattr(trace, "meta", None) != PICKER)
    out.update_layout(template=PAPER, width=width, height=height, dragmode=False)
    out.update_xaxes(showgrid=False)
    out.update_yaxes(showgrid=False)
    return out


def figure_bytes(fig: go.Figure, fmt: str, paper: bool = True,
                 size: tuple[int, int] = (PAPER_WIDTH, PAPER_HEIGHT)) -> bytes:
    """PNG (high resolution), SVG or PDF bytes of a figure, for download buttons and export."""
    if fmt not in IMAGE_FORMATS:
        raise HeadLabError(f"unknown image format '{fmt}'; use one of {', '.join(IMAGE_FORMATS)}.")
    _ensure_browser()
    target = paper_version(fig, *size) if paper else fig
    scale = PAPER_SCALE if fmt == "png" else 1
    with _KALEIDO_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "kopts ignored when using a server"
        try:
            _kaleido_server()
            return target.to_image(format=fmt, scale=scale)
        except Exception as exc:  # a broken or missing browser: say what to do
            raise HeadLabError(
                f"figure export failed ({type(exc).__name__}: {str(exc)[:160]}); check that Debian's chromium "
                "runs (`chromium --headless --version`) or reinstall it with `apt-get install chromium`."
            ) from None


def rows_to_csv(rows: Sequence[dict]) -> bytes:
    if not rows:
        return b""
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue().encode()


def json_bytes(rows: Sequence[dict], provenance: dict) -> bytes:
    return json.dumps({"provenance": provenance, "data": list(rows)}, indent=2, default=_json_default).encode()


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"cannot write {type(obj).__name__} as JSON")


def export_figure(fig: go.Figure, out_stem: Path, rows: Sequence[dict], provenance: dict,
                  formats: Sequence[str] = IMAGE_FORMATS,
                  size: tuple[int, int] = (PAPER_WIDTH, PAPER_HEIGHT)) -> list[Path]:
    """Write `<stem>.png/.svg/.pdf` (paper theme) plus `<stem>.csv` and `<stem>.json` (data + provenance)."""
    out_stem = Path(out_stem)
    written = []
    for fmt in formats:
        path = out_stem.with_suffix(f".{fmt}")
        atomic_write_bytes(path, figure_bytes(fig, fmt, size=size))
        written.append(path)
    csv_path = out_stem.with_suffix(".csv")
    atomic_write_bytes(csv_path, rows_to_csv(rows))
    json_path = out_stem.with_suffix(".json")
    atomic_write_bytes(json_path, json_bytes(rows, provenance))
    return written + [csv_path, json_path]


def export_bundle(bundle: FigureBundle, out_dir: Path, prefix: str = "",
                  formats: Sequence[str] = IMAGE_FORMATS) -> list[Path]:
    """Write one bundle as `<out_dir>/<prefix><name>.*`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return export_figure(bundle.figure, out_dir / f"{prefix}{bundle.name}", bundle.rows, bundle.provenance,
                         formats, bundle.paper_size)


# ---------------------------------------------------------------------------------------------
# small helpers


def _log10(values: np.ndarray) -> np.ndarray:
    return np.log10(np.maximum(np.nan_to_num(np.asarray(values, dtype=np.float64), nan=SELECTIVITY_FLOOR),
                               SELECTIVITY_FLOOR))


def _log_ticks(lo: float, hi: float, marks: Iterable[float] = ()) -> tuple[list[float], list[str]]:
    """Tick positions (log10) and labels "30x" for a log colour bar from 10**lo to 10**hi.

    The marks (thresholds, null floor) are always labelled; a decade too close to a mark is left out.
    """
    marked = [float(v) for v in marks if v and v > 0 and lo <= math.log10(v) <= hi]
    decades = [v for v in (0.001, 0.01, 0.1, 1, 10, 100, 1000, 10_000, 100_000) if lo <= math.log10(v) <= hi]
    values = set(marked) | {v for v in decades if all(abs(math.log10(v) - math.log10(m)) > 0.35 for m in marked)}
    ordered = sorted(values)
    return [math.log10(v) for v in ordered], [f"{v:.3g}x" if v < 1000 else f"{v:.0f}x" for v in ordered]


def _grid_axes(fig: go.Figure, n_layers: int, n_heads: int, row: int | None = None, col: int | None = None) -> None:
    """Head grid axes: x = head, y = layer (layer 0 on top), fixed (a drag selects, it never pans).

    The drag mode is left to Streamlit: a click selects a head (shift-click adds), and the chart's
    toolbar switches to box or lasso selection.
    """
    kw = {} if row is None else {"row": row, "col": col}
    fig.update_xaxes(title_text="head", tickmode="array", tickvals=list(range(n_heads)),
                     range=[-0.5, n_heads - 0.5], showgrid=False, zeroline=False, fixedrange=True, **kw)
    fig.update_yaxes(title_text="layer", tickmode="array", tickvals=list(range(n_layers)),
                     range=[n_layers - 0.5, -0.5], showgrid=False, zeroline=False, fixedrange=True, **kw)


def _grid_height(n_layers: int, minimum: int = 300) -> int:
    return max(minimum, int(140 + GRID_CELL_PX * max(n_layers, 2)))


def _legend_on_top(fig: go.Figure) -> go.Figure:
    """A horizontal legend between the title and the plot, clear of the axis titles below."""
    fig.update_layout(legend=dict(orientation="h", x=0, xanchor="left", y=1.0, yanchor="bottom",
                                  bgcolor="rgba(255,255,255,0)"),
                      title=dict(y=0.98, yanchor="top"), margin=dict(t=95))
    return fig


def _hline_log(fig: go.Figure, value: float, label: str, dash: str = "solid", right: bool = False) -> None:
    """A labelled horizontal line on a log y axis (plotly places the line in data units, its label in log10)."""
    fig.add_hline(y=float(value), line_dash=dash, line_color="#444", line_width=1)
    fig.add_annotation(x=1 if right else 0, xref="paper", xanchor="right" if right else "left",
                       y=math.log10(max(float(value), SELECTIVITY_FLOOR)), yref="y", yanchor="bottom",
                       text=label, showarrow=False, font=dict(size=10))


def picker_trace(n_layers: int, n_heads: int, hover: np.ndarray | None = None) -> go.Scatter:
    """Invisible square markers on every cell of a [layer, head] grid: click/box/lasso targets."""
    layers, heads = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")
    names = [head_name((int(l), int(h))) for l, h in zip(layers.ravel(), heads.ravel())]
    text = names if hover is None else [f"{n}: {t}" for n, t in zip(names, np.asarray(hover).ravel())]
    return go.Scatter(
        x=heads.ravel().tolist(), y=layers.ravel().tolist(), mode="markers", name="pick", meta=PICKER,
        # transparent colour, not opacity 0: plotly ignores fully transparent (opacity 0) points for clicks
        # small: hover and clicks go to the nearest cell centre whatever size the heatmap is drawn at
        marker=dict(symbol="square", size=8, color="rgba(255,255,255,0.004)", line=dict(width=0)),
        selected=dict(marker=dict(color="rgba(255,255,255,0.004)")),
        unselected=dict(marker=dict(color="rgba(255,255,255,0.004)")),
        customdata=names, text=text, hovertemplate="%{text}<extra></extra>", showlegend=False,
    )


def heads_from_points(points: Iterable[dict]) -> list[Head]:
    """Heads named by selection points (customdata "L1H3", or x = head, y = layer on a grid)."""
    from core.heads import parse_heads

    out: list[Head] = []
    for point in points or ():
        data = point.get("customdata")
        if isinstance(data, (list, tuple)):
            data = data[0] if data else None
        if isinstance(data, str) and data:
            out.extend(parse_heads(data).heads)
    return sorted(set(out))


def token_label(token: int) -> str:
    """A byte token as a short readable label: printable characters, \\xNN, or <bos>/<pad>/<eos>/<sep>."""
    specials = {256: "<bos>", 257: "<pad>", 258: "<eos>", 259: "<sep>"}
    token = int(token)
    if token in specials:
        return specials[token]
    if 33 <= token < 127:
        return chr(token)
    if token == 32:
        return "␣"
    return f"\\x{token:02x}" if 0 <= token < 256 else str(token)


# ---------------------------------------------------------------------------------------------
# Step 1: the spectral signal


def _pr_label(definition: str) -> str:
    return {"entropy": "PR (entropy effective rank, uncentered)",
            "classic": "PR (classic participation ratio, centered)"}.get(definition, f"PR ({definition})")


def pr_trajectories(spectral: Any, model: str, probe_spec: dict, highlight: Iterable[Head] = (),
                    current_tokens: float | None = None) -> FigureBundle:
    """PR of every head over log training tokens: one line per head, coloured by layer.

    spectral: core.spectral.SpectralResult (pr [checkpoint, layer, head], tokens [checkpoint]).
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


# ---------------------------------------------------------------------------------------------
# Step 2: the pattern screen


def selectivity_heatmap(sel: np.ndarray, pattern: str, model: str, probe_spec: dict, revision: str,
                        tokens: float | None = None, class_threshold: float = 30.0,
                        noise_floor: float | None = None, baseline: str = "random",
                        membership: np.ndarray | None = None, induction_threshold: float | None = None,
                        membership_baseline: str = "uniform") -> FigureBundle:
    """One pattern's selectivity [layer, head] on a log colour scale, thresholds and null floor marked.

    Colour = log10 selectivity; ○ = at least the class threshold (30x); ★ = an induction-circuit member
    (induction only: `membership` [layer, head], the induction selectivity against the membership
    baseline, at least `induction_threshold`); × = at or below the null floor (induction only).
    customdata of the heatmap holds the raw selectivity (what core returned).
    """
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
    when = f"{revision}" + (f", {tokens:.3g} tokens" if tokens and tokens > 0 else "")
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
    fig.update_xaxes(tickmode="array", tickvals=list(range(n_layers)))
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
    from core.stats.selectivity import classify

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


# ---------------------------------------------------------------------------------------------
# The ablation lab


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
    if is_sel.any():  # a visible mark that survives the theme and print
        fig.add_trace(go.Scatter(x=flat_h[is_sel].tolist(), y=flat_l[is_sel].tolist(), mode="markers",
                                 name=f"selected ({int(is_sel.sum())})", hoverinfo="skip",
                                 marker=dict(symbol="x-thin", size=12, line=dict(width=2.5, color="white"))))
    margin = dict(l=60, r=150, t=50, b=55)  # r: room for the colour bar
    width = margin["l"] + margin["r"] + cell * n_heads
    height = margin["t"] + margin["b"] + cell * n_layers
    fig.update_layout(template=SCREEN, title=dict(text=title, font=dict(size=13)), height=height, width=width,
                      showlegend=False, margin=margin)
    _grid_axes(fig, n_layers, n_heads)
    rows = tuple({"layer": int(l), "head": int(h), "head_name": n, "value": float(v), "selected": bool(s)}
                 for l, h, n, v, s in zip(flat_l, flat_h, names, values.ravel(), is_sel))
    prov = provenance(figure="head_grid", model=model, revision=revision, value=value_label,
                      selected=[head_name(h) for h in sorted(selected)])
    return FigureBundle("ablation-head-grid", fig, rows, prov,
                        "click a head (shift-click adds more), or pick Box / Lasso Select in the chart's toolbar "
                        "and drag; outlined heads are selected.",
                        (PAPER_WIDTH, max(220, 60 * n_layers + 100)))


def _metric_label(metric: str) -> str:
    return {"loss": "Δ loss (nats)", "top1": "Δ top-1", "top5": "Δ top-5", "target_logit": "Δ target logit"}.get(metric, metric)


def ablation_strip(result: Any, model: str, revision: str, metrics: Sequence[str] | None = None) -> FigureBundle:
    """Per metric: the control deltas as a strip, the candidate delta and the upper bound, with the z-score.

    result: core.ablation.engine.AblationResult (stats[metric] holds candidate_delta, control_deltas, z, ...).
    """
    metrics = [m for m in (metrics or result.stats.keys()) if m in result.stats]
    titles = []
    for m in metrics:
        z = result.stats[m].get("z")
        titles.append(f"{m}: z = {z:+.3g}" if z is not None else m)
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=titles, horizontal_spacing=0.08)
    rng = np.random.RandomState(0)  # fixed jitter: the same picture every time
    rows = []
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
        fig.add_hline(y=0, line_color="#999", line_width=1, row=1, col=i)
        fig.update_xaxes(tickmode="array", tickvals=ticks, ticktext=labels, range=[-0.5, ticks[-1] + 0.5],
                         showgrid=False, row=1, col=i)
        fig.update_yaxes(title_text=_metric_label(metric), row=1, col=i)
        rows += [{"metric": metric, "condition": f"control {j}", "delta": float(d), "z": entry.get("z")}
                 for j, d in enumerate(controls)]
        rows.append({"metric": metric, "condition": "candidate", "delta": float(entry["candidate_delta"]),
                     "ci_low": entry["candidate_ci"][0], "ci_high": entry["candidate_ci"][1], "z": entry.get("z"),
                     "p": entry.get("p")})
        if entry.get("upper_bound_delta") is not None:
            rows.append({"metric": metric, "condition": "upper bound", "delta": float(entry["upper_bound_delta"])})
    n_ctrl = len(result.controls)
    fig.update_annotations(font_size=12)
    fig.update_xaxes(tickangle=0)
    fig.update_layout(template=SCREEN, height=400,
                      title=f"ablating {result.selection} ({result.mode}) vs {n_ctrl} {result.control_sets.kind} controls")
    _legend_on_top(fig)
    fig.update_layout(margin=dict(t=120), legend=dict(y=1.12))  # room for the subplot titles
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
    from core.ablation.engine import DAMAGE_SIGN

    sign = DAMAGE_SIGN[metric]
    cand = sign * result.candidate.delta(result.clean, metric)  # [example]
    if result.controls:
        ctrl = sign * np.mean([c.delta(result.clean, metric) for c in result.controls], axis=0)  # [example]
    else:
        ctrl = np.zeros_like(cand)
    order = np.argsort(-cand, kind="stable")
    if top:
        order = order[:top]
    ex = [int(i) for i in order]
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


def worst_examples(result: Any, metric: str = "loss", n: int = 5) -> list[int]:
    """The probe examples the candidate ablation hurt most on `metric`."""
    from core.ablation.engine import DAMAGE_SIGN

    damage = DAMAGE_SIGN[metric] * result.candidate.delta(result.clean, metric)
    return [int(i) for i in np.argsort(-damage, kind="stable")[:n]]


# ---------------------------------------------------------------------------------------------
# The head inspector


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
    fig.update_layout(template=SCREEN, height=340, title=title, yaxis_title="selectivity (log)", showlegend=False,
                      margin=dict(t=80))
    fig.update_yaxes(type="log", dtick=1)
    rows = tuple({"head_name": head_name(head), "pattern": p, "selectivity": float(v)} for p, v in zip(patterns, values))
    if membership is not None:
        rows += ({"head_name": head_name(head), "pattern": f"induction membership ({membership_baseline})",
                  "selectivity": float(membership)},)
    prov = provenance(figure="head_scores", model=model, revision=revision, head=head_name(head),
                      class_threshold=class_threshold, induction_threshold=induction_threshold,
                      membership_baseline=membership_baseline, noise_floor=noise_floor)
    return FigureBundle(f"inspector-{head_name(head)}-scores", fig, rows, prov,
                        "the null floor applies to induction selectivity.")


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


# ---------------------------------------------------------------------------------------------
# figure sets for the CLI export (the pages draw the same builders one by one)


def spectral_bundles(report: Any, highlight: Iterable[Head] = ()) -> list[FigureBundle]:
    """Step 1 figures of a core.pipelines.recipe.ScreenReport."""
    highlight = tuple(highlight) or tuple(report.spectral.top_heads)
    return [pr_trajectories(report.spectral, report.model, report.probe_spec, highlight),
            pr_integral_ranking(report.spectral, report.model, report.probe_spec)]


def screen_bundles(report: Any, checkpoint_index: int = -1, patterns: Sequence[str] | None = None,
                   here: Any = None) -> list[FigureBundle]:
    """Step 2 figures of a ScreenReport at one checkpoint: a heatmap and strip per pattern, the class map, fractions.

    here: that checkpoint's ScreenResult (membership and null floor); the report's final one by default
    when the checkpoint is the final one.
    """
    from core.stats.selectivity import classify

    names = tuple(report.final.patterns)
    index = checkpoint_index % len(report.checkpoints)
    ckpt = report.checkpoints[index]
    sel = report.selectivity_by_checkpoint[index]  # [pattern, layer, head]
    if here is None and index == len(report.checkpoints) - 1:
        here = report.final
    floor = None if here is None or here.noise_floor is None or np.ndim(here.noise_floor) else float(here.noise_floor)
    membership = None if here is None else here.membership
    threshold = report.final.induction_threshold if here is None else here.induction_threshold
    member_baseline = getattr(here if here is not None else report.final, "membership_baseline", "uniform")
    out = []
    for pattern in patterns or names:
        p = names.index(pattern)
        out.append(selectivity_heatmap(sel[p], pattern, report.model, report.probe_spec, ckpt.revision, ckpt.tokens,
                                       report.final.threshold, floor, report.final.baseline, membership, threshold,
                                       member_baseline))
        out.append(selectivity_strip(sel[p], pattern, report.model, report.probe_spec, ckpt.revision,
                                     report.final.threshold, floor))
    out.append(class_map(classify(sel, names, report.final.threshold), report.model, report.probe_spec, ckpt.revision,
                         report.final.threshold))
    out.append(class_fractions_over_training(report.selectivity_by_checkpoint, names, [c.tokens for c in report.checkpoints],
                                             [c.revision for c in report.checkpoints], report.model, report.probe_spec,
                                             report.final.threshold, ckpt.tokens))
    return out


def ablation_bundles(result: Any, model: str, revision: str) -> list[FigureBundle]:
    """The ablation lab's result figures."""
    return [ablation_strip(result, model, revision), per_example_damage(result, model, revision, "loss")]
