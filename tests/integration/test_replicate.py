"""`python -m core replicate`: claims and their criteria, verdicts, resuming, and the report files.

Criteria are checked on hand-made measurements with known verdicts; the report writer on hand-made
claims and figures (every file it writes must be a valid PNG, SVG, plotly JSON, CSV or JSON); a
zoo-marked run of `replicate spectral --preset quick` checks the whole report: it parses, lists
every claim with a measured value or "needs the paper preset", and every verdict follows from the
claim's criterion and its measured value.
"""

from __future__ import annotations

import csv
import json
import re
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import plotly.graph_objects as go
import plotly.io as pio
import pytest

import core.cli.replicate_run as rcli
import core.cli.replicate_report as rw
import core.pipelines.replicate as rep
import core.pipelines.replicate_claims as rc
from core.errors import HeadLabError
from core.figures.bundle import FigureBundle
from core.heads import HeadSet
from core.pipelines.coactivation import CoactivationSettings
from core.pipelines.replicate_claims import CLAIMS, HELD, NEEDS_PAPER, NOT_HELD, NOT_RUN, Claim
from core.results import provenance
from core.zoo.presets import preset_models

CLAIMS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "replication" / "README.md"
VERDICTS = (HELD, NOT_HELD, NEEDS_PAPER)

# docs/replication/README.md "Claims worth reproducing on small models": each bullet -> the claims that test it
BULLETS = {
    "[SPC] A small induction circuit": ["spc-causal"],
    "[SPC] Circuits are seed-specific": ["spc-seed-specific"],
    "[SPC] The spectral signal rises": ["spc-timing", "spc-identifiable"],
    "[SPC] Circuit membership is stable": ["spc-data-shift"],
    "[SPC] Ablating the previous-token": ["spc-composition"],
    "[CVC] Dense models": ["cvc-dense-closure", "cvc-moe-wrong-direction"],
    "[CVC] Form and function": ["cvc-form-function"],
    "[HHG] The table above": ["hhg-rho-reverse", "hhg-rho-sort", "hhg-rho-spread", "hhg-layers", "hhg-l3h3-hero",
                              "hhg-l1-bloats", "hhg-superadditive", "hhg-hero-cost"],
}


# ---------------------------------------------------------------------------------------------
# the registry


def test_every_methods_claim_has_claims_and_runners():
    section = CLAIMS_PAGE.read_text().split("## Claims worth reproducing on small models", 1)[1].split("\n## ", 1)[0]
    bullets = [line[2:] for line in section.splitlines() if line.startswith("- ")]
    assert len(bullets) == len(BULLETS)
    for bullet in bullets:
        prefix = next((p for p in BULLETS if bullet.startswith(p)), None)
        assert prefix is not None, f"no claims for the claims page's bullet {bullet!r}"
    named = [c for ids in BULLETS.values() for c in ids]
    assert sorted(named) == sorted(CLAIMS)
    for claim in CLAIMS.values():
        assert claim.id in rep.RUNNERS
        assert claim.target in rc.TARGETS and claim.paper in ("SPC", "CVC", "HHG")
        assert claim.criterion_text and claim.statement and claim.published


def test_quick_preset_cannot_test_seed_level_claims():
    quick = {c.id for c in CLAIMS.values() if not c.testable_on("quick")}
    assert quick == {"spc-seed-specific", "spc-data-shift", "spc-identifiable", "hhg-rho-sort", "hhg-rho-spread",
                     "hhg-l3h3-hero", "hhg-l1-bloats"}
    assert all(c.testable_on("paper") for c in CLAIMS.values())
    assert preset_models("paper", "induction") == [f"induction-neox-s{s}" for s in range(6)] + ["induction-neox-long"]
    assert rc._shift_pairs("paper") == [("induction-neox-s0", "induction-neox-shifted")]
    assert preset_models("quick", "moe") == ["induction-olmoe"]


def test_claims_of_refuses_unknown_targets():
    assert {c.id for c in rc.claims_of("closure")} == {"cvc-dense-closure", "cvc-moe-wrong-direction", "cvc-form-function"}
    with pytest.raises(HeadLabError, match="spectral"):
        rc.claims_of("everything")


# ---------------------------------------------------------------------------------------------
# criteria on hand-made measurements (known verdicts)


