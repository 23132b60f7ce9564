"""The replication report: each claim's figures, and the report as Markdown, HTML and JSON.

Above the figures layer (it draws them), so the measuring pipeline (core/pipelines/replicate.py)
stays free of figure code. Writes a self-contained report: Markdown and HTML with the figures,
every number in report.json, each figure's data as CSV/JSON, and the figures as PNG/SVG (through
kaleido and Debian's chromium; when no browser is available the report says so and keeps the
figures as plotly JSON and as interactive plots in report.html).
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional, Sequence

import plotly.io as pio
from markdown_it import MarkdownIt

from core.ablation.study import AblationResult
from core.errors import HeadLabError
from core.figures import dynamics as fd
from core.figures.ablation import ablation_strip
from core.figures.bundle import IMAGE_FORMATS, export_figure
from core.pipelines.attribution_results import AttributionResult
from core.pipelines.dynamics import CrossSeedMatrix, DataShift, FormFunction, Trajectories
from core.pipelines.replicate_claims import NOT_RUN, Claim
from core.results import package_versions
from core.stats.dynamics import Identification
from core.workspace import atomic_write_bytes, atomic_write_json


@dataclass(frozen=True)
class ReplicationReport:
    """A finished replicate run: its claims (with verdicts) and where the report was written."""

    target: str
    preset: str
    claims: tuple[Claim, ...]
    out: Path
    seconds: float
    settings: dict
    figure_note: str = ""
    files: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"report": "HeadLab replication", "target": self.target, "preset": self.preset,
                "command": f"python -m core replicate {self.target} --preset {self.preset} --out {self.out}",
                "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "seconds": round(self.seconds, 2), "settings": self.settings,
                "figures": {"note": self.figure_note, "files": list(self.files)},
                "verdict_counts": _counts([c.verdict for c in self.claims]),
                "claims": [c.to_json() for c in self.claims], "versions": package_versions()}


def _counts(verdicts: Sequence[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in verdicts:
        key = NOT_RUN if v.startswith(NOT_RUN) else v
        out[key] = out.get(key, 0) + 1
    return out


# ---------------------------------------------------------------------------------------------
# figures of each claim, from its stored measurement


def claim_figures(claim_id: str, measured: Optional[dict], artifacts: dict) -> list:
    """The figure bundles of one claim, drawn from its measurement's artifacts ([] when it was not measured)."""
    if measured is None:
        return []
    if claim_id in ("spc-causal", "spc-composition") and artifacts:
        name = next(iter(artifacts))
        result = AblationResult.from_json(artifacts[name])
        bundle = ablation_strip(result, name, str(result.provenance.get("revision", "")))
        return [replace(bundle, caption=f"{name}: " + bundle.caption)]
    if claim_id == "spc-timing" and artifacts:
        name = next(iter(artifacts))
        margin = measured["per_model"][0]["margin"]
        return [fd.timing_figure(Trajectories.from_json(artifacts[name]), margin=margin)]
    if claim_id == "spc-identifiable" and artifacts:
        return [fd.identification_figure([(name, Identification.from_json(data)) for name, data in artifacts.items()])]
    if claim_id == "spc-seed-specific":
        return [fd.cross_seed_figure(CrossSeedMatrix.from_json(artifacts["matrix"]))]
    if claim_id == "spc-data-shift" and artifacts:
        return [fd.data_shift_figure(DataShift.from_json(data)) for data in artifacts.values()]
    if claim_id in ("cvc-dense-closure", "cvc-moe-wrong-direction") and artifacts:
        name = next(iter(artifacts))
        return [fd.closure_splits_figure(name, artifacts[name])]
    if claim_id == "cvc-form-function" and artifacts:
        return [fd.form_function_figure(FormFunction.from_json(next(iter(artifacts.values()))))]
    if claim_id in ("hhg-rho-reverse", "hhg-hero-cost") and artifacts.get("results"):
        return [fd.attribution_ranks_figure(AttributionResult.from_json(artifacts["results"][0]))]
    if claim_id in ("hhg-rho-sort", "hhg-rho-spread") and artifacts.get("summaries"):
        rhos = {task: s["rhos"] for task, s in artifacts["summaries"].items()}
        return [fd.rho_figure(rhos, {"reverse": 0.72, "sort": 0.27})]
    if claim_id == "hhg-layers" and artifacts.get("per_layer"):
        return [fd.attribution_layers_figure(artifacts["per_layer"], ", ".join(measured["tasks"]))]
    return []


