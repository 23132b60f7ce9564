"""Figure builders, paper exports (PNG/SVG/PDF through kaleido + Debian's chromium, CSV/JSON with
provenance) and the headless `export` command, on hand-made inputs and a tiny fake zoo."""

from __future__ import annotations

import argparse
import csv
import io
import json
import struct
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import torch

from core.ablation.spec import ConditionMetrics
from core.ablation.study import AblationResult, condition_stats, example_damage, worst_examples
from core.cli.export import add_export_arguments, cli_export
from core.cli.export_run import _formats
from core.errors import HeadLabError
from core.figures._style import PICKER, SELECTIVITY_FLOOR, heads_from_points
from core.figures.ablation import ablation_strip, head_grid, per_example_damage
from core.figures.bundle import export_bundle, figure_bytes, paper_version
from core.figures.inspector import attention_pattern, attention_row
from core.figures.screen import ScreenMarks, class_map, selectivity_heatmap
from core.figures.spectral import pr_integral_ranking, pr_trajectories
from core.figures.theme import CLASS_COLORS, FADED, PAPER_HEIGHT, PAPER_SCALE, PAPER_WIDTH
from core.heads import HeadSet
from core.stats.controls import ControlSets
from core.stats.inference import closure_verdict, recipe_verdict
from core.stats.selectivity import ScreenResult
from core.stats.spectral import SpectralResult
from tests.tiny_models import make_fake_zoo

CHROMIUM = Path("/usr/bin/chromium")
needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(), reason="figure export needs Debian's chromium at /usr/bin/chromium")


# ---------------------------------------------------------------------------------------------- inputs


def spectral() -> SpectralResult:
    """PR [checkpoint, layer, head] for 2 layers x 3 heads: L1H2 grows, the rest stay at 1."""
    pr = np.ones((4, 2, 3))
    pr[:, 1, 2] = [1.0, 2.0, 3.0, 4.0]
    pr[:, 0, 1] = [1.0, 1.5, 1.5, 1.5]
    return SpectralResult.build(pr, [0, 1000, 10_000, 100_000], k=2, revisions=["s0", "s1", "s2", "s3"])


def condition(label: str, loss, top1, logit) -> ConditionMetrics:
    return ConditionMetrics(label, None, np.asarray(loss, float), np.asarray(top1, float), np.asarray(top1, float),
                            np.asarray(logit, float))


def ablation_result() -> AblationResult:
    """Clean run, a damaging candidate (loss +2 on example 1, +1 on example 0) and three mild controls."""
    clean = condition("clean", [1.0, 1.0, 1.0], [1, 1, 1], [5.0, 5.0, 5.0])
    candidate = condition("candidate", [2.0, 3.0, 1.0], [0, 0, 1], [3.0, 2.0, 5.0])
    controls = tuple(condition(f"control {i}", [1.0 + d, 1.0, 1.0], [1, 1, 1], [5.0 - d, 5.0, 5.0])
                     for i, d in enumerate((0.1, 0.2, 0.3)))
    upper = condition("upper bound", [4.0, 4.0, 4.0], [0, 0, 0], [0.0, 0.0, 0.0])
    stats = condition_stats(clean, candidate, controls, upper, n_boot=200)
    cand = {m: stats[m]["candidate_delta"] for m in stats}
    ctrl = {m: stats[m]["control_deltas"] for m in stats}
    verdicts = {"recipe": recipe_verdict(cand, ctrl, clean.mean("top1"), {"top1": stats["top1"]["upper_bound_delta"]}),
                "closure_paper": closure_verdict(cand, ctrl, "paper")}
    sets = ControlSets("matched", (HeadSet(((1, 0),)), HeadSet(((1, 1),)), HeadSet(((1, 3),))), 123, 3, 3)
    return AblationResult(HeadSet(((1, 2),)), "zero", clean, candidate, controls, sets, upper, stats, verdicts, (),
                          {"n_examples": 3})


# ---------------------------------------------------------------------------------------------- builders