def _causal(**changes) -> dict:
    entry = {"model": "m", "n_heads": 36, "circuit": "L1H1,L1H2,L1H3,L1H8", "circuit_size": 4, "circuit_fraction": 4 / 36,
             "recipe_verdict": "causal", "clean_top1": 0.8, "candidate_top1_delta": -0.8, "control_top1_delta_mean": -0.01}
    entry.update(changes)
    return {"per_model": [entry]}


def judge(claim_id: str, measured: dict) -> str:
    return CLAIMS[claim_id].judge(measured)


def test_causal_criterion():
    assert judge("spc-causal", _causal()) == HELD
    assert judge("spc-causal", _causal(circuit_size=10, circuit_fraction=10 / 36)) == NOT_HELD  # not small
    assert judge("spc-causal", _causal(control_top1_delta_mean=-0.09)) == NOT_HELD  # controls hurt > 10% of 0.8
    assert judge("spc-causal", _causal(control_top1_delta_mean=-0.08)) == HELD  # exactly 10%
    assert judge("spc-causal", _causal(recipe_verdict="inconclusive")) == NOT_HELD
    assert judge("spc-causal", {"per_model": []}) == NOT_HELD
    two = _causal()
    two["per_model"].append({**two["per_model"][0], "model": "m2", "recipe_verdict": "not causal"})
    assert judge("spc-causal", two) == NOT_HELD  # every seed must hold


def _seed(diag, off) -> dict:
    import numpy as np

    return {"n_models": len(diag), "diagonal_z": diag, "off_diagonal_z": off,
            "median_diagonal_z": float(np.median(diag)) if diag else None,
            "median_off_diagonal_z": float(np.median(off)) if off else None}


def test_seed_specificity_criterion():
    assert judge("spc-seed-specific", _seed([5.0, 9.0], [0.5, 2.5])) == HELD  # median 1.5 <= 1.8
    assert judge("spc-seed-specific", _seed([5.0, 9.0], [1.9, 2.5])) == NOT_HELD  # other seeds beyond controls
    assert judge("spc-seed-specific", _seed([1.0, 9.0], [0.0, 0.0])) == NOT_HELD  # one circuit not causal at home
    assert judge("spc-seed-specific", _seed([9.0], [])) == NOT_HELD  # one seed tests nothing
    assert judge("spc-seed-specific", {**_seed([5.0, 9.0], [0.0, 0.0]), "n_models": 3}) == NOT_HELD  # a missing cell


def test_timing_and_identification_criteria():
    heads = [{"rise_first": True}, {"rise_first": True}]
    assert judge("spc-timing", {"per_model": [{"model": "m", "heads": heads}]}) == HELD
    assert judge("spc-timing", {"per_model": [{"model": "m", "heads": heads + [{"rise_first": False}]}]}) == NOT_HELD
    assert judge("spc-timing", {"per_model": [{"model": "m", "heads": []}]}) == NOT_HELD  # no circuit: nothing shown
    assert judge("spc-identifiable", {"per_model": [{"first_fraction": 0.02}]}) == HELD  # 2% is inside the band
    assert judge("spc-identifiable", {"per_model": [{"first_fraction": 0.0201}]}) == NOT_HELD
    assert judge("spc-identifiable", {"per_model": [{"first_fraction": None}]}) == NOT_HELD
    # only the seeds whose induction forms early can test it: a late-forming seed is context, not a verdict
    early = {"first_fraction": 0.015, "formation_fraction": 0.024, "can_test": True}
    late = {"first_fraction": 0.40, "formation_fraction": 0.30, "can_test": False}
    assert judge("spc-identifiable", {"per_model": [early, late]}) == HELD
    assert judge("spc-identifiable", {"per_model": [{**early, "first_fraction": 0.03}, late]}) == NOT_HELD
    assert judge("spc-identifiable", {"per_model": [late]}) == NOT_HELD  # no seed tests it: never "held"
    text = CLAIMS["spc-identifiable"].describe({"per_model": [{**early, "model": "a", "stable_fraction": 0.02,
                                                                "resolution": 0.001}, {**late, "model": "b",
                                                                "stable_fraction": 0.5, "resolution": 0.01}]})
    assert "a: final circuit first returned at 1.5%" in text and "induction forms at 2.4%: tests the claim" in text
    assert "cannot test it: induction forms only at 30% of training" in text


