"""`python -m core.cli.planted`: the planted-circuit models' confirmation figures and JSON for the docs.

Apart from core/zoo/known/planted.py (which trains and confirms) because it draws figures and stamps the
benchmarks' machine record, both above the zoo in HeadLab's layers.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from core.cli.bench import machine_record
from core.figures._style import _grid_axes
from core.figures.bundle import figure_bytes
from core.figures.theme import CANDIDATE_COLOR, CONTROL_COLOR, SCREEN
from core.errors import HeadLabError
from core.heads import parse_heads
from core.model.refs import zoo_model_dir
from core.results import package_versions
from core.workspace import atomic_write_bytes, atomic_write_json
from core.zoo.known.planted import PLANTED, RULE, RULE_TEXT, planted_status


def confirmation_figure(record: dict) -> go.Figure:
    """Every head's patching effect, denoising and noising side by side (layer x head grids), the circuit
    outlined in orange, the decoys dashed grey; the title says confirmed or failed."""
    denoise = np.asarray(record["patching"]["denoise"]["scores"], dtype=np.float64)
    noise = 1.0 - np.asarray(record["patching"]["noise"]["scores"], dtype=np.float64)
    n_layers, n_heads = denoise.shape
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("denoising: score", "noising: 1 - score"))
    for col, values in ((1, denoise), (2, noise)):
        fig.add_trace(go.Heatmap(z=values.tolist(), x=list(range(n_heads)), y=list(range(n_layers)), zmin=-1, zmax=1,
                                 colorscale="RdBu_r", showscale=col == 2, colorbar=dict(title="effect"),
                                 text=[[f"{v:.2f}" for v in row] for row in values], texttemplate="%{text}",
                                 hovertemplate="L%{y}H%{x}: %{z:.3f}<extra></extra>"), row=1, col=col)
        _grid_axes(fig, n_layers, n_heads, row=1, col=col)
        for heads, color, dash in ((record["circuit"], CANDIDATE_COLOR, "solid"), (record["distractors"], CONTROL_COLOR, "dash")):
            for layer, head in parse_heads(",".join(heads)) if heads else ():
                fig.add_shape(type="rect", x0=head - 0.46, x1=head + 0.46, y0=layer - 0.46, y1=layer + 0.46,
                              line=dict(color=color, width=3, dash=dash), row=1, col=col)
    verdict = "confirmed" if record["confirmed"] else "FAILED"
    fig.update_layout(template=SCREEN, height=320, width=760, margin=dict(t=80),
                      title=f"{record['name']}: {verdict} (circuit {', '.join(record['circuit'])}; decoy "
                            f"{', '.join(record['distractors']) or 'none'})")
    return fig


def export_confirmations(folders: list[Path], json_path: Path, image_dir: Path) -> dict:
    """Write the confirmation records of built planted models as one JSON (with the machine record) and one
    PNG figure each (image_dir/planted-....png, kaleido); returns the JSON written."""

    models = []
    for folder in folders:
        record = planted_status(Path(folder))
        if record is None:
            raise HeadLabError(f"{folder} holds no built planted model; build it first (python -m core known --build).")
        image = Path(image_dir) / f"{record['name']}.png"
        atomic_write_bytes(image, figure_bytes(confirmation_figure(record), "png", size=(760, 320)))
        models.append({**record, "figure": str(image)})
    summary = {
        "what": "planted-circuit models (core/zoo/known/planted.py): training time and the confirmation of each",
        "rule": dict(RULE), "rule_text": RULE_TEXT,
        "confirmed": sum(m["confirmed"] for m in models), "models_total": len(models),
        "train_seconds_total": round(sum(m["train_seconds"] for m in models), 2),
        "machine": machine_record(), "versions": package_versions(), "models": models,
    }
    atomic_write_json(Path(json_path), summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    """python -m core.cli.planted [--build] [--export DOCS]: train the registered models, write their figures."""
    parser = argparse.ArgumentParser(prog="python -m core.cli.planted", description=main.__doc__)
    parser.add_argument("--build", action="store_true", help="train and confirm every registered planted model")
    parser.add_argument("--export", type=Path, metavar="DOCS",
                        help="write DOCS/measurements/planted-confirmation.json and DOCS/images/planted-*.png")
    args = parser.parse_args(argv)
    folders = []
    for name, build in PLANTED.items():
        folder = build(progress=True) if args.build else zoo_model_dir(name)
        folders.append(folder)
        record = planted_status(folder)
        state = "not built" if record is None else ("confirmed" if record["confirmed"] else "FAILED: " + "; ".join(record["failures"]))
        print(f"{name}: {state}")
    if args.export is not None:
        export_confirmations(folders, args.export / "measurements" / "planted-confirmation.json", args.export / "images")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