def test_pr_trajectories_plot_core_numbers_on_log_tokens():
    res = spectral()
    bundle = pr_trajectories(res, "m", {"task": "induction"}, highlight=[(1, 2)], current_tokens=1000)
    assert len(bundle.figure.data) == 6  # one line per head
    line = bundle.figure.data[5]  # L1H2
    assert line.customdata[0] == "L1H2" and line.line.width > bundle.figure.data[0].line.width
    assert list(line.x) == [1000.0, 10_000.0, 100_000.0]  # 0 tokens has no place on a log axis
    assert list(line.y) == [2.0, 3.0, 4.0]
    assert bundle.figure.layout.xaxis.type == "log"
    assert "entropy effective rank" in bundle.caption and "s0" in bundle.caption
    assert len(bundle.rows) == 4 * 6 and bundle.provenance["pr_definition"] == "entropy"


def test_pr_integral_ranking_colours_top_k():
    res = spectral()
    bundle = pr_integral_ranking(res, "m", {})
    bar = bundle.figure.data[0]
    assert list(bar.x[:2]) == ["L1H2", "L0H1"]
    assert bar.y[0] == pytest.approx(float(res.integral[1, 2]))
    assert bar.marker.color[2] == FADED and bar.marker.color[0] != FADED
    assert [r["top_k"] for r in bundle.rows[:3]] == [True, True, False]


def test_selectivity_heatmap_marks_thresholds_and_null_floor():
    sel = np.array([[1.0, 40.0, 60.0], [3.0, 0.0, 100.0]])  # [layer, head]
    membership = np.array([[0.5, 9.0, 20.0], [1.0, 0.0, 12.5]])  # against the uniform baseline
    marks = ScreenMarks(30, noise_floor=3.0, membership=membership, induction_threshold=12.5)
    bundle = selectivity_heatmap(sel, "induction", "m", {}, "s3", 1e5, marks)
    heat = bundle.figure.data[0]
    assert np.array_equal(np.asarray(heat.customdata), sel)  # raw selectivity, exactly
    assert np.allclose(np.asarray(heat.z), np.log10(np.maximum(sel, SELECTIVITY_FLOOR)))
    by_name = {t.name: t for t in bundle.figure.data[1:]}
    medium = next(t for n, t in by_name.items() if n.startswith("≥ 30x"))
    strong = next(t for n, t in by_name.items() if n.startswith("induction member"))
    floor = next(t for n, t in by_name.items() if "null floor" in n)
    assert list(zip(medium.y, medium.x)) == [(0, 1)]
    assert sorted(zip(strong.y, strong.x)) == [(0, 2), (1, 2)]
    assert sorted(zip(floor.y, floor.x)) == [(0, 0), (1, 0), (1, 1)]
    picker = bundle.figure.data[-1]
    assert picker.meta == PICKER and len(picker.customdata) == 6
    assert "3x" in " ".join(bundle.figure.data[0].colorbar.ticktext)
    assert [r["induction_member"] for r in bundle.rows] == [False, False, True, False, False, True]
    other = selectivity_heatmap(sel, "self", "m", {}, "s3",
                                marks=ScreenMarks(membership=membership, induction_threshold=12.5))
    assert not any("member" in (t.name or "") for t in other.figure.data)  # membership is an induction notion


def test_screen_marks_are_validated_and_read_from_a_screen_result():
    with pytest.raises(HeadLabError, match="class threshold"):
        ScreenMarks(0.0)
    with pytest.raises(HeadLabError, match="membership"):
        ScreenMarks(membership=np.ones(3))
    sel = np.arange(12, dtype=float).reshape(2, 2, 3)  # [pattern, layer, head]
    result = ScreenResult(("induction", "self"), sel, baseline="uniform", threshold=20.0, induction_threshold=10.0)
    marks = ScreenMarks.of(result)
    assert (marks.class_threshold, marks.baseline, marks.induction_threshold) == (20.0, "uniform", 10.0)
    assert marks.noise_floor is None and np.array_equal(marks.membership, sel[0])  # no null drawn: no floor


