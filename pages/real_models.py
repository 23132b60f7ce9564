"""Real models: the committed circuit reports of pretrained models (`python -m core study`, issue 42).

Reads docs/real-models/*/report.json and the report.md generated from it (core/cli/study.py) and draws
them: the headline figures, the report's figures redrawn from the JSON (core/figures/study.py) and its
tables. Nothing here runs a model; a report is regenerated with the command each report names.
"""

import json
from pathlib import Path

import streamlit as st

from core.figures.study import study_figures
from pages._widgets import show_figure

REPO = Path(__file__).resolve().parents[1]
REPORTS_DIR = REPO / "docs" / "real-models"
REPORT_CHOICE = "real_models_report"


def committed_reports(folder: Path = REPORTS_DIR) -> dict[str, Path]:
    """{report folder name: its folder} for every folder of `folder` holding a report.json, sorted by name."""
    if not folder.is_dir():
        return {}
    return {path.name: path for path in sorted(folder.iterdir()) if (path / "report.json").is_file()}


def without_figure_links(markdown: str) -> str:
    """The report's Markdown less its "## Figures" section (links to PNG files; the page draws the figures)."""
    lines, keep = [], True
    for line in markdown.splitlines():
        if line.startswith("## "):
            keep = line.strip() != "## Figures"
        if keep:
            lines.append(line)
    return "\n".join(lines)


def headline(report: dict) -> None:
    """The few figures a reader looks for first, as metrics."""
    if "ioi" in report:
        ioi = report["ioi"]
        ld = ioi["logit_diff"]
        cols = st.columns(4)
        cols[0].metric("Logit difference (IO - S)", f"{ld['clean_mean']:.3f}")
        cols[1].metric("IO beats S", f"{100 * ld['share_io_beats_s']:.1f}%")
        curve = ioi.get("edges_eap", {}).get("curve")
        cols[2].metric("EAP CPR / CMD", f"{curve['cpr']:.2f} / {curve['cmd']:.2f}" if curve else "not measured")
        stability = ioi.get("stability")
        cols[3].metric("Top-edge Jaccard", f"{stability['mean_pairwise_jaccard']:.2f}" if stability else "not measured")
    if "induction" in report:
        ind = report["induction"]
        ablation = ind["ablation"]
        cols = st.columns(3)
        cols[0].metric("Candidate heads", len(ind["candidate"]))
        cols[1].metric("Repeat loss", f"{ablation['loss_clean']:.3f}")
        cols[2].metric("With the candidate ablated", f"{ablation['loss_ablated']:.3f}")


st.title("Real models")
st.caption("Circuit studies of pretrained models (quantized GGUF weights, dequantized), committed under "
           "docs/real-models/ by `python -m core study MODEL --task induction|ioi --out docs/real-models/NAME`. "
           "Published figures of other models are context, never mixed into these measurements.")
reports = committed_reports()
if not reports:
    st.info(f"No report under {REPORTS_DIR}: run `python -m core study smollm2-135m --task ioi --quick --out "
            "docs/real-models/smollm2-135m-ioi` to make one.")
    st.stop()
name = st.selectbox("Report", list(reports), key=REPORT_CHOICE)
folder = reports[name]
try:
    report = json.loads((folder / "report.json").read_text())
    markdown = (folder / "report.md").read_text()
except (OSError, ValueError) as exc:
    st.error(f"{folder.name}'s report cannot be read ({exc}); regenerate it with `python -m core study` and --out "
             f"{folder}.")
    st.stop()
headline(report)
for bundle in study_figures(report):
    show_figure(bundle, key=f"real_{name}_{bundle.name}")
st.markdown(without_figure_links(markdown))