def test_identifiability_tests_only_seeds_whose_induction_forms_early(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path))
    for name, step, steps in (("early", 600, 25_000), ("late", 500, 2_000), ("never", None, 2_000)):
        (tmp_path / "zoo" / name).mkdir(parents=True)
        (tmp_path / "zoo" / name / "manifest.json").write_text(json.dumps(
            {"name": name, "checkpoints": [], "complete": True, "final": {"induction_step": step, "steps": steps}}))
    assert rep._formation("early") == {"formation_step": 600, "formation_fraction": 0.024, "can_test": True}
    assert rep._formation("late")["can_test"] is False and rep._formation("late")["formation_fraction"] == 0.25
    assert rep._formation("never") == {"formation_step": None, "formation_fraction": None, "can_test": False}
    assert rc.IDENTIFIABLE_FORMATION_MAX == 0.05
    # before anything trains: only a preset with a seed whose warm-up ends in its first 5% can test it
    assert rc._can_test_identifiability("paper") and not rc._can_test_identifiability("quick")
    assert not CLAIMS["spc-identifiable"].testable_on("quick")


def test_the_seed_specific_claim_takes_one_model_per_training_seed():
    """induction-neox-long continues seed 0's run, so the cross-seed matrix leaves it out."""
    induction = preset_models("paper", "induction")
    assert rc._uses_distinct_seeds("paper") == [n for n in rc._uses_induction("paper") if n != "induction-neox-long"]
    assert CLAIMS["spc-seed-specific"].uses("paper") == rc._uses_distinct_seeds("paper")
    assert "induction-neox-long" in induction and CLAIMS["spc-identifiable"].uses("paper") == rc._uses_induction("paper")


def test_data_shift_and_composition_criteria():
    assert judge("spc-data-shift", {"pairs": [{"jaccard": 1.0}]}) == HELD
    assert judge("spc-data-shift", {"pairs": [{"jaccard": 0.75}]}) == NOT_HELD
    ok = {"model": "m", "heads": "L0H2", "loss_rank": 1, "clean_top1": 0.8, "top1_after": 0.4}
    assert judge("spc-composition", {"per_model": [ok]}) == HELD  # exactly half left
    assert judge("spc-composition", {"per_model": [{**ok, "top1_after": 0.41}]}) == NOT_HELD
    assert judge("spc-composition", {"per_model": [{**ok, "loss_rank": 2}]}) == NOT_HELD
    assert judge("spc-composition", {"per_model": [ok, {"model": "x", "heads": ""}]}) == HELD  # no prev heads: skipped
    undefined = {"per_model": [{"model": "x", "heads": ""}], "undefined": "no previous-token heads"}
    assert judge("spc-composition", undefined) == f"{NOT_RUN}: no previous-token heads"


def test_closure_criteria():
    counts = {"form and function": 5, "function without form": 1, "form without function": 1, "neither": 3}
    assert judge("cvc-form-function", {"counts": counts}) == HELD
    assert judge("cvc-form-function", {"counts": {**counts, "form without function": 0}}) == NOT_HELD
    assert judge("cvc-dense-closure", {"per_model": [{"verdict": "pass"}]}) == HELD
    assert judge("cvc-dense-closure", {"per_model": [{"verdict": "pass"}, {"verdict": "fail"}]}) == NOT_HELD
    wrong = {"null_z": 3.05, "verdict": "fails in the wrong direction"}
    assert judge("cvc-moe-wrong-direction", {"per_model": [wrong]}) == HELD
    assert judge("cvc-moe-wrong-direction", {"per_model": [{**wrong, "null_z": 1.0}]}) == NOT_HELD  # not real
    assert judge("cvc-moe-wrong-direction", {"per_model": [{**wrong, "verdict": "pass"}]}) == NOT_HELD