def test_class_map_colours_each_class():
    classes = np.array([["induction", "unspecialized"], ["previous-token", "induction"]], dtype=object)
    bundle = class_map(classes, "m", {}, "s3")
    heat = bundle.figure.data[0]
    names = list(CLASS_COLORS)
    assert np.array_equal(np.asarray(heat.z), [[names.index("induction"), names.index("unspecialized")],
                                               [names.index("previous-token"), names.index("induction")]])
    legend = {t.name for t in bundle.figure.data if t.name in names}
    assert legend == {"induction", "unspecialized", "previous-token"}


def test_head_grid_is_a_scatter_of_squares_naming_heads():
    values = np.array([[1.0, 2.0], [60.0, 0.5]])
    bundle = head_grid(values, [(1, 0)], "m", "s3", "pick")
    grid = bundle.figure.data[0]
    assert grid.type == "scatter" and grid.marker.symbol == "square"
    assert list(grid.customdata) == ["L0H0", "L0H1", "L1H0", "L1H1"]
    assert list(grid.marker.line.width) == [0.5, 0.5, 4, 0.5]
    assert bundle.figure.layout.xaxis.fixedrange and bundle.figure.layout.yaxis.fixedrange  # drags select, never pan


def test_heads_from_points_reads_customdata():
    points = [{"customdata": "L1H2", "x": 2, "y": 1}, {"customdata": ["L0H0"]}, {"x": 5}]
    assert heads_from_points(points) == [(0, 0), (1, 2)]


def test_ablation_strip_shows_candidate_controls_upper_bound_and_z():
    result = ablation_result()
    bundle = ablation_strip(result, "m", "s3")
    metrics = list(result.stats)
    cands = [t for t in bundle.figure.data if t.name == "candidate"]
    assert [c.y[0] for c in cands] == [result.stats[m]["candidate_delta"] for m in metrics]
    controls = [t for t in bundle.figure.data if t.name == "matched-random controls"]
    assert list(controls[0].y) == pytest.approx([0.1 / 3, 0.2 / 3, 0.3 / 3])  # mean loss deltas over 3 examples
    titles = [a.text for a in bundle.figure.layout.annotations]
    z_loss = result.stats["loss"]["z"]
    # rank and p lead; z from 3 controls (fewer than 10) is greyed
    assert titles[0] == f"<b>loss</b><br>rank 1/4, p = 0.25<br><span style='color:#aaaaaa'>z = {z_loss:+.3g} (3 ctrl)</span>"
    assert bundle.provenance["verdicts"]["recipe"]["label"] == result.verdicts["recipe"].label


def test_per_example_damage_is_signed_and_sorted():
    result = ablation_result()
    loss = per_example_damage(result, "m", "s3", "loss")
    assert [r["example"] for r in loss.rows] == [1, 0, 2]
    assert [r["candidate_damage"] for r in loss.rows] == [2.0, 1.0, 0.0]
    top1 = per_example_damage(result, "m", "s3", "top1")  # losing top-1 is positive damage
    assert [r["candidate_damage"] for r in top1.rows] == [1.0, 1.0, 0.0]
    assert worst_examples(example_damage(result.clean, result.candidate, "loss"), 2) == [1, 0]


def test_attention_row_marks_pattern_targets():
    row = np.array([0.1, 0.0, 0.0, 0.7, 0.1, 0.1, 0.0, 0.0])
    tokens = [256, 65, 66, 67, 65, 66, 67, 65]
    bundle = attention_row(row, tokens, query_pos=7, induction_pos=2, duplicate_pos=1, head=(1, 2), example=0,
                           model="m", revision="s3")
    roles = {r["key"]: r["role"] for r in bundle.rows}
    assert roles[2] == "induction (p+1)" and roles[1] == "duplicate (p)" and roles[6] == "previous (q−1)" and roles[0] == "first (0)"
    assert [r["label"] for r in bundle.rows][:2] == ["<bos>", "A"]


