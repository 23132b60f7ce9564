"""The known-circuit benchmark: every proposer and patching method scored against circuits known by construction.

For each known model (a `BenchmarkCase`: the checkpoint, its clean/corrupted pairs, the true heads,
the ablation type under which the circuit holds, and its distractor groups) every head method of
`HEAD_METHODS` gives each head a continuous score, and core.stats.recovery scores those against the
truth (ROC AUC, average precision, precision@k with k = the true circuit's size, each with its
permutation baseline). The methods and which number is the score:

- "pattern screen": the head's induction selectivity against the uniform baseline at the final
  checkpoint, the number its circuit membership is judged by (core.pipelines.recipe.screen_checkpoint);
  its proposal is the screen's candidate circuit (heads at or above the membership threshold);
- "spectral": the head's PR-integral over the model's checkpoints (Step 1 of [SPC]); not applicable,
  with the reason, to a model of fewer than two checkpoints of known token counts;
- "co-activation": the head's total coupling strength sum_j |J_ij| in the Ising fit of the
  median-binarised max-attention spins ([CVC]; the fit of core.pipelines.coactivation); its
  proposal is not made here (the pipeline's candidate needs PR-integral labels), so it is disposed
  of as the top-k heads by that strength;
- "gradient": [HHG]'s probe-loss gradient norm per head (core.pipelines.proposers.probe_gradient_magnitudes);
- "activation patching (denoise | noise)": |patched score - base score| of each head patched alone
  (core.ablation.patching.activation_patching) on the normalized scale (clean 1, corrupted 0; the
  base is 0 when denoising, 1 when noising): the size of the head's effect in either direction;
- "attribution patching (denoise | noise)": the same of its first-order estimate
  (core.ablation.patching.attribution_patching).

Every proposal except the screen's is the method's top-k heads, k = the true circuit's size (the same
oracle size precision@k gets). Edge methods (EAP, EAP-IG, ACDC) join through `EDGE_METHODS`, scored
per edge against the circuit's true edges by the same measures.

The disposer (core.pipelines.proposers.dispose: ablation against random controls, the closure rules)
then judges the true circuit, each method's proposal, random groups of the truth's size drawn from
the heads outside the circuit, and the case's distractor groups, under the circuit's ablation type;
a verdict is right when the true circuit passes (paper rule) and a random or distractor group does not.

Each (model, item) result is a JSON file under cache_dir()/benchmark/, written atomically
(core.workspace.atomic_write_json) under a key of everything that decides it, so an interrupted run
resumes from its finished items and its report equals an uninterrupted run's (timings aside, which
sit in the report's "runtime"). The cases and that cache live in benchmark_cases.py, the report's
tables (scores over seeds, verdicts, ACDC's threshold sweep, where the methods separate) in
benchmark_report.py.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Sequence

import numpy as np

from core.ablation.patching import PatchSettings, activation_patching, attribution_patching
from core.choices import BENCHMARK_QUICK as QUICK
from core.errors import HeadLabError
from core.executor import ProgressBar
from core.heads import HeadSet, head_name, parse_heads
from core.model.hooks import model_shape
from core.model.loading import DEFAULT_DTYPE, dtype_name, load_config, load_hf_model, load_model
from core.model.refs import Checkpoint, list_checkpoints, resolve_checkpoint
from core.pipelines.benchmark_cases import (BENCHMARK_VERSION, CACHE_KIND, BenchmarkCase, _item_key, _item_path,
                                            cached_item, check_known_heads, known_case, known_cases, random_groups,
                                            task_and_seed, true_edge_mask)
from core.pipelines.benchmark_edges import (ACDC_SWEEP, ACDC_THRESHOLD, EDGE_LABELS, EDGE_METHOD_NAMES,
                                            EDGE_METHODS, IG_STEPS, EdgeMethod, EdgeScoresOf)
from core.pipelines.benchmark_report import (EXPECTED, GROUP_KINDS, PUBLISHED_ANCHORS, PUBLISHED_LABEL,
                                             head_to_head_scope, report_fingerprint, score_table, separations,
                                             sweep_roc, sweep_table, true_edge_ranks, true_head_ranks,
                                             verdict_accuracy)
from core.pipelines.proposers import DISPOSER, CircuitProposal, dispose, probe_gradient_magnitudes, top_heads
from core.pipelines.recipe import screen_checkpoint, spectral_left_out
from core.probe import head_stats
from core.results import JsonResult, package_versions
from core.stats.controls import count_matched_sets
from core.stats.ising import DEFAULT_C, fit_ising_pseudolikelihood
from core.stats.recovery import DEFAULT_DRAWS, MEASURE_LABELS, MEASURES, TIES, recovery_all
from core.stats.spectral import DEFAULT_DEFINITION, DEFAULT_RULE, SpectralResult, pr_per_head
from core.stats.spins import binarize_at_median, max_attention_signal
from core.tasks.counterfactual import PatchPair

# re-exported: the cases, the cache and the report were split into benchmark_cases.py and benchmark_report.py
__all__ = ["BENCHMARK_VERSION", "CACHE_KIND", "BenchmarkCase", "_item_key", "_item_path", "cached_item",
           "check_known_heads", "known_case", "known_cases", "random_groups", "task_and_seed", "true_edge_mask",
           "ACDC_SWEEP", "ACDC_THRESHOLD", "EDGE_LABELS", "EDGE_METHOD_NAMES", "EDGE_METHODS", "IG_STEPS",
           "EdgeMethod", "EdgeScoresOf", "EXPECTED", "GROUP_KINDS", "PUBLISHED_ANCHORS", "PUBLISHED_LABEL", "report_fingerprint", "score_table",
           "verdict_accuracy"]


# upper bounds of the counts a user sets, checked before any work, with what one more costs
SETTING_BOUNDS = {
    "n_draws": (100_000, "each draw is a permutation of every head's and edge's label, held in memory at once "
                         "(~8 bytes x edges per draw), and p resolves to 1e-5 at the bound"),
    "n_boot": (100_000, "each resample is a pass over the seeds' scores"),
    "n_controls": (1_000, "each control is one ablation forward over the pairs per group"),
    "n_random_groups": (1_000, "each group is a disposal of its own, with its controls"),
    "disposer_boot": (100_000, "each resample is a pass over the controls"),
}


@dataclass(frozen=True)
class BenchmarkSettings(JsonResult):
    """Everything besides the cases that decides a benchmark report.

    n_draws, perm_seed: the permutation baseline; n_boot, boot_seed: the bootstrap over seeds;
    n_controls, control_seed: the disposer's random controls per group (matched, else any-layer when
    a group fills more than half a layer); n_random_groups, group_seed: random non-circuit groups
    disposed of per model; max_examples: pairs used per model (None: all); methods: head methods run
    (None: all of HEAD_METHODS); disposer_boot: the disposer's bootstrap resamples.
    """

    n_draws: int = DEFAULT_DRAWS
    perm_seed: int = 0
    n_boot: int = 2000
    boot_seed: int = 0
    n_controls: int = 20
    control_seed: int = 123
    n_random_groups: int = 10
    group_seed: int = 7
    max_examples: Optional[int] = None
    methods: Optional[tuple[str, ...]] = None
    disposer_boot: int = 200

    def __post_init__(self) -> None:
        for name, least in (("n_draws", 1), ("n_boot", 1), ("n_controls", 1), ("n_random_groups", 0),
                            ("disposer_boot", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) != value or int(value) < least:
                raise HeadLabError(f"benchmark {name} is {value!r}; use a whole number of at least {least}.")
            if int(value) > SETTING_BOUNDS[name][0]:
                most, cost = SETTING_BOUNDS[name]
                raise HeadLabError(f"benchmark {name} is {int(value)}, over its bound of {most}: {cost}; use at most "
                                   f"{most}.")
            object.__setattr__(self, name, int(value))
        if self.max_examples is not None and int(self.max_examples) < 2:
            raise HeadLabError(f"max_examples is {self.max_examples}; use at least 2 pairs, or None for all.")
        if self.methods is not None:
            methods = tuple(self.methods)
            known = HEAD_METHOD_NAMES + EDGE_METHOD_NAMES
            unknown = [m for m in methods if m not in known]
            if unknown or not methods:
                raise HeadLabError(f"unknown benchmark method(s) {', '.join(unknown) or '(none given)'}; use "
                                   f"{', '.join(known)}.")
            object.__setattr__(self, "methods", methods)

    @property
    def method_names(self) -> tuple[str, ...]:
        """The head methods this run scores."""
        return HEAD_METHOD_NAMES if self.methods is None else tuple(m for m in self.methods if m in HEAD_METHOD_NAMES)

    @property
    def edge_method_names(self) -> tuple[str, ...]:
        """The edge methods this run scores."""
        return EDGE_METHOD_NAMES if self.methods is None else tuple(m for m in self.methods if m in EDGE_METHOD_NAMES)




# ---------------------------------------------------------------------------------------------
# what one case's methods read, loaded once and only when asked


class _Loaded:
    """The case's model, Hugging Face model, pairs and head statistics, each made on first use."""

    def __init__(self, case: BenchmarkCase, settings: BenchmarkSettings, device: str, dtype: str):
        self.case, self.settings, self.device, self.dtype = case, settings, device, dtype
        self._model = self._stats = None
        pairs = case.pairs
        if settings.max_examples is not None and pairs.n_examples > settings.max_examples:
            first = pairs.select(slice(0, settings.max_examples))
            # the spec names the subset: the HeadStats cache keys on it, and must not mistake it for the whole
            clean = replace(first.clean, spec={**first.clean.spec, "first_examples": settings.max_examples})
            pairs = PatchPair(clean, first.corrupted_tokens, first.corrupted_target,
                              {**first.spec, "first_examples": settings.max_examples})
        self.pairs = pairs
        self.batch = pairs.clean  # ProbeBatch: tokens [example, pos], query_pos, target

    @property
    def model(self) -> Any:
        if self._model is None:
            self._model = load_model(self.case.ref, self.case.revision, device=self.device, dtype=self.dtype)
        return self._model

    def checkpoint(self) -> Checkpoint:
        return resolve_checkpoint(self.case.ref, self.case.revision)

    def stats(self, checkpoint: Optional[Checkpoint] = None) -> Any:
        """HeadStats of the clean batch (cached by core.probe) at `checkpoint` (default: the case's)."""
        ckpt = checkpoint or self.checkpoint()
        own = ckpt.revision == self.checkpoint().revision
        return head_stats(self.case.ref, ckpt, self.batch, model=self._model if own else None, device=self.device,
                          dtype=self.dtype)


