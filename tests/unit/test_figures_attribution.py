"""Figures of the gradient-vs-causal analysis on hand-made results: the aligned band, labels and layer
colours of the rank scatter, the joint-ablation bars and ratios, rho per seed with mean and std, and
the hero / bloat frequencies on the layer x (heads + MLP) grid."""

from __future__ import annotations

import json

import numpy as np
import pytest

from core.figures.theme import CANDIDATE_COLOR, LAYER_COLORS
from core.pipelines import attribution_results as ares
from core.figures import attribution as fa
from core.errors import HeadLabError
from core.figures._style import heads_from_points


def make_result(name, G, C, n_layers=2, n_heads=2, threshold=3.0, joint=0.45, task="reverse", with_mlp=True, rule="paper"):
    """A real AttributionResult from hand-made G and C (no model): ranks, classes, rho, joints."""
    components = ares.component_order(n_layers, n_heads, with_mlp)
    settings = ares.AttributionSettings(task=task, threshold=threshold, rule=rule)
    return ares.assemble_result(name, "step100", components, G, C, 0.6, {8: 0.6, 9: 0.2}, 8, settings,
                                lambda members: joint)


def twenty(name="m", task="reverse"):
    """4 x 4 heads + MLPs (20 components): C ranks 1..20 in order; G equal except L0H0 ranked 20th
    (d = +19: a bloat) and L3MLP ranked 1st (d = -19: a hero)."""
    C = np.arange(1, 21, dtype=float) / 100  # rank_C = 1..20
    G = np.array([20.0] + list(range(2, 20)) + [1.0])
    return make_result(name, G, C, n_layers=4, n_heads=4, threshold=6.0, task=task)


def test_band_polygon_is_the_aligned_region():
    xs, ys = fa.band_polygon(20, 6)
    assert list(zip(xs, ys)) == [(0.5, 0.5), (0.5, 6.5), (14.5, 20.5), (20.5, 20.5), (20.5, 14.5), (6.5, 0.5), (0.5, 0.5)]
    # every edge that is not a side of the square lies on y = x + 6 or y = x - 6
    assert ys[2] - xs[2] == 6 and ys[1] - xs[1] == 6 and xs[4] - ys[4] == 6 and xs[5] - ys[5] == 6
    xs, ys = fa.band_polygon(4, 6)  # wider than the square: all of it
    assert (min(xs), max(xs), min(ys), max(ys)) == (0.5, 4.5, 0.5, 4.5)


def test_rank_scatter_band_labels_colours_and_pick_targets():
    result = twenty()
    assert result.members("bloat") == ("L0H0",) and result.members("hero") == ("L3MLP",)
    bundle = fa.rank_scatter(result)
    fig = bundle.figure
    band = fig.data[0]
    assert band.fill == "toself" and list(band.x) == fa.band_polygon(20, 6)[0] and list(band.y) == fa.band_polygon(20, 6)[1]
    layers = [t for t in fig.data if (t.name or "").startswith("layer ")]
    assert [t.name for t in layers] == ["layer 0", "layer 1", "layer 2", "layer 3"]
    points = {}
    for layer, trace in enumerate(layers):
        assert trace.marker.color == LAYER_COLORS[layer]  # coloured by layer
        for x, y, text, data, symbol in zip(trace.x, trace.y, trace.text, trace.customdata, trace.marker.symbol):
            points[data[1]] = (x, y, text, data[0], symbol)
    assert len(points) == 20
    for i, comp in enumerate(result.components):
        x, y, text, pick, symbol = points[comp]
        assert (x, y) == (result.rank_C[i], result.rank_G[i])  # x = causal rank, y = gradient rank
        assert text == (comp if comp in ("L0H0", "L3MLP") else "")  # heroes and bloats labelled, nothing else
        assert symbol == ("diamond" if comp.endswith("MLP") else "circle")
        assert pick == ("" if comp.endswith("MLP") else comp)
    # the bloat sits above the band (y - x >= 6), the hero below it
    assert points["L0H0"][1] - points["L0H0"][0] == 19 and points["L3MLP"][1] - points["L3MLP"][0] == -19
    # a click or lasso names heads only (the ablation lab ablates heads)
    clicked = [{"customdata": list(t.customdata[i])} for t in layers for i in range(len(t.x))]
    assert heads_from_points(clicked) == [(l, h) for l in range(4) for h in range(4)]
    rows = {r["component"]: r for r in bundle.rows}
    assert rows["L0H0"]["class"] == "bloat" and rows["L0H0"]["d"] == 19 and rows["L3MLP"]["kind"] == "mlp"
    assert "d ≥ 6" in bundle.caption and "paper rule" in bundle.caption
    prov = json.loads(bundle.json_bytes())["provenance"]
    assert prov["model"] == "m" and prov["settings"]["threshold"] == 6.0 and prov["versions"]["headlab"]
    assert bundle.csv_bytes().startswith(b"component,layer,head,kind,G,C,rank_G,rank_C,d,class")