# ---------------------------------------------------------------------------------------------
# the report: figures, Markdown, HTML, JSON


class FigureWriter:
    """Writes each figure as data (CSV, JSON with provenance), plotly JSON, and PNG/SVG when a browser
    is available; remembers why images are missing."""

    def __init__(self, folder: Path, formats: Sequence[str] = ("png", "svg")):
        bad = [f for f in formats if f not in IMAGE_FORMATS]
        if bad:
            raise HeadLabError(f"unknown image format(s) {', '.join(bad)}; use some of {', '.join(IMAGE_FORMATS)}.")
        self.folder = Path(folder)
        self.formats = tuple(formats)
        self.images_ok = bool(self.formats)
        self.note = "" if self.formats else "no image formats were asked for."
        self.files: list[str] = []
        self.bundles: dict[str, Any] = {}  # stem -> FigureBundle (for the HTML)

    def write(self, bundle: Any, stem: str) -> list[str]:
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem)
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / stem
        written = [p for p in export_figure(bundle.figure, path, bundle.rows, bundle.provenance, formats=())]
        plotly_path = self.folder / f"{stem}.plotly.json"
        atomic_write_bytes(plotly_path, bundle.figure.to_json().encode())
        written.append(plotly_path)
        if self.images_ok:
            for fmt in self.formats:
                try:
                    data = bundle.image_bytes(fmt)
                except HeadLabError as exc:
                    self.images_ok = False
                    self.note = f"PNG/SVG not written: {exc}"
                    break
                image = self.folder / f"{stem}.{fmt}"
                atomic_write_bytes(image, data)
                written.append(image)
        self.bundles[stem] = bundle
        rel = [str(p.relative_to(self.folder.parent)) for p in written]
        self.files += rel
        return rel


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _figure_stems(claim: Claim) -> list[str]:
    return sorted({Path(f).name.split(".")[0] for f in claim.figures if f.endswith(".plotly.json")})