def test_paper_version_is_white_serif_without_pickers_or_grid():
    bundle = selectivity_heatmap(np.ones((2, 3)), "self", "m", {}, "s3")
    paper = paper_version(bundle.figure)
    assert all(t.meta != PICKER for t in paper.data)
    assert any(t.meta == PICKER for t in bundle.figure.data)  # the screen figure is untouched
    assert paper.layout.width == PAPER_WIDTH and paper.layout.height == PAPER_HEIGHT
    assert "serif" in paper.layout.template.layout.font.family
    assert paper.layout.xaxis.showgrid is False and paper.layout.yaxis.showgrid is False


def test_csv_and_json_carry_data_and_provenance():
    bundle = pr_integral_ranking(spectral(), "tiny", {"task": "induction", "n": 8})
    rows = list(csv.DictReader(io.StringIO(bundle.csv_bytes().decode())))
    assert len(rows) == 6 and rows[0]["head_name"] == "L1H2"
    data = json.loads(bundle.json_bytes())
    assert data["data"] == [dict(r) for r in bundle.rows]
    prov = data["provenance"]
    assert prov["model"] == "tiny" and prov["probe_spec"] == {"task": "induction", "n": 8}
    assert prov["pr_definition"] == "entropy" and prov["rule"] == "trapezoid" and prov["k"] == 2
    assert {"headlab", "torch", "transformer-lens", "plotly"} <= set(prov["versions"])


# ---------------------------------------------------------------------------------------------- files


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def check_image_files(paths: list[Path], size: tuple[int, int] | None = None) -> None:
    by_suffix = {p.suffix: p for p in paths}
    if ".png" in by_suffix:
        width, height = png_size(by_suffix[".png"].read_bytes())
        if size:
            assert (width, height) == (size[0] * PAPER_SCALE, size[1] * PAPER_SCALE)  # high resolution
    if ".svg" in by_suffix:
        root = ET.fromstring(by_suffix[".svg"].read_bytes())
        assert root.tag.endswith("svg")
    if ".pdf" in by_suffix:
        pdf = by_suffix[".pdf"].read_bytes()
        assert pdf.startswith(b"%PDF-") and pdf.rstrip().endswith(b"%%EOF")


@needs_chromium
def test_png_svg_pdf_exports_are_valid_files(tmp_path):
    bundle = pr_trajectories(spectral(), "tiny", {"task": "induction"}, highlight=[(1, 2)])
    written = export_bundle(bundle, tmp_path, "x-")
    assert sorted(p.name for p in written) == sorted(f"x-spectral-pr-trajectories.{s}" for s in
                                                    ("png", "svg", "pdf", "csv", "json"))
    check_image_files(written, bundle.paper_size)
    assert png_size((tmp_path / "x-spectral-pr-trajectories.png").read_bytes())[0] >= 2000
    meta = json.loads((tmp_path / "x-spectral-pr-trajectories.json").read_text())
    assert meta["provenance"]["figure"] == "pr_trajectories" and len(meta["data"]) == len(bundle.rows)
    assert not list(tmp_path.glob("*.tmp*")) and not list(tmp_path.glob(".*"))  # nothing half-written


@needs_chromium
def test_unknown_image_format_is_refused():
    with pytest.raises(HeadLabError, match="unknown image format"):
        figure_bytes(pr_integral_ranking(spectral(), "m", {}).figure, "gif")