def test_rank_scatter_reference_rule_is_named():
    result = make_result("r", [6, 5, 4, 3, 2, 1], [0.01, 0.02, 0.1, 0.2, 0.3, 0.4], threshold=3, rule="reference")
    assert result.members("bloat") == ("L0H0",)  # d = 5 > 3; d = 3 is not (strict)
    bundle = fa.rank_scatter(result)
    assert "d > 3" in bundle.caption and "reference rule" in bundle.caption
    labelled = [t for trace in bundle.figure.data if (trace.name or "").startswith("layer ") for t in trace.text if t]
    assert sorted(labelled) == ["L0H0", "L1MLP"]


def test_joint_ablation_bars_values_and_ratios():
    # d = 5, 3, 1, -1, -3, -5 with threshold 3: bloats L0H0, L0H1 (alone 0.01, 0.02); heroes L1H1, L1MLP
    result = make_result("m", [6, 5, 4, 3, 2, 1], [0.01, 0.02, 0.1, 0.2, 0.3, 0.4], joint=0.45)
    bundle = fa.joint_ablation_bars(result)
    bars = [t for t in bundle.figure.data if t.type == "bar"]
    by_panel = {(t.xaxis or "x"): [] for t in bars}
    for t in bars:
        by_panel[t.xaxis or "x"].append(t)
    bloats, heroes = by_panel["x"], by_panel["x2"]
    assert list(bloats[0].x) == ["L0H0", "L0H1"] and list(bloats[0].y) == pytest.approx([0.01, 0.02])
    assert list(bloats[0].marker.color) == [LAYER_COLORS[0], LAYER_COLORS[0]]
    assert bloats[1].y[0] == pytest.approx(0.03) and bloats[2].y[0] == pytest.approx(0.45)  # sum of singles, joint
    assert list(heroes[0].x) == ["L1H1", "L1MLP"] and heroes[1].y[0] == pytest.approx(0.7)
    titles = [a.text for a in bundle.figure.layout.annotations]
    assert any("bloats: joint / mean single = 30.0×" in t.replace("<br>", " ") for t in titles)  # 0.45 / 0.015
    assert any("joint / sum = 15.00" in t.replace("<br>", " ") for t in titles)  # 0.45 / 0.03
    joint_rows = [r for r in bundle.rows if r["bar"] == "joint"]
    assert joint_rows[0]["ratio_to_mean"] == pytest.approx(30.0) and joint_rows[1]["ratio_to_sum"] == pytest.approx(0.45 / 0.7)


def test_joint_ablation_bars_without_members_or_ratios():
    nothing = make_result("m", [6, 5, 4, 3, 2, 1], [0.01, 0.02, 0.1, 0.2, 0.3, 0.4], threshold=10)
    bundle = fa.joint_ablation_bars(nothing)
    assert not [t for t in bundle.figure.data if t.type == "bar"]
    texts = [a.text for a in bundle.figure.layout.annotations]
    assert "no bloats" in texts and "no heroes" in texts
    # bloats whose single damages sum to <= 0: the ratios are undefined and the panel says why
    helped = make_result("m", [6, 5, 4, 3, 2, 1], [-0.02, 0.0, 0.1, 0.2, 0.3, 0.4])
    bundle = fa.joint_ablation_bars(helped)
    assert helped.joint_bloats.ratio_to_mean is None
    assert any("undefined" in a.text and "bloats" in a.text for a in bundle.figure.layout.annotations)


def _seed_results(task="sort"):
    C = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    return [
        make_result("s0", [1, 2, 3, 4, 5, 6], C, threshold=2, task=task),  # rho +1
        make_result("s1", [6, 5, 4, 3, 2, 1], C, threshold=2, task=task),  # rho -1; bloats L0H0, L0H1; heroes L1H1, L1MLP
        make_result("s2", [1, 2, 3, 4, 6, 5], C, threshold=2, task=task),  # rho = 1 - 6*2/(6*35)
        make_result("s3", [1, 1, 1, 1, 1, 1], C, threshold=2, task=task),  # G constant: rho undefined
    ]


def test_rho_strip_points_mean_std_and_highlight():
    results = _seed_results()
    summary = ares.summarize(results)
    bundle = fa.rho_strip(summary, highlight="s1")
    seeds, mean = bundle.figure.data[0], bundle.figure.data[1]
    assert list(seeds.customdata) == ["s0", "s1", "s2"]  # s3's undefined rho is left out ...
    rhos = [1.0, -1.0, 1 - 12 / 210]
    assert list(seeds.y) == pytest.approx(rhos)
    assert list(seeds.marker.color)[1] == CANDIDATE_COLOR and list(seeds.marker.size) == [8, 13, 8]
    assert mean.y[0] == pytest.approx(np.mean(rhos)) and mean.error_y.array[0] == pytest.approx(np.std(rhos))
    assert "1 model(s) with an undefined ρ" in bundle.caption  # ... and counted
    paper = [t for t in bundle.figure.data if t.name == "published mean [HHG]"]
    assert list(paper[0].y) == [0.27, 0.27]
    stat = [r for r in bundle.rows if r.get("statistic")][0]
    assert stat["n_models"] == 4 and stat["n_defined"] == 3 and stat["rho_std"] == pytest.approx(np.std(rhos))