@dataclass(frozen=True)
class HeadScores(JsonResult):
    """One method's per-head scores on one case ([layer, head]; None when not applicable, with the reason),
    its own proposal and why, and notes."""

    method: str
    scores: Optional[np.ndarray]
    proposal: tuple[str, ...]
    rationale: str
    not_applicable: str = ""
    notes: tuple[str, ...] = ()


def _top_k_proposal(method: str, scores: np.ndarray, k: int) -> tuple[tuple[str, ...], str]:
    heads = top_heads(scores, k)
    return tuple(head_name(h) for h in heads), f"top {k} heads by the {method} score (k = the true circuit's size)"


def _screen_scores(x: _Loaded, k: int) -> HeadScores:
    result = screen_checkpoint(x.stats(), n_null_draws=0)
    membership = result.membership_selectivity if result.membership_selectivity is not None else result.selectivity
    scores = np.asarray(membership[list(result.patterns).index("induction")], dtype=np.float64)  # [layer, head]
    heads = result.induction_heads
    why = (f"induction selectivity >= {result.induction_threshold:.3g}x (uniform baseline) at the final checkpoint"
           if len(heads) else f"no head reaches {result.induction_threshold:.3g}x: nothing to propose")
    return HeadScores("pattern screen", scores, tuple(head_name(h) for h in heads), why)