def test_attribution_criteria():
    assert judge("hhg-rho-reverse", {"rho_mean": 0.5}) == HELD
    assert judge("hhg-rho-reverse", {"rho_mean": 0.49}) == NOT_HELD
    assert judge("hhg-rho-reverse", {"rho_mean": None}) == NOT_HELD
    assert judge("hhg-rho-sort", {"sort_rho_mean": 0.27, "reverse_rho_mean": 0.72}) == HELD
    assert judge("hhg-rho-sort", {"sort_rho_mean": 0.8, "reverse_rho_mean": 0.72}) == NOT_HELD
    assert judge("hhg-rho-spread", {"rho_min": -0.18}) == HELD
    assert judge("hhg-rho-spread", {"rho_min": 0.1}) == NOT_HELD
    layers = {"bloats_per_layer": {"0": 1, "1": 5, "2": 0, "3": 1}, "heroes_per_layer": {"0": 0, "1": 1, "2": 2, "3": 4}}
    assert judge("hhg-layers", layers) == HELD
    assert judge("hhg-layers", {**layers, "bloats_per_layer": {"0": 5, "1": 5}}) == NOT_HELD  # a tie is no concentration
    assert judge("hhg-layers", {**layers, "heroes_per_layer": {"3": 0}}) == NOT_HELD  # no heroes at all
    assert judge("hhg-l3h3-hero", {"hero_count": 5, "n": 10}) == HELD
    assert judge("hhg-l3h3-hero", {"hero_count": 4, "n": 10}) == NOT_HELD
    assert judge("hhg-l1-bloats", {"bloat_counts": {"L1H1": 6, "L1H3": 5}, "n": 10}) == HELD
    assert judge("hhg-l1-bloats", {"bloat_counts": {"L1H1": 6, "L1H3": 4}, "n": 10}) == NOT_HELD
    assert judge("hhg-superadditive", {"ratio_to_sum_mean": 1.4}) == HELD
    assert judge("hhg-superadditive", {"ratio_to_sum_mean": 1.0}) == NOT_HELD
    assert judge("hhg-hero-cost", {"mean": 0.136}) == HELD  # 36.4% - 22.8%
    assert judge("hhg-hero-cost", {"mean": 0.60}) == NOT_HELD
    assert judge("hhg-hero-cost", {"mean": None, "undefined": "no reversal model has a hidden hero"}).startswith(NOT_RUN)


# ---------------------------------------------------------------------------------------------
# resuming


@pytest.fixture(scope="module")
def fake_zoo():
    from core.workspace import zoo_dir
    from tests.tiny_models import make_fake_zoo

    if not (zoo_dir() / "rep-a").exists():
        make_fake_zoo(zoo_dir(), "rep-a", "gpt_neox", steps=(0, 10))
    return zoo_dir()


def _context(tmp_path: Path, **changes) -> rep.Context:
    from core.tasks.specs import probe_spec

    ctx = rep.Context("spectral", "quick", tmp_path, probe_spec("induction", 8, 32), say=lambda text: None)
    return replace(ctx, **changes)


def test_run_claim_stores_and_reuses_measurements(fake_zoo, tmp_path, monkeypatch):
    calls = []

    def runner(ctx, names):
        calls.append(names)
        return rep.Measurement({"per_model": [{"first_fraction": 0.01}]}, {}, tuple(names))

    monkeypatch.setitem(rep.RUNNERS, "spc-identifiable", runner)
    claim = replace(CLAIMS["spc-identifiable"], uses=lambda preset: ["rep-a"], testable=None, describe=lambda m: "one percent")
    first, artifacts = rep.run_claim(claim, _context(tmp_path))
    assert calls == [["rep-a"]] and first.verdict == HELD and not first.reused and artifacts == {}
    assert first.measured_text == "one percent" and first.models == ("rep-a",)
    again, _ = rep.run_claim(claim, _context(tmp_path))
    assert len(calls) == 1 and again.reused and again.measured == first.measured
    rep.run_claim(claim, _context(tmp_path, margin=0.7))  # other settings: measured again
    assert len(calls) == 2
    rep.run_claim(claim, _context(tmp_path, margin=0.7), force=True)
    assert len(calls) == 3


def test_untrained_models_and_untestable_presets(fake_zoo, tmp_path):
    waiting = replace(CLAIMS["spc-timing"], uses=lambda preset: ["rep-a", "not-there"])
    result, _ = rep.run_claim(waiting, _context(tmp_path))
    assert result.verdict.startswith(f"{NOT_RUN}: waiting for not-there (not trained)")
    result, _ = rep.run_claim(CLAIMS["spc-seed-specific"], _context(tmp_path))
    assert result.verdict == NEEDS_PAPER and result.measured_text == NEEDS_PAPER


