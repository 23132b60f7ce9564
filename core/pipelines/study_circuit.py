"""The IOI study's circuit stages (`python -m core study MODEL --task ioi`), each a small JSON record:

- the disposer on a discovered edge circuit: its heads ablated as a group against matched-random head groups
  (core.ablation.study, as recipe.ablate does for the induction candidate), and the same heads patched from the
  ABC prompts against the same kind of groups (core.ablation.patching.group_patching, on the logit difference);
- path patching from the S-inhibition heads into the top heads' queries, keys and values (the IOI paper's test of
  its S-inhibition -> name mover route, core.ablation.patching.paths);
- the proposers (pattern screen, co-activation, gradient; core/pipelines/proposers.py) on the IOI prompts, each
  disposed by the same closure test;
- [HHG]'s gradient-vs-causal ranks over the heads: G the IO loss's gradient norm per head, C the logit difference
  a head loses when it alone is patched from the ABC prompts;
- ACDC's measured cost on this graph: seconds per tested edge (one patched forward over the pairs) times edges.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from core.ablation.edges import EdgeSettings
from core.ablation.edges.runs import check_edge_model, edge_chunks, mean_value
from core.ablation.patching import PatchSettings
from core.ablation.patching.activation import activation_patching, group_patching
from core.ablation.patching.paths import COMPONENTS, path_patching
from core.ablation.study import AblationSettings, ablation_study, summarize_ablation
from core.errors import HeadLabError
from core.heads import HeadSet, head_name
from core.model.hooks import model_shape
from core.pipelines.attribution_results import DEFAULT_THRESHOLD, classify_components, rank_differences
from core.pipelines.proposers import DISPOSER, proposers_vs_disposer
from core.stats.controls import matched_random_controls
from core.stats.inference import spearman
from core.tasks.counterfactual import PatchPair

Progress = Optional[Callable[[int, int], None]]
SIGNIFICANCE = 0.05  # the p at or below which a group beats its random controls
PATH_RECEIVERS = 3   # the top heads (by activation patching) whose q, k and v inputs are path-patched
ACDC_TRIALS = 3      # patched forwards timed for ACDC's cost
# MIB's published IOI figures (other models), as far as they could be checked (issue 42 quoted them secondhand)
MIB_CONTEXT = {
    "models": "GPT-2 small and Qwen2.5-0.5B (other models, counterfactual ablation)",
    "eap_ig_inputs_cpr": {"gpt2-small": 1.85, "qwen2.5-0.5b": 1.63},
    "random_cpr": {"gpt2-small": 0.25, "qwen2.5-0.5b": 0.28},
    "random_cmd_secondhand": {"gpt2-small": 0.75, "qwen2.5-0.5b": 0.72},
    "status": "MIB's evaluation code (hannamw/MIB-circuit-track at b759df3: MIB_circuit_track/evaluation.py and "
              "print_results.py) confirms the edge fractions (0.1% to 100%), the trapezoid areas on the linear fraction "
              "axis and the rankings (CPR from the top edges by signed score, CMD by |score|), which HeadLab follows; "
              "the figures themselves were not read from the paper's table (Mueller et al. 2025, arXiv 2504.13151: "
              "the tools here return only its opening): a third-party transcription of that table agrees on "
              "EAP-IG-inputs CPR 1.85 / 1.63 and random CPR 0.25 / 0.28 and CMD 0.75 / 0.72, so they stay secondhand",
}


def heads_of(names: Sequence[str]) -> HeadSet:
    """A HeadSet from names like "L23H3"."""
    return HeadSet(tuple(tuple(int(x) for x in name[1:].split("H")) for name in names))


def control_kind(heads: HeadSet, n_layers: int, n_heads: int) -> tuple[str, str]:
    """("matched", "") when a disjoint matched control exists, else ("any-layer", why not)."""
    try:
        matched_random_controls(heads, n_layers, n_heads, 1)
    except HeadLabError as exc:
        return "any-layer", str(exc)
    return "matched", ""


def patch_verdict(stats: dict) -> str:
    """A patched group's verdict from its rank p among the random groups (in the direction's sense)."""
    return (f"beats its random groups (p {stats['p']:.3g} <= {SIGNIFICANCE})" if stats["p"] <= SIGNIFICANCE
            else f"not distinguishable from its random groups (p {stats['p']:.3g} > {SIGNIFICANCE})")


def group_disposer(model: Any, pair: PatchPair, names: Sequence[str], n_controls: int, seed: int,
                   progress: Progress = None, allow_small_gap: bool = False) -> dict:
    """A head set ablated as a group on the clean IOI prompts (zero ablation; IO loss, top-1, IO logit) against
    matched-random head groups, with the recipe and closure verdicts; and the same heads patched together from
    the ABC prompts into the clean run (the logit difference), against the same kind of random groups."""
    n_layers, n_heads, _ = model_shape(model)
    heads = heads_of(names)
    if 2 * len(heads) > n_layers * n_heads:
        return {"heads": [head_name(h) for h in heads], "not_tested": f"{len(heads)} of the model's {n_layers * n_heads} "
                "heads: more than half, so no disjoint random group of the same size exists"}
    kind, why = control_kind(heads, n_layers, n_heads)
    settings = AblationSettings(n_controls=n_controls, controls=kind, seed=seed, n_boot=500)
    result = ablation_study(model, pair.clean, heads, settings, progress=progress)
    summary = summarize_ablation(result)
    loss = summary["metrics"].get("loss", {})
    patched = group_patching(model, pair, heads, PatchSettings(direction="noise", n_controls=n_controls, controls=kind,
                                                              control_seed=seed, allow_small_gap=allow_small_gap))
    return {"heads": [head_name(h) for h in heads], "controls": kind,
            "controls_note": f"matched controls impossible ({why})" if why else "",
            "ablation": {"summary": summary, "loss_clean": loss.get("clean"),
                         "loss_ablated": None if loss.get("clean") is None else loss["clean"] + loss["candidate_delta"]},
            "patching": {"score": patched.score, "control_scores": list(patched.control_scores),
                         "upper_bound_score": patched.upper_bound_score, "stats": patched.stats,
                         "verdict": patch_verdict(patched.stats),
                         "meaning": "logit difference left when these heads take their ABC-prompt outputs "
                                    "(clean 1, ABC 0); lower = more damage"}}


def path_senders(roles: dict | None, receiver: tuple[int, int], top_heads: Sequence[str]) -> tuple[HeadSet, str]:
    """The senders into one receiver: the heads the role table labels S-inhibition in earlier layers (the IOI
    paper's route), else the activation-patching top heads in earlier layers."""
    labelled = [row["head"] for row in (roles or {}).get("table", []) if row["role"] == "S-inhibition"]
    earlier = [n for n in labelled if heads_of([n]).heads[0][0] < receiver[0]]
    if earlier:
        return heads_of(earlier), "S-inhibition heads (role table) before the receiver"
    earlier = [n for n in top_heads if heads_of([n]).heads[0][0] < receiver[0]]
    return heads_of(earlier), "activation patching's top heads before the receiver"


def path_record(model: Any, pair: PatchPair, patching: dict, roles: dict | None, n_controls: int, seed: int,
                progress: Progress = None, allow_small_gap: bool = False) -> dict:
    """Path patching (denoising: clean senders into the ABC run) into each top head's q, k and v alone, the
    senders against matched-random sender groups in the same layers."""
    exact = [name for name, _, is_exact in patching["top_heads"] if is_exact]
    receivers = [heads_of([n]).heads[0] for n in exact[:PATH_RECEIVERS]]
    settings = PatchSettings(n_controls=n_controls, control_seed=seed, allow_small_gap=allow_small_gap)
    n_layers, n_heads, _ = model_shape(model)
    rows, notes = [], []
    total = len(receivers) * len(COMPONENTS)
    for receiver in receivers:
        senders, chosen = path_senders(roles, receiver, exact)
        if not len(senders):
            notes.append(f"{head_name(receiver)}: no sender head before layer {receiver[0]}; not path-patched")
            continue
        _, why = control_kind(senders, n_layers, n_heads)
        if why:  # path patching's controls are matched (same layers, so before the receiver): none exists here
            notes.append(f"{head_name(receiver)}: senders {senders} not path-patched: no matched sender controls "
                         f"({why.split(';')[0]})")
            continue
        for component in COMPONENTS:
            result = path_patching(model, pair, senders, HeadSet((receiver,)), (component,), settings)
            rows.append({"receiver": head_name(receiver), "component": component,
                         "senders": [head_name(h) for h in senders], "senders_chosen": chosen,
                         "score": result.score, "stats": result.stats, "verdict": patch_verdict(result.stats),
                         "identity_max_diff": result.identity_max_diff})
            if progress is not None:
                progress(len(rows), total)
    return {"rows": rows, "notes": notes, "direction": settings.direction, "metric": settings.metric,
            "meaning": "share of the clean-ABC logit difference restored when only what the senders send into the "
                       "receiver's input (directly or through MLPs) comes from the clean prompts"}


def proposers_record(ref: Any, spec: Any, n_controls: int, device: str, dtype: str) -> dict:
    """core.pipelines.proposers on the IOI prompts (spec: the clean IoiSpec; its pattern keys are S1 and S1 + 1, so
    the pattern screen's induction heads are the heads at S2 attending to S1 + 1), each proposal disposed by the
    same any-layer closure test on the IO loss, top-1 and IO logit."""
    report = proposers_vs_disposer(ref, None, spec, disposer=replace(DISPOSER, n_controls=n_controls), device=device,
                                   dtype=dtype)
    return {"rows": report.rows(), "survivors": list(report.survivors()), "size": report.provenance["size"],
            "controls": report.provenance["controls"], "n_controls": report.provenance["n_controls"],
            "gradient": report.provenance["gradient"]}


def gradient_vs_causal(gradient: np.ndarray, damage: np.ndarray, threshold: float = DEFAULT_THRESHOLD) -> dict:
    """[HHG]'s comparison over heads: Spearman rho of G and C, rank differences d = rank_G - rank_C, heroes
    (d <= -threshold: small gradient, large effect) and bloats (d >= threshold). gradient, damage: [layer, head]."""
    g = np.asarray(gradient, dtype=np.float64)
    c = np.asarray(damage, dtype=np.float64)
    if g.shape != c.shape or g.ndim != 2:
        raise HeadLabError(f"gradient and damage must be [layer, head] arrays of one shape, got {g.shape} and {c.shape}.")
    n_heads = g.shape[1]
    names = [head_name(divmod(i, n_heads)) for i in range(g.size)]
    rank_g, rank_c, d = rank_differences(g.ravel(), c.ravel())
    classes = classify_components(d, threshold, "paper")
    rho, p = spearman(g.ravel(), c.ravel())

    def top(kind: str, sign: int) -> list:
        idx = [i for i, k in enumerate(classes) if k == kind]
        idx.sort(key=lambda i: sign * d[i])
        return [[names[i], float(d[i]), float(g.flat[i]), float(c.flat[i])] for i in idx[:8]]

    return {"spearman": rho, "spearman_p": p, "threshold": float(threshold), "n_heads": int(g.size),
            "n_heroes": classes.count("hero"), "n_bloats": classes.count("bloat"),
            "heroes": top("hero", 1), "bloats": top("bloat", -1), "rank_G": np.asarray(rank_g).tolist(),
            "rank_C": np.asarray(rank_c).tolist()}


def hhg_record(model: Any, pair: PatchPair, gradient: Sequence, progress: Progress = None,
               allow_small_gap: bool = False) -> dict:
    """C per head: the share of the logit difference lost when the head alone takes its ABC-prompt output
    (1 - the noising patching score, every head exact); compared with G by gradient_vs_causal."""
    noised = activation_patching(model, pair, PatchSettings(direction="noise", allow_small_gap=allow_small_gap), progress)
    damage = 1.0 - np.asarray(noised.scores)
    return {**gradient_vs_causal(np.asarray(gradient), damage), "damage": damage.tolist(),
            "causal": "1 - noising patching score (logit difference lost, share of the clean-ABC gap)",
            "gradient_measure": "IO cross-entropy at END, W_V + W_O block norm / sqrt(count) ([HHG] paper default)"}


def acdc_cost(model: Any, pair: PatchPair, edge_settings: EdgeSettings) -> dict:
    """ACDC's cost here, measured: it tests edges one at a time, one patched forward over every pair per tested
    edge (core/ablation/edges/acdc.py), so its time is at most edges x seconds per trial (dead nodes' edges are
    removed without a forward). Times ACDC_TRIALS such trials with random edges removed."""
    graph = check_edge_model(model)
    chunks, _ = edge_chunks(model, pair, edge_settings, graph)
    rng = np.random.default_rng(0)
    seconds, cpu = [], []
    for _ in range(ACDC_TRIALS):
        removed = rng.random(graph.n_edges) < 0.5
        start, start_cpu = time.perf_counter(), time.process_time()
        mean_value(model, graph, chunks, removed, edge_settings.metric)
        seconds.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    per_trial, cpu_per_trial = float(np.median(seconds)), float(np.median(cpu))
    return {"n_edges": int(graph.n_edges), "forwards_per_edge": 1, "chunks": len(chunks),
            "seconds_per_trial": per_trial, "trial_seconds": seconds, "n_pairs": pair.n_examples,
            "estimated_hours": per_trial * graph.n_edges / 3600.0, "cpu_seconds_per_trial": cpu_per_trial,
            "cpu_estimated_hours": cpu_per_trial * graph.n_edges / 3600.0, "threads": torch.get_num_threads(),
            "load_average": os.getloadavg()[0], "cpu_count": os.cpu_count()}