def test_rho_strip_one_column_per_task_from_results():
    results = _seed_results("sort")[:2] + [twenty("r0"), twenty("r1")]
    bundle = fa.rho_strip(results, paper_reference=False)
    assert list(bundle.figure.layout.xaxis.ticktext) == ["sort<br>n = 2", "reverse<br>n = 2"]
    columns = [t for t in bundle.figure.data if t.name.endswith("seeds")]
    assert [round(float(np.mean(t.x))) for t in columns] == [0, 1]
    assert not [t for t in bundle.figure.data if t.name == "published mean [HHG]"]
    with pytest.raises(HeadLabError):
        fa.rho_strip([ares.summarize(results[:2]), results[2]])
    with pytest.raises(HeadLabError):
        fa.rho_strip([])


def test_rho_strip_names_settings_that_differ():
    a = ares.summarize(_seed_results()[:2])
    other = [make_result(r.model, r.G, r.C, threshold=3, task="sort") for r in _seed_results()[:2]]
    labels = fa._group_labels([a, ares.summarize(other)])
    assert labels == ["sort (threshold=2.0)", "sort (threshold=3.0)"]


def test_hero_bloat_heatmap_fractions_on_the_grid():
    results = _seed_results() + [make_result("s4", [6, 5, 4, 3, 2, 1], [0.0, 0.1, 0.2, 0.3, 0.4, 0.5], threshold=2, task="sort")]
    # 5 models: s1 and s4 have bloats L0H0, L0H1 and heroes L1H1, L1MLP; s3 (G tied: every rank_G 3.5,
    # so d = 2.5, 1.5, 0.5, -0.5, -1.5, -2.5) has bloat L0H0 and hero L1MLP
    summary = ares.summarize(results)
    bundle = fa.hero_bloat_heatmap(summary)
    heroes, bloats = bundle.figure.data
    assert list(heroes.x) == ["H0", "H1", "MLP"] and list(heroes.y) == [0, 1]
    hero_z, bloat_z = np.asarray(heroes.z, dtype=float), np.asarray(bloats.z, dtype=float)  # [layer, column]
    np.testing.assert_allclose(hero_z, [[0, 0, 0], [0, 0.4, 0.6]])
    np.testing.assert_allclose(bloat_z, [[0.6, 0.4, 0], [0, 0, 0]])
    assert heroes.text[1][2] == "3/5" and bloats.text[0][2] == "0/5"
    assert heroes.customdata[1][2] == "L1MLP" and bloats.customdata[0][1] == "L0H1"
    rows = {(r["kind"], r["component"]): r for r in bundle.rows}
    assert rows[("hero", "L1MLP")]["count"] == 3 and rows[("hero", "L1MLP")]["fraction"] == pytest.approx(0.6)
    assert len(bundle.rows) == 12  # 6 components x 2 kinds
    assert "d ≤ −2" in bundle.figure.layout.annotations[0].text and "d ≥ 2" in bundle.figure.layout.annotations[1].text


def test_hero_bloat_heatmap_heads_only_and_full_size():
    heads_only = [make_result(f"h{i}", [4, 3, 2, 1], [0.1, 0.2, 0.3, 0.4], threshold=2, with_mlp=False) for i in range(2)]
    bundle = fa.hero_bloat_heatmap(ares.summarize(heads_only))
    assert list(bundle.figure.data[0].x) == ["H0", "H1"]  # no MLP column
    # d = 3, 1, -1, -3 with threshold 2: L0H0 a bloat, L1H1 a hero, in both models
    np.testing.assert_allclose(np.asarray(bundle.figure.data[1].z, dtype=float), [[1, 0], [0, 0]])
    np.testing.assert_allclose(np.asarray(bundle.figure.data[0].z, dtype=float), [[0, 0], [0, 1]])
    assert "heads only" in bundle.caption
    full = fa.hero_bloat_heatmap(ares.summarize([twenty("a"), twenty("b")]))
    z = np.asarray(full.figure.data[1].z, dtype=float)
    assert z.shape == (4, 5) and z[0, 0] == 1.0 and z.sum() == 1.0  # L0H0 a bloat in both
    assert np.asarray(full.figure.data[0].z, dtype=float)[3, 4] == 1.0  # L3MLP a hero in both


def test_attribution_bundles_for_export():
    result = twenty("r0")
    bundles = fa.attribution_bundles(result, [ares.summarize([result, twenty("r1")])])
    names = [b.name for b in bundles]
    assert names == ["attribution-r0-rank-scatter", "attribution-r0-joint-ablation", "attribution-rho-strip",
                     "attribution-reverse-hero-bloat-frequency"]
    for bundle in bundles:
        data = json.loads(bundle.json_bytes())
        assert data["data"] and data["provenance"]["versions"]
        assert bundle.csv_bytes().count(b"\n") == len(bundle.rows) + 1
    assert fa.attribution_bundles() == []