def test_an_interrupted_run_resumes_where_it_stopped(fake_zoo, tmp_path, monkeypatch):
    calls = []

    def ok(ctx, names):
        calls.append("first")
        return rep.Measurement({"per_model": [{"first_fraction": 0.5}]}, {}, tuple(names))

    def interrupted(ctx, names):
        raise KeyboardInterrupt

    first = replace(CLAIMS["spc-identifiable"], uses=lambda preset: ["rep-a"], testable=None, describe=lambda m: "half")
    second = replace(CLAIMS["spc-data-shift"], uses=lambda preset: ["rep-a"], testable=None, describe=lambda m: "one")
    monkeypatch.setattr(rcli, "claims_of", lambda target: [first, second])
    monkeypatch.setitem(rep.RUNNERS, "spc-identifiable", ok)
    monkeypatch.setitem(rep.RUNNERS, "spc-data-shift", interrupted)
    kwargs = dict(settings=rep.ReplicateSettings(n_examples=8, seq_len=32), out=tmp_path, formats=(), say=lambda text: None)
    with pytest.raises(KeyboardInterrupt):
        rcli.replicate("spectral", **kwargs)
    assert not (tmp_path / "report.md").exists()  # no half-written report
    monkeypatch.setitem(rep.RUNNERS, "spc-data-shift",
                        lambda ctx, names: rep.Measurement({"pairs": [{"jaccard": 1.0}]}, {}, tuple(names)))
    report = rcli.replicate("spectral", **kwargs)
    assert calls == ["first"]  # measured once, reused after the interruption
    assert [c.verdict for c in report.claims] == [NOT_HELD, HELD]
    assert [c.reused for c in report.claims] == [True, False]


# ---------------------------------------------------------------------------------------------
# the report files


def _bundle(name: str = "toy") -> FigureBundle:
    fig = go.Figure(go.Scatter(x=[1, 10, 100], y=[0.0, 0.5, 1.0], mode="lines"))
    rows = ({"x": 1, "y": 0.0}, {"x": 10, "y": 0.5}, {"x": 100, "y": 1.0})
    return FigureBundle(name, fig, rows, provenance(figure=name), "a toy figure (with brackets [x])")


def check_figure_file(path: Path) -> None:
    """Fail unless `path` is a valid figure or data file of its kind."""
    name = path.name
    if name.endswith(".png"):
        from PIL import Image

        with Image.open(path) as image:
            image.verify()
    elif name.endswith(".svg"):
        assert ET.parse(path).getroot().tag.endswith("svg")
    elif name.endswith(".pdf"):
        assert path.read_bytes().startswith(b"%PDF")
    elif name.endswith(".plotly.json"):
        assert len(pio.from_json(path.read_text()).data) >= 1
    elif name.endswith(".json"):
        data = json.loads(path.read_text())
        assert "provenance" in data and isinstance(data["data"], list)
    elif name.endswith(".csv"):
        rows = list(csv.DictReader(path.read_text().splitlines()))
        assert rows, f"{path} holds no rows"
    else:
        raise AssertionError(f"unexpected figure file {path}")


def _toy_report(tmp_path: Path, writer: rw.FigureWriter) -> rw.ReplicationReport:
    held = replace(CLAIMS["spc-identifiable"], verdict=HELD, measured={"per_model": [{"first_fraction": 0.01}]},
                   measured_text="1% | of tokens", models=("m",), seeds={"m": 0})
    needs = replace(CLAIMS["spc-seed-specific"], verdict=NEEDS_PAPER, measured_text=NEEDS_PAPER)
    files = writer.write(_bundle(), "spc-identifiable-toy")
    held = replace(held, figures=tuple(files))
    return rw.ReplicationReport("spectral", "quick", (held, needs), tmp_path, 1.5, {"probe_spec": {"n_examples": 8}},
                                 writer.note, tuple(writer.files))


def _markdown_claims(text: str) -> dict[str, str]:
    """{claim id: verdict} read back from the report's Markdown table (parsed with markdown-it)."""
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    cells, rows, in_body = [], [], False
    for tok in tokens:
        if tok.type == "tbody_open":
            in_body = True
        elif tok.type == "tr_close" and in_body:
            rows.append(cells)
            cells = []
        elif tok.type == "inline" and in_body:
            cells.append(re.sub(r"\*\*", "", tok.content))
    return {row[0]: row[2] for row in rows}