def report_markdown(report: ReplicationReport, writer: Optional[FigureWriter] = None) -> str:
    """The report as Markdown; figure lines are `![caption](figures/<stem>.svg|png)` or a note."""
    lines = [f"# HeadLab replication report: {report.target} ({report.preset} preset)", "",
             f"Command: `python -m core replicate {report.target} --preset {report.preset} --out {report.out}`. "
             f"Wall time {report.seconds:.1f} s "
             f"({sum(c.reused for c in report.claims)} of {len(report.claims)} claims reused from a previous run). "
             "Every number is in `report.json`; each figure's data is in `figures/*.csv` and `figures/*.json`.", ""]
    probe = report.settings.get("probe_spec", {})
    variants = tuple(dict.fromkeys(c.variant for c in report.claims if c.variant))
    if report.target == "attribution":
        a = report.settings.get("attribution", {})
        mean_text = (f"mean ablation under each variant side by side ({', '.join(variants)}; "
                     "see the finding below)" if variants else f"{a.get('ablation_mode')} ablation")
        setup = (f"Attribution settings [HHG]: gradient variant {a.get('gradient_variant')}, {a.get('n_batches')} OOD "
                 f"batches of {a.get('batch_size')}, {mean_text}, {a.get('n_examples')} evaluation "
                 f"examples, seed {a.get('seed')}, rank-difference threshold {a.get('threshold')} ({a.get('rule')} rule); "
                 "components and layers are counted from 0.")
    else:
        setup = (f"Probe: synthetic induction batch, N = {probe.get('n_examples')}, T = {probe.get('seq_len')}, seed "
                 f"{probe.get('seed')}. Controls: {report.settings.get('n_controls')} matched-random draws per ablation"
                 + (f", {report.settings.get('closure_controls')} per closure test" if report.target == "closure" else "")
                 + f" (seed {report.settings.get('control_seed')}), zero ablation at hook_z.")
    lines += [setup + " Criteria were fixed in `core/pipelines/replicate_claims.py` before the run.", ""]
    excluded = report.settings.get("excluded_induction_seeds") or {}
    if excluded:
        listed = ", ".join(f"{name} (repeated-half loss {loss:g} nats)" for name, loss in excluded.items())
        lines += [f"Left out of every induction claim: {listed}. These seeds never learned induction (final "
                  "repeated-half loss at or above the zoo's 1.0-nat formation target), so they have no induction "
                  "circuit to test; the rule is fixed in `unformed_induction_seeds` before any run.", ""]
    if report.figure_note:
        lines += [f"Figures: {report.figure_note} Each figure is kept as plotly JSON (`figures/*.plotly.json`) and "
                  "drawn interactively in `report.html`.", ""]
    by_id: dict[str, list[Claim]] = {}
    for c in report.claims:
        by_id.setdefault(c.id, []).append(c)
    if variants:
        lines += ["| claim | paper | published | " + " | ".join(variants) + " |", "|---|---|---|" + "---|" * len(variants)]
        for claim_id, measured in by_id.items():
            cells = [f"**{_cell(c.verdict)}**" + ("" if c.measured_text == c.verdict else f": {_cell(c.measured_text)}")
                     for c in measured]  # a claim not run says why once
            lines.append(f"| {claim_id} | {measured[0].paper} | {_cell(measured[0].published)} | " + " | ".join(cells) + " |")
        lines += ["", variant_finding(report.claims), ""]
    else:
        lines += ["| claim | paper | verdict | measured | published |", "|---|---|---|---|---|"]
        for c in report.claims:
            lines.append(f"| {c.id} | {c.paper} | **{_cell(c.verdict)}** | {_cell(c.measured_text)} | {_cell(c.published)} |")
    lines.append("")
    for claim_id, measured in by_id.items():
        first = measured[0]
        lines += [f"## {claim_id}: {first.statement}", "",
                  f"- **Paper:** [{first.paper}]",
                  f"- **Pass criterion (fixed before running):** {first.criterion_text}",
                  f"- **Published:** {first.published}", ""]
        for c in measured:
            if c.variant:
                lines += [f"### {claim_id} under `{c.variant}` ablation", ""]
            lines += _claim_lines(c, writer)
    return "\n".join(lines)


def _claim_lines(c: Claim, writer: Optional[FigureWriter]) -> list[str]:
    """What one claim's measurement (under one variant) adds to the report: numbers, verdict, figures."""
    lines = [f"- **Measured:** {c.measured_text or '—'}", f"- **Verdict:** **{c.verdict}**"]
    if c.models:
        seeds = ", ".join(f"{m} (seed {c.seeds.get(m)})" for m in c.models)
        lines.append(f"- **Models / seeds:** {seeds}")
    if c.seconds is not None:
        lines.append(f"- **Time:** {c.seconds:.1f} s" + (" (reused from a previous run)" if c.reused else ""))
    for note in c.notes:
        lines.append(f"- **Note:** {note}")
    lines.append("")
    for stem in _figure_stems(c):
        bundle = writer.bundles.get(stem) if writer else None
        caption = (bundle.caption if bundle is not None else stem).replace("[", "(").replace("]", ")")
        image = next((f for f in c.figures if Path(f).name.startswith(stem + ".") and f.endswith((".svg", ".png"))), None)
        if image:
            lines.append(f"![{caption}]({image})")
        else:
            lines.append(f"Figure `{stem}`: {caption} (image not written; plotly JSON `figures/{stem}.plotly.json`, "
                         f"data `figures/{stem}.csv`).")
        lines.append("")
    return lines


