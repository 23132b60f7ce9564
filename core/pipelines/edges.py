"""Model -> edge report: every edge scored by one method, the faithfulness curve of its top edges, and the
discovered edge set against matched-random edge sets.

`run_edges` works on a loaded model and a PatchPair; `edges_model` loads a checkpoint first and
builds the pairs from their spec (the induction probe's counterfactual, or a probe file tokenized
with the model's own tokenizer), as core/pipelines/patching.py does for heads. The discovered set
is ACDC's kept edges, or the `top` edges by |score| for EAP and EAP-IG.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

import numpy as np

from core.ablation.edges import (METHODS, MIB_FRACTIONS, EdgeControls, EdgeGraph, EdgeScores, EdgeSettings,
                                 FaithfulnessCurve,
                                 acdc, check_threshold, edge_attribution, edge_controls, faithfulness_curve, top_edges)
from core.ablation.edges.eap import check_ig_steps
from core.ablation.edges.runs import check_edge_run_fits
from core.errors import HeadLabError
from core.model.loading import DEFAULT_DTYPE, load_config, load_model, parse_dtype
from core.model.refs import Checkpoint, ModelRef, resolve_checkpoint
from core.pipelines.patching import build_pairs
from core.probe import check_probe_fits
from core.results import JsonResult
from core.tasks.counterfactual import InductionCounterfactualSpec, PatchPair
from core.tasks.probe_file import ProbeFile

# upper bounds on the counts a user sets, with what each unit costs (checked before any model is loaded)
MAX_IG_STEPS = 1_000  # EAP-IG converges in tens of steps (MIB uses 5-50); each step is one forward and backward pass
MAX_EDGE_CONTROLS = 1_000  # p resolves to 1/1001 at the bound; each set is one patched forward over the pairs
SCORE_FLOOR = 1e-6  # of the largest |score|: below it an EAP / EAP-IG score is rounding, not a discovered edge
# progress(stage, done, total): stage is "scores", "curve" or "controls"
StageProgress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class EdgePlan(JsonResult):
    """What an edge run does besides scoring.

    method: "eap", "eap-ig" or "acdc"; ig_steps: EAP-IG's interpolations; threshold: ACDC's;
    top: the edges of largest |score| that form the discovered set (EAP, EAP-IG; those above SCORE_FLOOR) and are listed;
    curve: also the faithfulness curve over `fractions`; n_controls, control_seed: the
    matched-random edge sets the discovered set is compared with (0: none).
    """

    method: str = "eap"
    ig_steps: int = 5
    threshold: float = 0.01
    top: int = 20
    curve: bool = True
    fractions: tuple[float, ...] = MIB_FRACTIONS
    n_controls: int = 20
    control_seed: int = 123

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise HeadLabError(f"edge method {self.method!r} is unknown; use one of {', '.join(METHODS)}.")
        object.__setattr__(self, "ig_steps", check_ig_steps(self.ig_steps))
        object.__setattr__(self, "threshold", check_threshold(self.threshold))
        object.__setattr__(self, "fractions", tuple(float(f) for f in self.fractions))
        if int(self.top) < 1:
            raise HeadLabError(f"--top is {self.top}; keep at least one edge.")
        if int(self.n_controls) != self.n_controls or int(self.n_controls) < 0:
            raise HeadLabError(f"--controls is {self.n_controls}; use 0 (none) or more random edge sets.")
        object.__setattr__(self, "n_controls", int(self.n_controls))
        if self.ig_steps > MAX_IG_STEPS:
            raise HeadLabError(f"--ig-steps is {self.ig_steps}, over its bound of {MAX_IG_STEPS}: each step is one "
                               "forward and one backward pass over every pair (EAP takes one of each), and the "
                               f"integral settles within tens of steps; use at most {MAX_IG_STEPS}.")
        if self.n_controls > MAX_EDGE_CONTROLS:
            raise HeadLabError(f"--controls is {self.n_controls}, over its bound of {MAX_EDGE_CONTROLS}: each "
                               "matched-random edge set is one patched forward over every pair, and p resolves to "
                               f"1/{MAX_EDGE_CONTROLS + 1} at the bound; use at most {MAX_EDGE_CONTROLS}.")

    def passes(self, n_edges: int) -> dict[str, tuple[int, int]]:
        """stage -> (forward, backward) passes per batch of pairs the plan will run, on a graph of n_edges edges (ACDC:
        at most one forward per edge, the most it can test). Counted as core.ablation.edges runs them: each stage
        first runs the clean and the corrupted prompts and the every-edge-patched run."""
        scores = {"eap": (4, 1), "eap-ig": (3 + self.ig_steps, self.ig_steps), "acdc": (4 + int(n_edges), 0)}
        stages = {"scores": scores[self.method]}
        if self.curve:
            stages["curve"] = (3 + len(self.fractions), 0)
        if self.n_controls:
            stages["controls"] = (4 + self.n_controls, 0)
        return stages

    def cost_line(self, n_edges: int) -> str:
        """What the run will cost, said before it starts: passes per batch of pairs for each stage, and in all."""
        passes = self.passes(n_edges)
        what = {"scores": {"eap": "EAP scores", "eap-ig": f"EAP-IG scores at {self.ig_steps} steps",
                           "acdc": f"ACDC over {n_edges} edges (at most)"}[self.method],
                "curve": f"faithfulness curve at {len(self.fractions)} sizes",
                "controls": f"{self.n_controls} matched-random edge sets"}
        parts = [f"{what[stage]}: {f} forward" + (f" and {b} backward" if b else "") for stage, (f, b) in passes.items()]
        forward, backward = (sum(p[i] for p in passes.values()) for i in (0, 1))
        return (f"cost: {'; '.join(parts)}; in all {forward} forward and {backward} backward passes per batch of pairs "
                f"({forward + 2 * backward} forward-pass equivalents, EAP scores alone take 6).")


@dataclass(frozen=True, eq=False)
class EdgeReport(JsonResult):
    """One edge run: the scores, the discovered set (its edges and heads), its curve and controls."""

    model: str
    revision: Optional[str]
    plan: EdgePlan
    scores: EdgeScores
    discovered: tuple[str, ...]
    heads: tuple[tuple[int, int], ...]
    curve: Optional[FaithfulnessCurve]
    controls: Optional[EdgeControls]
    seconds: dict
    notes: tuple[str, ...]
    provenance: dict


KL_FLOOR = 1e-4  # nats: a KL(clean || every edge patched) below this is noise (float32 rounding is ~1e-7), not a signal


def discovered_edges(scores: EdgeScores, plan: EdgePlan) -> np.ndarray:
    """[edge] bool: ACDC's kept edges, or the plan's top edges by |score| whose |score| exceeds SCORE_FLOOR of
    the largest: an edge whose patching moves the metric by rounding alone is not discovered (on a hand-wired
    model most edges score 1e-17, and a fixed top-k would fill up with them in edge order)."""
    if scores.kept is not None:
        return np.asarray(scores.kept, dtype=bool)
    magnitude = np.abs(np.asarray(scores.scores, dtype=np.float64))
    return top_edges(magnitude, min(int(plan.top), magnitude.size)) & (magnitude > SCORE_FLOOR * magnitude.max())


def score_edges(model: Any, pair: PatchPair, settings: EdgeSettings, plan: EdgePlan,
                progress: Optional[Callable[[int, int], None]] = None) -> EdgeScores:
    """Every edge scored by plan.method."""
    if plan.method == "acdc":
        return acdc(model, pair, plan.threshold, settings, progress)
    return edge_attribution(model, pair, settings, plan.ig_steps if plan.method == "eap-ig" else None, progress)


def run_edges(model: Any, pair: PatchPair, settings: EdgeSettings = EdgeSettings(), plan: EdgePlan = EdgePlan(),
              progress: Optional[StageProgress] = None) -> EdgeReport:
    """Score every edge, then the faithfulness curve and the matched-random controls the plan asks for."""
    def stage(name: str):
        return None if progress is None else (lambda done, total: progress(name, done, total))

    seconds, notes = {}, []
    start = time.perf_counter()
    scores = score_edges(model, pair, settings, plan, stage("scores"))
    seconds["scores"] = time.perf_counter() - start
    if scores.metric == "kl" and not scores.corrupted_value > KL_FLOOR:
        problem = (f"KL(clean || every edge patched) is {scores.corrupted_value:.2g} nats, under {KL_FLOOR:g}: the "
                   "corruption barely moves the output distribution, so each edge's share of it is noise")
        if not settings.allow_small_gap:
            raise HeadLabError(f"{problem}; use a corruption that changes the answer, or --metric logit_diff (force it "
                               "with --allow-small-gap).")
        notes.append(f"forced: {problem}; the scores and the discovered set are unreliable.")
    keep = discovered_edges(scores, plan)
    curve = controls = None
    if plan.curve:
        start = time.perf_counter()
        curve = faithfulness_curve(model, pair, scores.scores, settings, plan.fractions, plan.method, stage("curve"))
        seconds["curve"] = time.perf_counter() - start
    if plan.n_controls and keep.any():
        start = time.perf_counter()
        controls = edge_controls(model, pair, keep, settings, plan.n_controls, plan.control_seed, stage("controls"))
        seconds["controls"] = time.perf_counter() - start
    elif not keep.any() and plan.method == "acdc":
        notes.append(f"ACDC kept no edge at threshold {plan.threshold}: nothing to test against controls; "
                     "lower --threshold.")
    n_kept = int(keep.sum())
    if plan.method != "acdc" and n_kept < min(int(plan.top), keep.size):
        notes.append(f"{n_kept} of the top {plan.top} edges score above {SCORE_FLOOR:g} of the largest |score|; "
                     "the discovered set holds those alone (the rest move the metric by rounding)"
                     + ("; nothing to test against controls." if not n_kept else "."))
    edges = tuple(scores.edges[i] for i in np.nonzero(keep)[0])
    heads = tuple(EdgeGraph.from_summary(scores.graph).heads_of(keep))
    notes += list(pair.spec.get("notes", ()))
    return EdgeReport(str(getattr(model.cfg, "model_name", "")), None, plan, scores, edges, heads, curve, controls,
                      seconds, tuple(notes), dict(scores.provenance))


def check_has_pairs(pairs: Any) -> None:
    """Refuse a probe file whose records lack a corrupted prompt: every edge method patches clean from corrupted."""
    if isinstance(pairs, ProbeFile):
        missing = [r.line for r in pairs.records if r.corrupted_prompt is None]
        if missing:
            raise HeadLabError(f"probe file {pairs.name}: line {missing[0]} has no corrupted_prompt ({len(missing)} of "
                               f"{pairs.n_examples} lack one); edge methods need clean/corrupted pairs, since every "
                               "edge is patched from the corrupted run. Add a corrupted_prompt of the same token length "
                               "to every line.")


def edges_model(ref: ModelRef, revision: Optional[str], pairs: InductionCounterfactualSpec | ProbeFile,
                settings: EdgeSettings = EdgeSettings(), plan: EdgePlan = EdgePlan(), device: str = "cpu",
                dtype: str = DEFAULT_DTYPE, progress: Optional[StageProgress] = None) -> EdgeReport:
    """Load one checkpoint (default: the last), build the pairs, run `run_edges`; the report names the checkpoint."""
    checkpoint = resolve_checkpoint(ref, revision)
    check_has_pairs(pairs)
    config = load_config(ref, checkpoint.revision)
    if isinstance(pairs, InductionCounterfactualSpec):
        check_probe_fits(pairs, config)
    if hasattr(pairs, "seq_len"):  # a probe file's token lengths are known only once its tokenizer has run
        check_edge_run_fits(config, pairs.seq_len, parse_dtype(dtype), plan.method != "acdc", device)
    model = load_model(ref, checkpoint.revision, device=device, dtype=dtype)
    return edges_loaded(model, ref.name, checkpoint, pairs, settings, plan, progress)


def edges_loaded(model: Any, name: str, checkpoint: Checkpoint, pairs: Any, settings: EdgeSettings = EdgeSettings(),
                 plan: EdgePlan = EdgePlan(), progress: Optional[StageProgress] = None) -> EdgeReport:
    """`run_edges` on a loaded checkpoint (the app keeps models loaded); the report names the model and checkpoint."""
    pair = build_pairs(model, pairs) if isinstance(pairs, (InductionCounterfactualSpec, ProbeFile)) else pairs.build()
    pair.check_contrast(settings.metric)  # before any forward: pairs that differ in nothing are refused here
    report = run_edges(model, pair, settings, plan, progress)
    report.provenance.update({"model": name, "revision": checkpoint.revision, "tokens": checkpoint.tokens,
                              "pair_spec": pairs.to_json()})
    return replace(report, model=name, revision=checkpoint.revision)