def _spectral_scores(x: _Loaded, k: int) -> HeadScores:
    checkpoints = list_checkpoints(x.case.ref)
    note = spectral_left_out(x.case.ref.name, [c.tokens for c in checkpoints])
    if note:
        return HeadScores("spectral", None, (), "", not_applicable=note)
    pr = np.stack([pr_per_head(x.stats(c).z_query, DEFAULT_DEFINITION) for c in checkpoints])  # [ckpt, layer, head]
    result = SpectralResult.build(pr, [c.tokens for c in checkpoints], definition=DEFAULT_DEFINITION, rule=DEFAULT_RULE,
                                  revisions=[c.revision for c in checkpoints])
    scores = np.asarray(result.integral, dtype=np.float64)
    proposal, why = _top_k_proposal("PR-integral", scores, k)
    return HeadScores("spectral", scores, proposal, why + f" ({DEFAULT_DEFINITION} PR, {DEFAULT_RULE} rule over "
                      f"{len(checkpoints)} checkpoints)")


def _coactivation_scores(x: _Loaded, k: int) -> HeadScores:
    stats = x.stats()
    n_head = int(stats.attn_max.shape[2])
    signal = max_attention_signal(stats.attn_max)  # [example, layer * n_head + head]
    try:
        spins = binarize_at_median(signal, n_head=n_head, allow_constant=True)
        fit = fit_ising_pseudolikelihood(spins, C=DEFAULT_C, method="joint", constant="zero", n_head=n_head)
    except HeadLabError as exc:
        return HeadScores("co-activation", None, (), "", not_applicable=f"no Ising fit: {exc}")
    if not fit.converged:
        return HeadScores("co-activation", None, (), "", not_applicable=(
            f"the Ising fit did not converge in {fit.n_iter} iterations; HeadLab refuses unconverged fits."))
    strength = np.abs(np.asarray(fit.J, dtype=np.float64)).sum(axis=1).reshape(-1, n_head)  # [layer, head]
    notes = ()
    if fit.constant_heads:
        notes = (f"{len(fit.constant_heads)} head(s) never change spin over the pairs: zero couplings, strength 0.",)
    proposal, why = _top_k_proposal("coupling strength", strength, k)
    return HeadScores("co-activation", strength, proposal, why, notes=notes)


