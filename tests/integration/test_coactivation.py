"""The co-activation pipeline [CVC]: defaults, labels, proposal, route analysis and closure splits on
hand-made inputs with known answers; the figures built from them; bad inputs; and, on the quick zoo,
the pipeline end to end (dense: closure with every metric; MoE: route-conditional) with verdicts
re-derived from the reported deltas and z-scores."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from core.ablation.spec import ConditionMetrics
from core.ablation.study import AblationResult
from core.bench.ising import gibbs_sample
from core.errors import HeadLabError
from core.heads import HeadSet
from core.pipelines.closure import split_closure
from core.pipelines.coactivation import (CoactivationReport, CoactivationSettings, IsingProposal, check_ks, coactivation,
                                         default_ks, default_settings, default_size_bounds, default_top_k, propose,
                                         route_analysis, router_matrix, supervised_labels)
from core.stats.controls import ControlSets
from core.stats.inference import DAMAGE_SIGN, METRICS, MIN_CLOSURE_CONTROLS
import core.pipelines.coactivation
import core.stats.routes
from core.stats.routes import null_z, unconverged_strata
from core.stats.spins import binarize_at_median

N_HEAD = 4


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    """Small fits: one thread is fastest on shared cores (restored afterwards)."""
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(limits=1):
        yield
    torch.set_num_threads(before)


def _blocks(n_blocks: int = 3, size: int = 4, coupling: float = 0.5) -> np.ndarray:
    """J [n, n] with equal positive couplings inside each block of `size` spins, none across."""
    n = n_blocks * size
    block = np.arange(n) // size
    J = np.where(block[:, None] == block[None, :], coupling, 0.0)
    np.fill_diagonal(J, 0.0)
    return J


# a fixed shuffle of 12 heads (3 layers x 4 heads), so the planted communities do not follow the layers
PERM = np.array([5, 0, 10, 3, 8, 1, 11, 6, 2, 9, 4, 7])


@pytest.fixture(scope="module")
def planted():
    """Spins of 3 planted communities of 4 heads (shuffled over the 3 x 4 grid) and their labels."""
    J = _blocks()
    spins = gibbs_sample(J, np.zeros(12), 3000, seed=3)[:, PERM]  # column f holds planted spin PERM[f]
    community = PERM // 4                                                     # [head] planted community of head f
    labels = {divmod(f, N_HEAD): "abc"[community[f]] for f in range(12)}
    return spins, community, labels


# ---------------------------------------------------------------- defaults and labels


def test_small_model_defaults():
    assert [default_top_k(n) for n in (8, 36, 256)] == [8, 16, 46]
    assert default_ks(8) == (2, 3, 4) and default_ks(16) == (4, 6, 8) and default_ks(36) == (4, 6, 8, 10, 12)
    assert default_ks(256) == (4, 6, 8, 10, 12)
    # max: at most half the heads, and C(n - max, max) >= 5 any-layer control sets (C(4, 4) = 1, C(5, 3) = 10)
    assert [default_size_bounds(n) for n in (8, 16, 36, 256)] == [(2, 3), (2, 7), (4, 12), (4, 12)]
    assert default_size_bounds(8, n_controls=1) == (2, 4)
    assert default_settings(8) == {"top_k": 8, "ks": [2, 3, 4], "min_size": 2, "max_size": 3}


def test_check_ks():
    assert check_ks([6, 4, 6], 36) == (4, 6)
    with pytest.raises(HeadLabError, match=r"k = 8, 9 is not possible with 8 heads; choose numbers of clusters between 2 and 7"):
        check_ks([4, 8, 9], 8)
    with pytest.raises(HeadLabError, match="no k given"):
        check_ks([], 8)


def test_supervised_labels_take_the_top_k_heads_and_rename_unspecialized():
    classes = np.array([["self", "unspecialized", "first-token"], ["induction", "previous-token", "unspecialized"]],
                       dtype=object)
    ranking = [(1, 2), (0, 0), (1, 0), (0, 1), (0, 2), (1, 1)]
    assert supervised_labels(classes, ranking, 3) == {(1, 2): "unclassified", (0, 0): "self", (1, 0): "induction"}
    with pytest.raises(HeadLabError, match="not possible with 6 heads"):
        supervised_labels(classes, ranking, 7)
    with pytest.raises(HeadLabError, match="choose 2 .. 6"):
        supervised_labels(classes, ranking, 1)


# ---------------------------------------------------------------- the proposal on planted communities


def test_propose_recovers_planted_communities(planted):
    spins, community, labels = planted
    p = propose(spins, labels, CoactivationSettings(ks=(2, 3, 4), min_size=2, max_size=6), n_head=N_HEAD)
    assert p.k == p.scores.best_k == 3 and p.k_rule == "best ARI"
    assert p.scores.metric(3).ari == pytest.approx(1.0) and p.scores.metric(3).purity == pytest.approx(1.0)
    # every community of the candidate clustering is one planted community
    found = {frozenset(c.heads) for c in p.selection.clusters}
    planted_sets = {frozenset(divmod(int(f), N_HEAD) for f in np.flatnonzero(community == b)) for b in range(3)}
    assert found == planted_sets
    # the candidate: all pure, size 4 -> the most isolated community, computed here by hand from the fitted J
    a = np.abs(p.fit.J)

    def isolation(b):
        inside = np.flatnonzero(community == b)
        outside = np.flatnonzero(community != b)
        iu = np.triu_indices(len(inside), 1)
        return a[np.ix_(inside, inside)][iu].mean() / a[np.ix_(inside, outside)].mean()

    best = max(range(3), key=isolation)
    assert set(p.selection.candidate.heads) == {divmod(int(f), N_HEAD) for f in np.flatnonzero(community == best)}
    assert p.selection.candidate.combined_score == pytest.approx(isolation(best) * 4 / 6)
    assert p.selection.candidate.purity == 1.0


def test_propose_fixed_k_and_json_roundtrip(planted):
    spins, _, labels = planted
    p = propose(spins, labels, CoactivationSettings(ks=(2, 3), k=4, min_size=2, max_size=6), n_head=N_HEAD)
    assert p.k == 4 and p.k_rule == "fixed" and p.selection.k == 4 and len(p.selection.clusters) == 4
    back = IsingProposal.from_json(json.loads(json.dumps(p.to_json())))
    assert back.to_json() == p.to_json()


def _stops_after_one_iteration(monkeypatch, module):
    """The module's Ising fit, cut off after one iteration: a real fit that has not converged."""
    real = module.fit_ising_pseudolikelihood

    def one_step(*args, **kwargs):
        return real(*args, **{**kwargs, "max_iter": 1})

    monkeypatch.setattr(module, "fit_ising_pseudolikelihood", one_step)