@needs_chromium
def test_cli_export_writes_every_figure_headless(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("HEADLAB_HOME", str(home))
    make_fake_zoo(home / "zoo", "tiny-neox", "gpt_neox", steps=(0, 10, 100))
    parser = argparse.ArgumentParser()
    add_export_arguments(parser)
    out_dir = tmp_path / "out"
    args = parser.parse_args(["tiny-neox", "--figure", "all", "--out", str(out_dir), "--n", "16", "--seq-len", "32",
                              "--pattern", "induction", "--controls", "3", "--formats", "svg,png"])
    result = cli_export(args)
    names = {Path(p).name for p in result["files"]}
    for stem in ("spectral-pr-trajectories", "spectral-pr-integral", "screen-induction-selectivity",
                 "screen-induction-strip", "screen-class-map", "screen-class-fractions", "ablation-strip",
                 "ablation-per-example-loss"):
        for suffix in ("svg", "png", "csv", "json"):
            assert f"tiny-neox-{stem}.{suffix}" in names
            assert (out_dir / f"tiny-neox-{stem}.{suffix}").stat().st_size > 0
        check_image_files([out_dir / f"tiny-neox-{stem}.svg", out_dir / f"tiny-neox-{stem}.png"])
    meta = json.loads((out_dir / "tiny-neox-ablation-strip.json").read_text())
    assert meta["provenance"]["model"] == "tiny-neox" and meta["provenance"]["revision"] == "step000100"
    assert result["ablation"]["verdicts"]  # the ablation ran and was judged
    assert json.loads((out_dir / "tiny-neox-screen-class-map.json").read_text())["provenance"]["probe_spec"]["n_examples"] == 16


def test_cli_export_refuses_bad_formats_and_patterns(tmp_path, monkeypatch):
    with pytest.raises(HeadLabError, match="unknown image format"):
        _formats("png,gif")
    assert _formats("PNG, pdf") == ("png", "pdf")


def test_attention_pattern_windows_long_sequences_around_the_query():
    pattern = np.tril(np.ones((600, 600))) / np.arange(1, 601)[:, None]  # uniform causal attention
    bundle = attention_pattern(pattern, list(range(600)), query_pos=599, head=(0, 1), example=3,
                               model="m", revision="s", window=256)
    heat = bundle.figure.data[0]
    assert list(heat.x) == list(range(344, 600)) and np.asarray(heat.z).shape == (256, 256)
    assert np.allclose(np.asarray(heat.z), pattern[344:600, 344:600])
    small = attention_pattern(pattern[:10, :10], list(range(10)), query_pos=9, head=(0, 1), example=0,
                              model="m", revision="s")
    assert np.asarray(small.figure.data[0].z).shape == (10, 10)


@needs_chromium
def test_cli_export_ablation_of_given_heads(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("HEADLAB_HOME", str(home))
    make_fake_zoo(home / "zoo", "tiny-neox", "gpt_neox", steps=(0, 10))
    parser = argparse.ArgumentParser()
    add_export_arguments(parser)
    argv = ["tiny-neox", "--figure", "ablation", "--out", str(tmp_path / "out"), "--n", "16", "--seq-len", "32",
            "--heads", "L1H0", "--controls", "3", "--formats", "svg", "--revision", "step000000"]
    result = cli_export(parser.parse_args(argv))
    assert result["ablation"]["heads"] == "L1H0" and result["revision"] == "step000000"
    assert sorted(Path(p).name for p in result["files"]) == sorted(
        f"tiny-neox-{stem}.{suffix}" for stem in ("ablation-strip", "ablation-per-example-loss")
        for suffix in ("svg", "csv", "json"))
    with pytest.raises(HeadLabError, match="cannot read head"):
        cli_export(parser.parse_args(argv[:-8] + ["--heads", "L1X0", "--controls", "3", "--formats", "svg"]))


@needs_chromium
@pytest.mark.zoo
def test_cli_export_attribution_of_a_reversal_model(quick_zoo, tmp_path):
    torch.set_num_threads(1)
    parser = argparse.ArgumentParser()
    add_export_arguments(parser)
    result = cli_export(parser.parse_args(["reverse-hhg", "--figure", "all", "--out", str(tmp_path), "--formats", "svg"]))
    assert result["figures"] == ["attribution"]
    names = {Path(p).name for p in result["files"]}
    for stem in ("rank-scatter", "joint-ablation"):
        assert f"attribution-reverse-hhg-{stem}.svg" in names and f"attribution-reverse-hhg-{stem}.csv" in names
    for path in result["files"]:
        if path.endswith(".svg"):
            check_image_files([Path(path)])
    with pytest.raises(HeadLabError, match="reversal/sorting model"):
        cli_export(parser.parse_args(["reverse-hhg", "--figure", "screen", "--out", str(tmp_path)]))