def _gradient_scores(x: _Loaded, k: int) -> HeadScores:
    hf = load_hf_model(x.case.ref, x.case.revision, device=x.device, dtype=x.dtype)
    grad = probe_gradient_magnitudes(hf, x.batch.tokens, x.batch.query_pos, x.batch.target)
    del hf
    proposal, why = _top_k_proposal("probe-loss gradient norm", grad, k)
    return HeadScores("gradient", np.asarray(grad, dtype=np.float64), proposal, why)


def _patching_scores(kind: str, direction: str) -> Callable[[_Loaded, int], HeadScores]:
    name = f"{kind} patching ({direction})"
    run = activation_patching if kind == "activation" else attribution_patching

    def scores_of(x: _Loaded, k: int) -> HeadScores:
        result = run(x.model, x.pairs, PatchSettings(direction=direction, allow_small_gap=True))
        base = 0.0 if direction == "denoise" else 1.0
        effect = np.abs(np.asarray(result.scores, dtype=np.float64) - base)  # [layer, head]
        notes = tuple(getattr(result, "notes", ()))
        gap = dict(result.gap or {})
        if gap.get("flag"):
            notes += (f"clean-corrupted gap flagged: {gap.get('flag')}",)
        proposal, why = _top_k_proposal(f"|{kind} patching effect|", effect, k)
        return HeadScores(name, effect, proposal, why, notes=notes)

    return scores_of


@dataclass(frozen=True)
class HeadMethod:
    """A way to score every head: its name, kind ("proposer" | "patching"), which number is the score, the function."""

    name: str
    kind: str
    score: str
    run: Callable[[_Loaded, int], HeadScores]