def test_an_unconverged_fit_is_refused_unless_asked(planted, monkeypatch):
    spins, _, labels = planted
    settings = CoactivationSettings(ks=(2, 3), min_size=2, max_size=6)
    assert propose(spins, labels, settings, n_head=N_HEAD).fit.converged is True
    _stops_after_one_iteration(monkeypatch, core.pipelines.coactivation)
    with pytest.raises(HeadLabError, match="did not converge in 1 iterations.*--allow-unconverged"):
        propose(spins, labels, settings, n_head=N_HEAD)
    kept = propose(spins, labels, replace(settings, allow_unconverged=True), n_head=N_HEAD)
    assert kept.fit.converged is False and kept.fit.n_iter == 1


def test_unconverged_strata_are_refused_unless_asked(routed, monkeypatch):
    spins, router, labels = routed
    settings = CoactivationSettings(ks=(2, 3), n_strata=2, n_null=2)
    _stops_after_one_iteration(monkeypatch, core.stats.routes)
    with pytest.raises(HeadLabError, match="did not converge.*--allow-unconverged"):
        route_analysis(spins, router, labels, settings, n_head=N_HEAD)
    kept = route_analysis(spins, router, labels, replace(settings, allow_unconverged=True), n_head=N_HEAD)
    assert kept.statistic.n_unconverged == 2 and not any(s.converged for s in kept.statistic.per_stratum)
    assert unconverged_strata(kept.statistic, kept.null) == 2 + 2 * 2  # observed strata + 2 draws of 2 strata