def test_report_files_without_images(tmp_path):
    writer = rw.FigureWriter(tmp_path / "figures", formats=())
    report = _toy_report(tmp_path, writer)
    paths = rw.write_report(report, writer)
    text = paths["markdown"].read_text()
    assert _markdown_claims(text) == {"spc-identifiable": HELD, "spc-seed-specific": NEEDS_PAPER}
    assert "1% \\| of tokens" in text  # a pipe in a value does not break the table
    data = json.loads(paths["json"].read_text())
    assert [c["id"] for c in data["claims"]] == ["spc-identifiable", "spc-seed-specific"]
    for claim in data["claims"]:
        assert claim["criterion"] and claim["published"]
        restored = Claim.from_json(claim)
        if claim["measured"] is not None:
            assert restored.judge(claim["measured"]) == claim["verdict"]
    for f in data["figures"]["files"]:
        check_figure_file(tmp_path / f)
    assert {Path(f).suffix for f in data["figures"]["files"]} == {".csv", ".json"}
    html = paths["html"].read_text()
    assert "plotly" in html and "HEADLABFIGURE" not in html and "<table>" in html


def test_attribution_report_shows_each_mean_variant_side_by_side(tmp_path):
    """[HHG] claims measured under two variants: one row per claim, one column per variant, the finding
    paragraph with the measured numbers, a section per variant, and each variant's key in the JSON."""
    def measured(variant, rev, srt, heroes):
        rho = replace(CLAIMS["hhg-rho-sort"], variant=variant, verdict=NOT_HELD, measured_text=f"rho {rev} vs {srt}",
                      measured={"reverse_rho_mean": rev, "sort_rho_mean": srt})
        layers = replace(CLAIMS["hhg-layers"], variant=variant, verdict=HELD, measured_text="layers",
                         measured={"heroes_per_layer": heroes, "bloats_per_layer": {"1": 4}})
        return [rho, layers]

    waiting = "not run: waiting for sort-hhg-s9 (not trained)"
    claims = measured("mean", 0.61, 0.4, {"3": 5}) + measured("mean-per-position", -0.22, 0.17, {"0": 1, "3": 2})
    claims += [replace(CLAIMS["hhg-superadditive"], variant=v, verdict=waiting, measured_text=waiting)
               for v in ("mean", "mean-per-position")]
    report = rw.ReplicationReport("attribution", "paper", tuple(claims), tmp_path, 2.0,
                                  {"attribution": {"gradient_variant": "paper"}})
    text = rw.report_markdown(report)
    waiting_row = next(line for line in text.splitlines() if line.startswith("| hhg-superadditive |"))
    assert waiting_row.count("waiting for sort-hhg-s9") == 2  # once per variant, not twice in each cell
    assert "| claim | paper | published | mean | mean-per-position |" in text
    row = next(line for line in text.splitlines() if line.startswith("| hhg-rho-sort |"))
    assert "**did not hold**: rho 0.61 vs 0.4" in row and "rho -0.22 vs 0.17" in row
    assert ("`mean`: reversal +0.61, sorting +0.40, heroes by layer L0/L1/L2/L3 0/0/0/5, bloats 0/4/0/0; "
            "`mean-per-position`: reversal -0.22, sorting +0.17, heroes by layer L0/L1/L2/L3 1/0/0/2") in text
    assert "### hhg-layers under `mean-per-position` ablation" in text and text.count("## hhg-rho-sort:") == 1
    assert [c.key for c in claims[:4]] == ["hhg-rho-sort-mean", "hhg-layers-mean", "hhg-rho-sort-mean-per-position",
                                           "hhg-layers-mean-per-position"]
    assert Claim.from_json(claims[2].to_json()).variant == "mean-per-position"


def test_attribution_measurements_are_stored_per_variant(fake_zoo, tmp_path, monkeypatch):
    monkeypatch.setitem(rep.RUNNERS, "hhg-rho-reverse",
                        lambda ctx, names: rep.Measurement({"rho_mean": 0.8, "rhos": [0.8], "n": 1}, {}, tuple(names)))
    claim = replace(CLAIMS["hhg-rho-reverse"], uses=lambda preset: ["rep-a"], describe=lambda m: "rho")
    for variant in ("mean", "reference-slice"):
        ctx = replace(_context(tmp_path), target="attribution", ablation_mode=variant)
        result, _ = rep.run_claim(claim, ctx)
        assert result.variant == variant and result.verdict == HELD
        stored = json.loads((tmp_path / "measurements" / variant / "hhg-rho-reverse.json").read_text())
        assert stored["settings"]["attribution"]["ablation_mode"] == variant