HEAD_METHODS: tuple[HeadMethod, ...] = (
    HeadMethod("pattern screen", "proposer", "induction selectivity (uniform baseline) at the final checkpoint",
               _screen_scores),
    HeadMethod("spectral", "proposer", "PR-integral over the checkpoints", _spectral_scores),
    HeadMethod("co-activation", "proposer", "Ising coupling strength sum_j |J_ij| of median-binarised max attention",
               _coactivation_scores),
    HeadMethod("gradient", "proposer", "[HHG] probe-loss gradient norm (W_V + W_O block / sqrt(count))",
               _gradient_scores),
    HeadMethod("activation patching (denoise)", "patching", "|score| of the head's clean z patched into the corrupted run",
               _patching_scores("activation", "denoise")),
    HeadMethod("activation patching (noise)", "patching", "|1 - score| of the head's corrupted z patched into the clean run",
               _patching_scores("activation", "noise")),
    HeadMethod("attribution patching (denoise)", "patching", "|first-order estimate| of the denoising score",
               _patching_scores("attribution", "denoise")),
    HeadMethod("attribution patching (noise)", "patching", "|1 - first-order estimate| of the noising score",
               _patching_scores("attribution", "noise")),
)
HEAD_METHOD_NAMES = tuple(m.name for m in HEAD_METHODS)



# ---------------------------------------------------------------------------------------------
# the known models as cases



def disposer_settings(group: HeadSet, n_heads: int, settings: BenchmarkSettings, mode: str):
    """The disposer's settings for `group`: matched controls under the circuit's ablation type, any-layer where
    no matched control exists (a layer more than half selected) or fewer than 3 distinct ones do."""
    controls = "matched"
    counts = group.count_per_layer()
    if any(k > n_heads - k for k in counts.values()) or count_matched_sets(group, n_heads) < 3:
        controls = "any-layer"
    return replace(DISPOSER, n_controls=settings.n_controls, controls=controls, mode=mode, seed=settings.control_seed,
                   n_boot=settings.disposer_boot)


def check_head_scores(result: dict) -> None:
    """A stored head method's result as the report reads it: [layer, head] scores (or none) and a proposal of heads."""
    scored = HeadScores.from_json(result)
    if scored.scores is not None and scored.scores.ndim != 2:
        raise ValueError(f"scores of {scored.scores.ndim} dimensions, not [layer, head]")
    try:
        parse_heads(", ".join(scored.proposal)) if scored.proposal else None
    except HeadLabError as exc:
        raise ValueError(str(exc)) from None


def check_edge_scores(result: dict) -> None:
    """A stored edge method's result as the report reads it: one score per edge (or none)."""
    scored = EdgeScoresOf.from_json(result)
    if scored.scores is not None and scored.scores.shape != (len(scored.edges),):
        raise ValueError(f"{scored.scores.size} scores for {len(scored.edges)} edges")


DISPOSAL_FIELDS = ("kind", "label", "heads", "controls", "n_controls", "mode", "verdict_paper", "verdict_reference",
                   "metrics", "reasons")


def check_disposal_record(record: dict) -> None:
    """A stored disposal as the report reads it: its fields present and of their types (KeyError / TypeError else)."""
    missing = [name for name in DISPOSAL_FIELDS if name not in record]
    if missing:
        raise KeyError(missing[0])
    if not isinstance(record["metrics"], dict) or not isinstance(record["reasons"], list) or not all(
            isinstance(m, dict) for m in record["metrics"].values()):
        raise TypeError("metrics must be a dict of dicts and reasons a list")
    if not isinstance(record["verdict_paper"], str) or not isinstance(record["heads"], list):
        raise TypeError("the verdict must be text and the heads a list")