def test_propose_bad_inputs(planted):
    spins, _, labels = planted
    with pytest.raises(HeadLabError, match="k = 12 is not possible with 12 heads"):
        propose(spins, labels, CoactivationSettings(ks=(3, 12)), n_head=N_HEAD)
    with pytest.raises(HeadLabError, match="k = 1 clusters is not possible"):
        propose(spins, labels, CoactivationSettings(ks=(3,), k=1), n_head=N_HEAD)
    with pytest.raises(HeadLabError, match="10 examples for 12 heads"):
        propose(spins[:10], labels, CoactivationSettings(ks=(3,)), n_head=N_HEAD)
    flat = spins.copy()
    flat[:, 5] = -1  # head L1H1 never fires
    with pytest.raises(HeadLabError, match=r"never change sign \(L1H1\)"):
        propose(flat, labels, CoactivationSettings(ks=(3,)), n_head=N_HEAD)
    kept = propose(flat, labels, CoactivationSettings(ks=(3,), min_size=2, max_size=6), n_head=N_HEAD, constant="zero")
    assert kept.fit.constant_heads == (5,) and not kept.fit.J[5].any()


def test_constant_signal_is_named_when_binarizing():
    signal = np.random.default_rng(0).random((50, 6))
    signal[:, 4] = 0.25  # a head whose max attention never varies
    with pytest.raises(HeadLabError, match=r"never change sign \(L1H1\)"):
        binarize_at_median(signal, n_head=3)


# ---------------------------------------------------------------- route-conditional analysis