def variant_finding(claims: Sequence[Claim]) -> str:
    """The paragraph that states what the mean-ablation variants change, with this run's numbers."""
    def measured(claim_id: str, variant: str) -> dict:
        c = next((c for c in claims if c.id == claim_id and c.variant == variant and c.measured), None)
        return {} if c is None else c.measured

    def rho(variant: str, key: str) -> str:
        value = measured("hhg-rho-sort", variant).get(key)
        return "n/a" if value is None else f"{value:+.2f}"

    def per_layer(variant: str, key: str) -> str:
        counts = measured("hhg-layers", variant).get(key) or {}
        return "/".join(str(counts.get(str(layer), 0)) for layer in range(4)) if counts else "n/a"

    per_variant = "; ".join(f"`{v}`: reversal {rho(v, 'reverse_rho_mean')}, sorting {rho(v, 'sort_rho_mean')}, "
                            f"heroes by layer L0/L1/L2/L3 {per_layer(v, 'heroes_per_layer')}, bloats "
                            f"{per_layer(v, 'bloats_per_layer')}"
                            for v in dict.fromkeys(c.variant for c in claims if c.variant))
    return ("**What the variants measure.** The [HHG] paper's text and its reference code ablate a head with one mean "
            "over all OOD examples *and positions*. The reference code (`ablate_eval`, `prune_eval`) does it after "
            "W_O: it views the layer's attention output as [B, T, heads, d_head] and overwrites chunk h with head h's "
            "mean output from before W_O, i.e. it replaces 32 residual dimensions of the whole layer's output "
            "(`reference-slice`: not a head ablation; it reproduces the published numbers). `mean` replaces head h's "
            "output before W_O (hook_z) with that one mean; `mean-per-position` with its mean at each position, which "
            "keeps the position information the early heads carry in these models without positional embeddings, so "
            "ablating them costs almost nothing. Measured in this run, mean rho(G, C) and heroes/bloats per layer: "
            + per_variant + " (published: rho +0.72 on reversal, +0.27 on sorting; bloats in layer 1, heroes in "
            "layer 3).")


_FIG_LINE = re.compile(r"^(?:!\[.*\]\((figures/[^)]+)\)|Figure `([^`]+)`: .*)$")


def report_html(markdown_text: str, writer: FigureWriter) -> str:
    """The Markdown rendered to one self-contained HTML page; figures inline (SVG, else interactive plotly)."""
    figures: dict[str, str] = {}
    out_lines = []
    plotly_js_included = False
    for line in markdown_text.splitlines():
        match = _FIG_LINE.match(line)
        if not match:
            out_lines.append(line)
            continue
        stem = Path(match.group(1)).name.split(".")[0] if match.group(1) else match.group(2)
        token = f"HEADLABFIGURE{len(figures)}"
        bundle = writer.bundles.get(stem)
        svg = writer.folder / f"{stem}.svg"
        if svg.is_file():
            body = re.sub(r"^<\?xml[^>]*>\s*", "", svg.read_text())
        elif bundle is not None:
            body = pio.to_html(bundle.figure, full_html=False, include_plotlyjs=not plotly_js_included,
                               config={"displaylogo": False})
            plotly_js_included = True
        else:
            body = f"<p>figure {stem} is missing</p>"
        caption = "" if bundle is None else f"<figcaption>{_escape(bundle.caption)}</figcaption>"
        figures[token] = f"<figure>{body}{caption}</figure>"
        out_lines.append(token)
    html = MarkdownIt("commonmark").enable("table").render("\n".join(out_lines))
    for token, body in figures.items():
        html = html.replace(f"<p>{token}</p>", body)
    style = ("body{font-family:Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;line-height:1.45}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 6px;vertical-align:top;font-size:13px}"
             "figure{margin:1em 0}figcaption{font-size:12px;color:#555}code{background:#f4f4f4}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>HeadLab replication report</title>"
            f"<style>{style}</style></head><body>{html}</body></html>")


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def write_report(report: ReplicationReport, writer: FigureWriter) -> dict[str, Path]:
    """report.md, report.html and report.json under report.out, each written atomically."""
    markdown_text = report_markdown(report, writer)
    paths = {"markdown": report.out / "report.md", "html": report.out / "report.html", "json": report.out / "report.json"}
    atomic_write_bytes(paths["markdown"], markdown_text.encode())
    atomic_write_bytes(paths["html"], report_html(markdown_text, writer).encode())
    atomic_write_json(paths["json"], report.to_json())
    return paths