def _disposal_record(case: BenchmarkCase, x: _Loaded, kind: str, label: str, heads: HeadSet,
                     settings: BenchmarkSettings) -> dict:
    n_layers, n_heads = model_shape(x.model)[:2]
    ablation = disposer_settings(heads, n_heads, settings, case.mode)
    if 2 * len(heads) > n_layers * n_heads:
        disposal = dispose(None, None, CircuitProposal(label, HeadSet.of(()), (
            f"{len(heads)} of the model's {n_layers * n_heads} heads: more than half, so no disjoint random control exists")))
    else:
        disposal = dispose(x.model, x.batch, CircuitProposal(label, heads, kind), ablation)
    truth = set(case.truth)
    overlap = len(truth & set(heads))
    measured = [m["n_controls"] for m in disposal.metrics.values() if m.get("n_controls") is not None]
    return {"kind": kind, "label": label, "heads": [head_name(h) for h in heads], "controls": ablation.controls,
            "n_controls": measured[0] if measured else ablation.n_controls,  # distinct sets, at most those asked for
            "n_controls_requested": ablation.n_controls, "mode": ablation.mode, "verdict_paper": disposal.verdict_paper,
            "verdict_reference": disposal.verdict_reference, "metrics": disposal.metrics,
            "reasons": list(disposal.reasons), "true_heads_in_group": overlap,
            "precision": overlap / len(heads), "recall": overlap / len(truth)}


def distractor_groups(label: str, heads: HeadSet, size: int, n_total: int,
                      settings: BenchmarkSettings) -> list[tuple[str, HeadSet]]:
    """The groups made of a case's distractors: all of them (when at most half the model's heads, so that disjoint
    controls exist), each alone, and up to n_random_groups seeded draws of the true circuit's size."""
    groups = []
    if 0 < 2 * len(heads) <= n_total:
        groups.append((label, heads))
    if len(heads) > 1:
        groups += [(f"{label}: {head_name(h)}", HeadSet.of((h,))) for h in heads]
    if 1 < size < len(heads):
        members = list(heads)
        rng = np.random.RandomState(settings.group_seed)
        drawn: list[HeadSet] = []
        for _ in range(100 * max(1, settings.n_random_groups)):
            if len(drawn) >= min(settings.n_random_groups, math.comb(len(members), size)):
                break
            group = HeadSet.of(members[int(i)] for i in rng.choice(len(members), size=size, replace=False))
            if group not in drawn and group != heads:
                drawn.append(group)
        groups += [(f"{label} of {size} ({i})", group) for i, group in enumerate(drawn)]
    return groups


def judge(kind: str, verdict: str) -> Optional[bool]:
    """Whether a verdict (paper rule) is right for a group of this kind: None for a proposal (no expected answer)
    and for a group that could not be tested."""
    expected = EXPECTED[kind]
    if expected is None or verdict == "not tested":
        return None
    called_causal = verdict == "pass"
    return called_causal if expected == "causal" else not called_causal