@pytest.fixture(scope="module")
def routed():
    """Stratum A (router blob 0): 2 planted communities of 4 heads; stratum B (blob 1): independent spins."""
    rng = np.random.default_rng(7)
    a = gibbs_sample(_blocks(2, 4, 0.6), np.zeros(8), 600, seed=5)
    b = np.where(rng.random((400, 8)) < 0.5, 1, -1).astype(np.int8)
    spins = np.concatenate([a, b])                                             # [1000, 8]
    router = np.concatenate([rng.normal(0, 0.05, (600, 4)) + [1, 0, 1, 0],
                             rng.normal(0, 0.05, (400, 4)) + [0, 1, 0, 1]])    # [example, layer * expert]
    labels = {divmod(f, N_HEAD): "ab"[f // 4] for f in range(8)}              # community = layer here
    return spins, router, labels


def test_route_analysis_finds_the_stratum_and_scores_it_against_its_null(routed):
    spins, router, labels = routed
    r = route_analysis(spins, router, labels, CoactivationSettings(ks=(2, 3), n_strata=2, n_null=4), n_head=N_HEAD)
    strata = np.asarray(r.strata)
    assert len(set(strata[:600])) == 1 and len(set(strata[600:])) == 1 and strata[0] != strata[-1]
    assert sorted(r.sizes) == [400, 600] and r.sizes[strata[0]] == 600
    assert r.discovery_stratum == strata[0]
    found = {s.stratum: s for s in r.statistic.per_stratum}
    assert found[strata[0]].ari == pytest.approx(1.0) and r.statistic.max_ari == pytest.approx(1.0)
    assert r.null.z_max == pytest.approx(null_z(1.0, r.null.null_max))
    assert r.null.null_max_std == pytest.approx(np.std(r.null.null_max))
    assert len(r.null.null_max) == 4


def test_router_matrix_needs_routers():
    with pytest.raises(HeadLabError, match="this model has no routers"):
        router_matrix(None)
    assert router_matrix(np.arange(24.0).reshape(2, 3, 4)).shape == (2, 12)


# ---------------------------------------------------------------- closure statistics per split


def _cm(label, loss, top1, top5, logit):
    return ConditionMetrics(label, None, loss, top1, top5, logit)


def _result(candidate: ConditionMetrics, controls: list[ConditionMetrics]) -> AblationResult:
    clean = _cm("clean", [1.0, 1.0, 1.0, 1.0], [1, 1, 1, 1], [1, 1, 1, 1], [5.0, 5.0, 5.0, 5.0])
    sets = ControlSets("matched", tuple(HeadSet(((0, i),)) for i in range(len(controls))), 123, len(controls), 10)
    return AblationResult(HeadSet(((0, 9),)), "zero", clean, candidate, tuple(controls), sets, None, {}, {}, (), {})


SHIFTS = [0.0, 0.1, 0.2, 0.3, 0.4]  # control i: loss + s_i and target logit - s_i on every example


def _controls():
    return [_cm(f"c{i}", np.full(4, 1.0 + s), np.ones(4), np.ones(4), np.full(4, 5.0 - s)) for i, s in enumerate(SHIFTS)]


def test_split_closure_by_hand():
    # the candidate breaks examples 0 and 1 only
    cand = _cm("cand", [3.0, 3.0, 1.0, 1.0], [0, 0, 1, 1], [0, 0, 1, 1], [0.0, 0.0, 5.0, 5.0])
    result = _result(cand, _controls())
    on = split_closure(result, np.array([True, True, False, False]), "on")
    off = split_closure(result, np.array([2, 3]), "off")
    every = split_closure(result)
    sd = np.std(SHIFTS)  # population std of the control deltas, 0.1414
    assert (on.n_examples, off.n_examples, every.n_examples) == (2, 2, 4)
    assert on.stats["loss"]["candidate_delta"] == pytest.approx(2.0)
    assert on.z("loss") == pytest.approx((2.0 - 0.2) / sd)
    assert on.z("target_logit") == pytest.approx((-5.0 + 0.2) / sd)
    assert on.stats["top1"]["control_deltas"] == [0.0] * 5 and on.z("top1") is None  # no spread: no z
    assert every.stats["loss"]["candidate_delta"] == pytest.approx(1.0)
    assert every.z("loss") == pytest.approx((1.0 - 0.2) / sd)
    assert on.verdicts["paper"].label == "pass" and on.verdicts["reference"].label == "pass"
    assert off.stats["loss"]["candidate_delta"] == 0.0
    assert off.verdicts["paper"].label == "fail" and off.verdicts["reference"].label == "fail"
    assert on.kind == "matched" and on.split == "on"
    with pytest.raises(HeadLabError, match="holds no examples"):
        split_closure(result, np.zeros(4, dtype=bool), "on")


def test_split_closure_fails_in_the_wrong_direction():
    # ablating the candidate makes the model better: loss down far beyond the controls
    cand = _cm("cand", [0.5] * 4, [1] * 4, [1] * 4, [6.0] * 4)
    s = split_closure(_result(cand, _controls()))
    assert s.z("loss") == pytest.approx((-0.5 - 0.2) / np.std(SHIFTS))
    assert s.verdicts["paper"].label == "fails in the wrong direction"
    assert s.verdicts["reference"].label == "fails in the wrong direction"


def test_split_closure_with_one_control_is_inconclusive():
    # one control: its spread is 0 by construction, so even a huge |z| decides nothing
    cand = _cm("cand", [3.0] * 4, [0] * 4, [0] * 4, [0.0] * 4)
    s = split_closure(_result(cand, _controls()[1:2]))
    assert s.z("target_logit") is None  # no spread, no z (never a z of 1e8 off a floored spread)
    assert s.verdicts["paper"].label == s.verdicts["reference"].label == "inconclusive"
    assert "only 1 distinct control set" in s.verdicts["paper"].reasons[0]


# ---------------------------------------------------------------- a report and its figures (hand-made)


def _report(planted_fixture, closure=None, route=None) -> CoactivationReport:
    spins, _, labels = planted_fixture
    p = propose(spins, labels, CoactivationSettings(ks=(2, 3, 4), min_size=2, max_size=6), n_head=N_HEAD)
    classes = tuple(tuple(labels[(l, h)] for h in range(N_HEAD)) for l in range(3))
    return CoactivationReport(model="hand-made", revision="r", tokens=0, probe_spec={"task": "induction"}, shape=(3, N_HEAD),
                              settings={"class_threshold": 30.0}, classes=classes, labels=labels, proposal=p,
                              route=route, closure=closure, notes=(), provenance={})


def test_report_json_roundtrip(planted):
    report = _report(planted)
    back = CoactivationReport.from_json(json.loads(json.dumps(report.to_json())))
    assert back.to_json() == report.to_json()
    assert back.candidate == report.candidate and len(report.candidate) == 4
    assert report.summary()["k"] == 3
    with pytest.raises(HeadLabError, match="no community 9"):
        report.community(9)


def test_figures_show_the_report(planted):
    from core.figures.coactivation import (ari_by_k_chart, candidate_table, cluster_order, coactivation_bundles,
                                           coupling_graph, coupling_heatmap, default_edge_threshold)

    report = _report(planted)
    J = report.J
    order = cluster_order(report.cluster_labels)
    heat = coupling_heatmap(report)
    np.testing.assert_array_equal(np.asarray(heat.figure.data[0].z), J[np.ix_(order, order)])
    assert np.all(np.diff(np.asarray(report.cluster_labels)[order]) >= 0)  # communities are contiguous blocks
    threshold = default_edge_threshold(J)
    graph = coupling_graph(report, threshold)
    edges = [r for r in graph.rows if r["kind"] == "edge"]
    iu = np.triu_indices(12, 1)
    assert len(edges) == int((np.abs(J[iu]) > threshold).sum())
    nodes = [r for r in graph.rows if r["kind"] == "node"]
    assert sum(r["candidate"] for r in nodes) == 4
    clicked = {d for t in graph.figure.data if t.mode == "markers+text" for d in t.customdata}
    assert clicked == {f"L{l}H{h}" for l in range(3) for h in range(N_HEAD)}
    by_class = coupling_graph(report, 0.0, "class")
    assert {t.name for t in by_class.figure.data if t.mode == "markers+text"} == {"a", "b", "c"}
    ari = ari_by_k_chart(report)
    assert [r["ari"] for r in ari.rows] == [m.ari for m in report.proposal.scores.metrics]
    table = candidate_table(report)
    assert len(table.rows) == 3 and sum(r["candidate"] for r in table.rows) == 1
    assert [b.name for b in coactivation_bundles(report)] == ["coactivation-graph", "coactivation-J",
                                                             "coactivation-ari-by-k", "coactivation-candidates"]
    assert b"head_name" in graph.csv_bytes() and json.loads(heat.json_bytes())["provenance"]["model"] == "hand-made"


# ---------------------------------------------------------------- the quick zoo, end to end


def _paper_rule(split) -> str:
    """The paper rule re-derived from the reported deltas and z-scores (METHODS.md, headline logit)."""
    if len(split.stats["loss"]["control_deltas"]) < MIN_CLOSURE_CONTROLS or split.stats["target_logit"]["z"] is None:
        return "inconclusive"
    d = {m: split.stats[m]["candidate_delta"] for m in METRICS}
    z = {m: split.stats[m]["z"] for m in METRICS}
    if d["loss"] < 0 and z["loss"] < -1.8:
        return "fails in the wrong direction"
    damaging = all(DAMAGE_SIGN[m] * d[m] > 0 for m in METRICS)
    return "pass" if damaging and z["target_logit"] < -1.8 else "fail"


def _reference_rule(split) -> str:
    if len(split.stats["loss"]["control_deltas"]) < MIN_CLOSURE_CONTROLS or split.stats["target_logit"]["z"] is None:
        return "inconclusive"
    d = {m: split.stats[m]["candidate_delta"] for m in METRICS}
    z = {m: split.stats[m]["z"] for m in METRICS}
    if d["loss"] < 0 and z["loss"] < -1.8:
        return "fails in the wrong direction"
    damaging = all(DAMAGE_SIGN[m] * d[m] > 0 for m in METRICS)
    outside = any(DAMAGE_SIGN[m] * d[m] > max(DAMAGE_SIGN[m] * np.asarray(split.stats[m]["control_deltas"]))
                  for m in METRICS)
    return "pass" if damaging and outside else "fail"


def _check_split(split, n_controls: int = 5) -> None:
    for m in METRICS:
        st = split.stats[m]
        ctrl = np.asarray(st["control_deltas"])
        assert len(ctrl) <= n_controls
        if ctrl.std() <= 1e-6 * max(1.0, np.abs(ctrl).max()):  # controls that do not vary: no z
            assert st["z"] is None
        else:
            assert st["z"] == pytest.approx((st["candidate_delta"] - ctrl.mean()) / ctrl.std())
    assert split.verdicts["paper"].label == _paper_rule(split)
    assert split.verdicts["reference"].label == _reference_rule(split)


N_ZOO = 128


@pytest.mark.zoo
def test_dense_induction_model_end_to_end(quick_zoo):
    from core.model.refs import ModelRef
    from core.tasks.specs import probe_spec

    report = coactivation(ModelRef.parse("induction-neox"), None, probe_spec("induction", N_ZOO, 64))
    assert report.shape == (3, 12) and len(report.labels) == 16
    assert report.settings["ks"] == [4, 6, 8, 10, 12] and (report.settings["min_size"], report.settings["max_size"]) == (4, 12)
    assert report.proposal.k == report.proposal.scores.best_k and report.proposal.n_examples == N_ZOO
    assert report.proposal.scores.metric(report.proposal.k).ari == max(m.ari for m in report.proposal.scores.metrics)
    cand = report.proposal.selection.candidate
    assert cand.combined_score == max(c.combined_score for c in report.proposal.selection.clusters
                                      if c.combined_score is not None)
    closure = report.closure
    assert closure.selection == report.candidate and closure.n_controls == 5
    kinds = {s.kind for s in closure.splits}
    assert kinds | set(closure.skipped) == {"matched", "any-layer"} and kinds
    for s in closure.splits:
        assert s.split == "all" and s.n_examples == N_ZOO
        _check_split(s)
    back = CoactivationReport.from_json(json.loads(json.dumps(report.to_json())))
    assert back.to_json() == report.to_json()


@pytest.mark.zoo
def test_moe_route_conditional_end_to_end(quick_zoo):
    from core.model.refs import ModelRef
    from core.tasks.specs import probe_spec

    report = coactivation(ModelRef.parse("induction-olmoe"), None, probe_spec("induction", N_ZOO, 64),
                          CoactivationSettings(route_conditional=True))
    r = report.route
    assert r.n_strata == 4 and sum(r.sizes) == N_ZOO and len(r.strata) == N_ZOO
    assert list(r.sizes) == np.bincount(r.strata, minlength=4).tolist()
    best = max(r.statistic.per_stratum, key=lambda s: (s.ari, -s.stratum))
    assert r.discovery_stratum == best.stratum and r.statistic.max_ari == best.ari
    assert r.null.z_max == pytest.approx(null_z(r.statistic.max_ari, r.null.null_max)) and len(r.null.null_max) == 10
    assert report.proposal.n_examples == r.sizes[r.discovery_stratum]
    on = r.sizes[r.discovery_stratum]
    for s in report.closure.splits:
        assert s.n_examples == {"all": N_ZOO, "on": on, "off": N_ZOO - on}[s.split]
        _check_split(s)
    assert {s.split for s in report.closure.splits} == {"all", "on", "off"}


@pytest.mark.zoo
def test_bad_inputs_on_the_zoo(quick_zoo):
    from core.__main__ import main
    from core.model.refs import ModelRef
    from core.tasks.specs import probe_spec

    dense = ModelRef.parse("induction-neox")
    with pytest.raises(HeadLabError, match="this model has no routers"):
        coactivation(dense, None, probe_spec("induction", N_ZOO, 64),
                     CoactivationSettings(route_conditional=True, run_closure=False))
    with pytest.raises(HeadLabError, match="32 examples for 36 heads"):
        coactivation(dense, None, probe_spec("induction", 32, 64), CoactivationSettings(run_closure=False))
    with pytest.raises(HeadLabError, match="k = 40 is not possible with 36 heads"):
        coactivation(dense, None, probe_spec("induction", N_ZOO, 64), CoactivationSettings(ks=(4, 40), run_closure=False))
    with pytest.raises(HeadLabError, match="k = 8 is not possible with 8 heads"):
        coactivation(ModelRef.parse("induction-olmoe"), None, probe_spec("induction", N_ZOO, 64),
                     CoactivationSettings(ks=(2, 8), run_closure=False))
    assert main(["coactivation", "induction-neox", "--n", str(N_ZOO), "--route-conditional", "--no-closure"]) == 2


@pytest.mark.zoo
def test_natural_text_probe_runs(quick_zoo):
    from core.model.refs import ModelRef
    from core.tasks.specs import probe_spec

    report = coactivation(ModelRef.parse("induction-olmoe"), None, probe_spec("text", 64, 64),
                          CoactivationSettings(run_closure=False))
    assert report.probe_spec["task"] == "text" and report.proposal.n_examples == 64 and report.closure is None


def test_a_one_checkpoint_model_labels_the_top_k_heads_by_its_own_pr(tmp_path, monkeypatch):
    """A pretrained model has no training trajectory, so no PR-integral: the labelled heads are the top-K by
    the PR at its one checkpoint (pr_per_head on the same pass), and the report says so."""
    from core.model.refs import ModelRef
    from core.probe import head_stats
    from core.model.refs import resolve_checkpoint
    from core.stats.spectral import pr_per_head, rank_heads
    from core.tasks.specs import probe_spec
    from tests.tiny_models import save_tiny_model

    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path / "home"))
    ref = ModelRef.parse(str(save_tiny_model("gpt_neox", tmp_path / "my-model")))
    spec = probe_spec("induction", 24, 16)
    report = coactivation(ref, None, spec, CoactivationSettings(ks=(2, 3), top_k=4, run_closure=False))
    stats = head_stats(ref, resolve_checkpoint(ref, None), spec.build())
    top = rank_heads(pr_per_head(stats.z_query))[:4]
    assert sorted(report.labels) == sorted(top)
    assert any(note.startswith("one checkpoint: the labelled heads are the top-K by PR") for note in report.notes)