def test_report_inlines_svg_and_records_a_missing_browser(tmp_path, monkeypatch):
    import core.figures.bundle

    svg = b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect width="5" height="5"/></svg>'
    monkeypatch.setattr(core.figures.bundle, "figure_bytes", lambda fig, fmt, paper=True, size=None: svg)
    writer = rw.FigureWriter(tmp_path / "figures", formats=("svg",))
    report = _toy_report(tmp_path, writer)
    paths = rw.write_report(report, writer)
    check_figure_file(tmp_path / "figures" / "spc-identifiable-toy.svg")
    assert "![a toy figure (with brackets (x))](figures/spc-identifiable-toy.svg)" in paths["markdown"].read_text()
    html = paths["html"].read_text()
    assert "<rect" in html and "<?xml" not in html

    def broken(fig, fmt, paper=True, size=None):
        raise HeadLabError("figure export needs Debian's chromium: run `apt-get install chromium`.")

    monkeypatch.setattr(core.figures.bundle, "figure_bytes", broken)
    writer = rw.FigureWriter(tmp_path / "other", formats=("png", "svg"))
    files = writer.write(_bundle(), "x")
    assert not writer.images_ok and "chromium" in writer.note
    assert all(not f.endswith((".png", ".svg")) for f in files)
    with pytest.raises(HeadLabError, match="unknown image format"):
        rw.FigureWriter(tmp_path, formats=("gif",))


# ---------------------------------------------------------------------------------------------
# the whole spectral report on the quick zoo


@pytest.mark.zoo
def test_replicate_spectral_quick_report(quick_zoo, tmp_path):
    from core.__main__ import main

    out = tmp_path / "report"
    args = ["replicate", "spectral", "--preset", "quick", "--out", str(out), "--n", "64", "--controls", "19"]
    assert main(args) == 0
    data = json.loads((out / "report.json").read_text())
    ids = [c["id"] for c in data["claims"]]
    assert ids == [c.id for c in rc.claims_of("spectral")]
    table = _markdown_claims((out / "report.md").read_text())
    assert list(table) == ids
    for claim in data["claims"]:
        assert table[claim["id"]] == claim["verdict"]
        if claim["verdict"] == NEEDS_PAPER:
            assert claim["id"] in ("spc-seed-specific", "spc-data-shift", "spc-identifiable") and claim["measured"] is None
            continue
        assert claim["verdict"] in VERDICTS, claim["verdict"]  # every quick-testable claim was measured
        assert claim["measured"] is not None and claim["measured_text"]
        assert Claim.from_json(claim).judge(claim["measured"]) == claim["verdict"]
        assert claim["models"] == ["induction-neox"] and claim["seeds"] == {"induction-neox": 0}
        assert any(f.endswith(".plotly.json") for f in claim["figures"])
    for f in data["figures"]["files"]:
        check_figure_file(out / f)
    assert "HEADLABFIGURE" not in (out / "report.html").read_text()
    # a rerun reuses every measurement
    assert main(args) == 0
    again = json.loads((out / "report.json").read_text())
    assert all(c["reused"] for c in again["claims"] if c["measured"] is not None)
    assert [c["verdict"] for c in again["claims"]] == [c["verdict"] for c in data["claims"]]


# ---------------------------------------------------------------------------------------------
# the closure claims through core.pipelines.coactivation (a stand-in report: the pipeline is tested in its own file)


class _Split:
    def __init__(self, kind, split, paper, z_loss=0.0):
        from core.stats.inference import Verdict

        self.kind, self.split, self.n_examples = kind, split, 10
        self.stats = {m: {"candidate_delta": 0.1, "z": z_loss if m == "loss" else 0.0}
                      for m in ("loss", "top1", "top5", "target_logit")}
        self.verdicts = {"paper": Verdict(paper, "paper"), "reference": Verdict("fail", "reference")}

    def z(self, metric):
        return self.stats[metric]["z"]


class _Closure:
    def __init__(self, splits, skipped):
        self.splits, self.skipped = splits, skipped

    def split(self, kind, split="all"):
        return next((s for s in self.splits if s.kind == kind and s.split == split), None)


def _fake_coactivation(calls):
    def coactivation(ref, revision, spec, settings, **kwargs):
        route_conditional = settings.route_conditional
        calls.append((ref.name, route_conditional))
        splits = [_Split("any-layer", "all", "pass"), _Split("any-layer", "on", "fails in the wrong direction", -3.0)]
        route = SimpleNamespace(null=SimpleNamespace(z_max=3.05, null_max_mean=0.1, null_max_std=0.03),
                                statistic=SimpleNamespace(max_ari=0.19), discovery_stratum=1, sizes=(5, 5))
        return SimpleNamespace(candidate=HeadSet(((0, 1), (1, 2))), proposal=SimpleNamespace(k=4),
                               closure=_Closure(splits, {"matched": "more than half of a layer"}), notes=("a note",),
                               route=route if route_conditional else None,
                               summary=lambda: {"candidate": ["L0H1", "L1H2"], "closure": []})

    return SimpleNamespace(coactivation=coactivation, CoactivationSettings=CoactivationSettings)