def run_case(case: BenchmarkCase, settings: BenchmarkSettings, device: str = "cpu", dtype: str = DEFAULT_DTYPE,
             tick: Optional[Callable[[str], None]] = None) -> dict:
    """Every head method and every disposal on one case (each a cached item); the case's part of the report."""
    tick = tick or (lambda text: None)
    config = load_config(case.ref, case.revision)
    n_layers, n_heads = int(config.num_hidden_layers), int(config.num_attention_heads)
    check_known_heads(case, n_layers, n_heads)
    x = _Loaded(case, settings, device, dtype)
    pair_extra = {"max_examples": settings.max_examples, "dtype": dtype_name(dtype)}
    k = len(case.truth)
    timings: dict[str, float] = {}
    devices: dict[str, str] = {}  # item -> the device it was computed on (cached items: when they were)
    methods = []
    shape = (n_layers, n_heads)
    for method in HEAD_METHODS:
        if method.name not in settings.method_names:
            continue

        def compute(method=method) -> dict:
            return method.run(x, k).to_json()

        result, seconds, devices[f"scores/{method.name}"] = cached_item(
            case, f"scores/{method.name}", pair_extra, compute, check=check_head_scores, device=device)
        timings[f"scores/{method.name}"] = seconds
        scored = HeadScores.from_json(result)
        entry = {"method": method.name, "kind": method.kind, "score": method.score, **scored.to_json()}
        if scored.scores is not None:
            truth_mask = np.zeros(shape, dtype=bool)
            for layer, head in case.truth:
                truth_mask[layer, head] = True
            measured = recovery_all(scored.scores, truth_mask, settings.n_draws, settings.perm_seed)
            entry["recovery"] = {m: r.to_json() for m, r in measured.items()}
        methods.append(entry)
        tick(f"{case.name}: {method.name}")
    edge_methods = []
    for method in EDGE_METHODS:
        if method.name not in settings.edge_method_names:
            continue
        if not case.edges:
            edge_methods.append({"method": method.name, "score": method.score, "edges": [], "scores": None,
                                 "not_applicable": "the circuit lists no true edges", "notes": []})
            tick(f"{case.name}: {method.name}")
            continue
        result, seconds, devices[f"edges/{method.name}"] = cached_item(
            case, f"edges/{method.name}", pair_extra, lambda method=method: method.run(x).to_json(),
            check=check_edge_scores, device=device)
        timings[f"edges/{method.name}"] = seconds
        scored = EdgeScoresOf.from_json(result)
        entry = {"score": method.score, **scored.to_json()}
        if scored.scores is not None:
            truth_edges = true_edge_mask(case, scored.edges)
            entry["recovery"] = {m: r.to_json() for m, r in recovery_all(
                scored.scores, truth_edges, settings.n_draws, settings.perm_seed).items()}
            if scored.sweep:
                entry["sweep_roc"] = sweep_roc(scored.sweep["thresholds"], scored.sweep["kept"], truth_edges)
            scope = head_to_head_scope(scored.edges, scored.scores, truth_edges, scored.sweep)
            if scope is not None:  # the same scores on the edges between two heads (the truth's scope when planted)
                scores_in, truth_in, sweep_in = scope
                entry["recovery_heads"] = {m: r.to_json() for m, r in recovery_all(
                    scores_in, truth_in, settings.n_draws, settings.perm_seed).items()}
                if sweep_in:
                    entry["sweep_roc_heads"] = sweep_roc(sweep_in["thresholds"], sweep_in["kept"], truth_in)
        edge_methods.append(entry)
        tick(f"{case.name}: {method.name}")
    groups: list[tuple[str, str, HeadSet]] = [("truth", "true circuit", case.truth)]
    for entry in methods:
        if entry["proposal"]:
            groups.append(("proposal", entry["method"], parse_heads(", ".join(entry["proposal"]))))
    for i, group in enumerate(random_groups(case.truth, n_layers, n_heads, settings.n_random_groups, settings.group_seed)):
        groups.append(("random", f"random {i}", group))
    for label, heads in case.distractors.items():
        groups += [("distractor", name, group) for name, group in distractor_groups(
            str(label), HeadSet.of(heads), len(case.truth), n_layers * n_heads, settings)]
    disposals = []
    for kind, label, heads in groups:
        extra = {**pair_extra, "heads": [head_name(h) for h in heads], "kind": kind, "mode": case.mode,
                 "n_controls": settings.n_controls, "control_seed": settings.control_seed,
                 "disposer_boot": settings.disposer_boot}
        record, seconds, devices[f"dispose/{kind}/{label}"] = cached_item(
            case, f"dispose/{kind}/{label}", extra, lambda kind=kind, label=label, heads=heads: _disposal_record(
                case, x, kind, label, heads, settings), check=check_disposal_record, device=device)
        timings[f"dispose/{kind}/{label}"] = seconds
        disposals.append({**record, "correct": judge(kind, record["verdict_paper"])})
        tick(f"{case.name}: dispose {label}")
    return {"case": case.describe(shape), "methods": methods, "edge_methods": edge_methods, "disposals": disposals,
            "timings": timings, "devices": devices}


def n_items(cases: Sequence[BenchmarkCase], settings: BenchmarkSettings) -> int:
    """An estimate of the progress bar's total: methods and disposals per case."""
    total = 0
    for case in cases:
        distractors = sum(len(distractor_groups("", HeadSet.of(v), len(case.truth), 10**6, settings))
                          for v in case.distractors.values())
        total += (2 * len(settings.method_names) + len(settings.edge_method_names) + 1 + settings.n_random_groups
                  + distractors)
    return total


# ---------------------------------------------------------------------------------------------
# the report



def benchmark(cases: Sequence[BenchmarkCase], settings: BenchmarkSettings = BenchmarkSettings(), device: str = "cpu",
              dtype: str = DEFAULT_DTYPE, progress: bool = True, quick: bool = False) -> dict:
    """Every method on every case, scored, and the disposer's verdicts; the report as a JSON-ready dict.

    Finished items are read from the cache (a rerun resumes); the report's "runtime" holds the timings.
    """
    if not cases:
        raise HeadLabError("no known models to benchmark; build them first (core.zoo.known) or name one that exists.")
    names = [c.name for c in cases]
    if len(set(names)) != len(names):
        raise HeadLabError(f"two known models share a name ({', '.join(sorted({n for n in names if names.count(n) > 1}))}); "
                           "give each its own.")
    started = time.perf_counter()
    total = n_items(cases, settings)
    results = []
    with ProgressBar(total=total, desc="benchmark", unit="item", disable=not progress) as bar:
        def tick(text: str) -> None:
            bar.set_postfix_str(text[:60], refresh=False)
            bar.update(1)

        for case in cases:
            results.append(run_case(case, settings, device, dtype, tick))
        bar.total = bar.n
    methods = [{"name": m.name, "kind": m.kind, "score": m.score} for m in HEAD_METHODS if m.name in settings.method_names]
    timings = {r["case"]["name"]: r.pop("timings") for r in results}
    computed_on = sorted({d for r in results for d in r.pop("devices").values()})
    table = score_table(results, settings)
    return {
        "benchmark": "HeadLab known-circuit benchmark (issue 34)",
        "version": BENCHMARK_VERSION,
        "quick": bool(quick),
        "settings": settings.to_json(),
        "measures": {m: MEASURE_LABELS[m] for m in MEASURES},
        "ties": TIES,
        "baseline": (f"the truth permuted against the scores, {settings.n_draws} draws (numpy default_rng seed "
                     f"{settings.perm_seed}); p = (1 + draws >= value) / (1 + draws)"),
        "interval": (f"percentile bootstrap of the mean over the seeds of a task ({settings.n_boot} resamples, seed "
                     f"{settings.boot_seed}); none for a task of one model"),
        "disposer": ("core.pipelines.proposers.dispose: ablation under the circuit's type against random controls "
                     "(matched, any-layer where matched cannot be drawn), closure verdicts; right = the true circuit "
                     "passes (paper rule), a random or distractor group does not"),
        "methods": methods,
        "edge_methods": [{"name": m.name, "score": m.score} for m in EDGE_METHODS if m.name in settings.edge_method_names],
        "models": [r["case"] for r in results],
        "results": results,
        "table": table,
        "acdc_sweep": {"thresholds": list(ACDC_SWEEP), "table": sweep_table(results, settings),
                       "curve": ("each threshold's kept edges one (FPR, TPR) point; (0, 0), the points by FPR with "
                                 "their upper envelope, (1, 1); trapezoid area (benchmark_report.sweep_roc)")},
        "separations": separations(table) + separations(table, "average_precision"),
        "true_head_ranks": true_head_ranks(results),
        "true_edge_ranks": true_edge_ranks(results),
        "verdicts": verdict_accuracy(results),
        "published": {"label": PUBLISHED_LABEL, "rows": [dict(row) for row in PUBLISHED_ANCHORS]},
        "provenance": {"versions": package_versions(), "device": ", ".join(computed_on) or device,
                       "device_asked": device, "dtype": dtype_name(dtype)},
        "runtime": {"seconds": time.perf_counter() - started, "items_seconds": timings,
                    "note": "wall time of this run; items read from the cache count the seconds they took when computed"},
    }