def test_closure_claims_judge_the_synthetic_split(fake_zoo, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(rep, "_coactivation", lambda: _fake_coactivation(calls))
    ctx = replace(_context(tmp_path), target="closure")
    dense = replace(CLAIMS["cvc-dense-closure"], uses=lambda preset: ["rep-a"])
    result, _ = rep.run_claim(dense, ctx)
    entry = result.measured["per_model"][0]
    assert entry["kind"] == "any-layer" and entry["split"] == "all"  # matched was skipped: any-layer instead
    assert result.verdict == HELD and calls == [("rep-a", False)]
    moe = replace(CLAIMS["cvc-moe-wrong-direction"], uses=lambda preset: ["rep-a"])
    result, _ = rep.run_claim(moe, ctx)
    entry = result.measured["per_model"][0]
    assert entry["split"] == "on" and entry["null_z"] == 3.05 and entry["z_loss"] == -3.0
    assert result.verdict == HELD and calls[-1] == ("rep-a", True)
    assert "rep-a: a note" in result.notes


def test_closure_claim_whose_pipeline_fails_is_reported_not_run(fake_zoo, tmp_path, monkeypatch):
    def failing(ref, revision, spec, settings, **kwargs):
        raise HeadLabError("every head has a constant spin; use a larger probe.")

    monkeypatch.setattr(rep, "_coactivation", lambda: SimpleNamespace(coactivation=failing,
                                                                       CoactivationSettings=CoactivationSettings))
    dense = replace(CLAIMS["cvc-dense-closure"], uses=lambda preset: ["rep-a"])
    result, artifacts = rep.run_claim(dense, replace(_context(tmp_path), target="closure"))
    assert result.verdict == f"{NOT_RUN}: every head has a constant spin; use a larger probe."
    assert result.measured is None and artifacts == {}


def test_a_problem_in_one_claim_is_reported_not_raised(fake_zoo, tmp_path, monkeypatch):
    def broken(ctx, names):
        raise HeadLabError("the probe is longer than the model's context; use a shorter probe.")

    monkeypatch.setitem(rep.RUNNERS, "spc-timing", broken)
    claim = replace(CLAIMS["spc-timing"], uses=lambda preset: ["rep-a"])
    result, artifacts = rep.run_claim(claim, _context(tmp_path))
    assert result.verdict == f"{NOT_RUN}: the probe is longer than the model's context; use a shorter probe."
    assert result.measured is None and artifacts == {}


def test_seeds_that_never_learned_induction_are_left_out(tmp_path, monkeypatch):
    """A finished seed whose repeated-half loss stays at or above 1.0 nats has no circuit to test."""
    from core.workspace import zoo_dir

    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path))
    checkpoints = [{"revision": "step1", "step": 1, "tokens": 64}]
    for name, loss, complete in (("ind-a", 0.35, True), ("ind-b", 5.54, True), ("ind-c", 1.0, True), ("ind-d", 5.5, False)):
        (zoo_dir() / name).mkdir(parents=True)
        (zoo_dir() / name / "manifest.json").write_text(json.dumps(
            {"name": name, "complete": complete, "checkpoints": checkpoints, "final": {"induction_loss": loss}}))
    monkeypatch.setattr(rc, "preset_models", lambda preset, kind: ["ind-a", "ind-b", "ind-c", "ind-d", "ind-e"])
    # ind-d is still training and ind-e not started: not judged here (run_claim reports them as not trained)
    assert rc.unformed_induction_seeds("paper") == {"ind-b": 5.54, "ind-c": 1.0}
    assert rc._uses_induction("paper") == ["ind-a", "ind-d", "ind-e"]
    report = rw.ReplicationReport("spectral", "paper", (), tmp_path, 1.0,
                                   {"probe_spec": {}, "excluded_induction_seeds": {"ind-b": 5.54}})
    assert "Left out of every induction claim: ind-b (repeated-half loss 5.54 nats)" in rw.report_markdown(report)
