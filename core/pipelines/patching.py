"""Model -> patching report: activation patching of every head, attribution patching and their rank agreement,
and, when asked, a group of heads against random controls and a path between heads.

On a model with more heads than the plan's top_k (DEFAULT_TOP_K: SmolLM2 has 270, one forward per head
and pair), attribution patching runs first over every head and activation patching only on the top_k
heads it ranks largest by |effect|; the rest keep attribution's estimate, and the report's
activation.exact says which heads were patched exactly (docs/patching.md, "Speed: --top-k").

`run_patching` works on a loaded model and a PatchPair; `patch_model` loads a checkpoint first and
builds the pairs from their spec (the induction probe's counterfactual, or a probe file tokenized
with the model's own tokenizer). What to run besides the
per-head scan is one frozen `PatchPlan`; how to patch is core.ablation.patching.PatchSettings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from numbers import Integral
from typing import Any, Callable, Optional

import numpy as np

from core.ablation.patching import (GroupPatching, HeadAttribution, HeadPatching, PatchSettings, PathPatching,
                                    activation_patching, attribution_patching, check_components, group_patching,
                                    path_patching)
from core.ablation.patching.runs import GRADIENT_METRICS
from core.choices import PATCH_TOP_K as DEFAULT_TOP_K
from core.errors import HeadLabError
from core.heads import HeadSet
from core.model.hooks import model_context_length, model_shape
from core.model.loading import DEFAULT_DTYPE, load_config, load_model
from core.model.refs import Checkpoint, ModelRef, resolve_checkpoint
from core.probe import check_probe_fits
from core.results import JsonResult
from core.stats.inference import spearman
from core.tasks.counterfactual import InductionCounterfactualSpec, PatchPair
from core.tasks.probe_file import ProbeFile

# progress(stage, done, total): stage is "activation", "attribution", "group" or "path"
StageProgress = Callable[[str, int, int], None]
# heads activation-patched exactly when a model has more (the rest: attribution's estimate); measured on
# SmolLM2 IOI pairs (attribution's top 38 held activation patching's top 20): docs/measurements/bench-dtype-smollm2-135m.json


def check_top_k(top_k: Any, n_heads_total: int | None = None) -> int | None:
    """top_k as an int (None: every head), refused unless a whole number from 1 to the model's head count."""
    if top_k is None:
        return None
    if isinstance(top_k, bool) or not isinstance(top_k, Integral) or int(top_k) < 1:
        raise HeadLabError(f"top-k is {top_k!r}; give a whole number of heads to activation-patch (at least 1), "
                           f"or 'all' for every head.")
    if n_heads_total is not None and int(top_k) > n_heads_total:
        raise HeadLabError(f"top-k is {top_k} but the model has {n_heads_total} heads; give at most {n_heads_total}, "
                           f"or 'all' for every head.")
    return int(top_k)


def effect_size(scores: np.ndarray, direction: str) -> np.ndarray:
    """How far each head's score moves the base run: |score| denoising (the corrupted run is 0), |1 - score| noising."""
    return np.abs(scores) if direction == "denoise" else np.abs(1.0 - scores)


@dataclass(frozen=True)
class PatchPlan(JsonResult):
    """What runs besides activation patching of every head.

    attribution: also attribution patching of every head, with its Spearman rank agreement;
    group: heads patched together against random controls; senders, receivers, components: a path
    (both or neither), into the receivers' q, k and/or v; top_k: on a model with more heads,
    activation-patch only the top_k heads attribution ranks largest (None: every head).
    """

    attribution: bool = True
    group: Optional[HeadSet] = None
    senders: Optional[HeadSet] = None
    receivers: Optional[HeadSet] = None
    components: tuple[str, ...] = ("k",)
    top_k: Optional[int] = DEFAULT_TOP_K

    def __post_init__(self) -> None:
        object.__setattr__(self, "top_k", check_top_k(self.top_k))
        object.__setattr__(self, "components", check_components(self.components))
        if (self.senders is None) != (self.receivers is None):
            raise HeadLabError("a path needs both senders and receivers (e.g. --senders L0H1 --receivers L1H2).")


@dataclass(frozen=True, eq=False)
class PatchingReport(JsonResult):
    """Everything one patching run measured, with where it came from.

    spearman, spearman_p: rank agreement of attribution with activation scores over every head
    (None when either is constant or attribution was not run); seconds: wall time of each part;
    notes: what was skipped and why.
    """

    model: str
    revision: Optional[str]
    settings: PatchSettings
    plan: PatchPlan
    activation: HeadPatching
    attribution: Optional[HeadAttribution]
    spearman: Optional[float]
    spearman_p: Optional[float]
    group: Optional[GroupPatching]
    path: Optional[PathPatching]
    seconds: dict
    notes: tuple[str, ...]
    provenance: dict


def run_patching(model: Any, pair: PatchPair, settings: PatchSettings = PatchSettings(), plan: PatchPlan = PatchPlan(),
                 progress: Optional[StageProgress] = None) -> PatchingReport:
    """Activation patching of every head, then what `plan` asks for, on a loaded model."""
    def stage(name: str):
        return None if progress is None else (lambda done, total: progress(name, done, total))

    seconds = {}
    attribution = rho = rho_p = None
    notes = []
    n_layers, n_heads, _ = model_shape(model)
    n_total = n_layers * n_heads
    ranked = plan.top_k is not None and plan.top_k < n_total
    gradient = settings.metric in GRADIENT_METRICS
    if ranked and not (plan.attribution and gradient):
        ranked = False
        notes.append(f"every head was activation-patched: ranking the top {plan.top_k} needs attribution patching "
                     f"with a metric that has a gradient ({', '.join(GRADIENT_METRICS)}).")
    if plan.attribution and not gradient:
        notes.append(f"attribution patching skipped: {settings.metric} is a step function, with no useful gradient.")
    elif plan.attribution:
        start = time.perf_counter()
        attribution = attribution_patching(model, pair, settings, stage("attribution"))
        seconds["attribution"] = time.perf_counter() - start
    heads = None
    if ranked:
        order = np.argsort(-effect_size(attribution.scores, settings.direction).ravel(), kind="stable")[: plan.top_k]
        heads = [divmod(int(i), n_heads) for i in order]
    start = time.perf_counter()
    activation = activation_patching(model, pair, settings, stage("activation"), heads=heads)
    seconds["activation"] = time.perf_counter() - start
    if attribution is not None:
        exact = np.ones(activation.scores.shape, dtype=bool) if activation.exact is None else activation.exact
        rho, rho_p = spearman(attribution.scores[exact], activation.scores[exact])
    if ranked:
        activation = with_estimates(activation, attribution)
        notes.append(f"activation patching ran on the {plan.top_k} of {n_total} heads that attribution patching ranks "
                     f"largest by |effect| (top-k); the other {n_total - plan.top_k} heads' scores are attribution's "
                     f"first-order estimates, and the Spearman agreement is over the {plan.top_k} patched heads.")
    group = path = None
    if plan.group is not None:
        start = time.perf_counter()
        group = group_patching(model, pair, plan.group, settings, stage("group"))
        seconds["group"] = time.perf_counter() - start
    if plan.senders is not None:
        start = time.perf_counter()
        path = path_patching(model, pair, plan.senders, plan.receivers, plan.components, settings, stage("path"))
        seconds["path"] = time.perf_counter() - start
    notes += list(pair.spec.get("notes", ()))  # e.g. a probe file's targets of several tokens
    return PatchingReport(str(getattr(model.cfg, "model_name", "")), None, settings, plan, activation, attribution, rho,
                          rho_p, group, path, seconds, tuple(notes), dict(activation.provenance))


def with_estimates(activation: HeadPatching, attribution: HeadAttribution) -> HeadPatching:
    """activation's scores where it patched a head (activation.exact), attribution's estimate elsewhere."""
    exact = activation.exact
    scores = np.where(exact, activation.scores, attribution.scores)
    positions = activation.position_scores
    if positions is not None:
        positions = np.where(exact[:, :, None], positions, attribution.position_scores)
    return replace(activation, scores=scores, position_scores=positions)


def build_pairs(model: Any, pairs: InductionCounterfactualSpec | ProbeFile) -> PatchPair:
    """The pairs on a loaded model: a probe file is tokenized with the model's own tokenizer."""
    if isinstance(pairs, ProbeFile):
        return pairs.build(model.tokenizer, model_context_length(model))
    return pairs.build()


def patch_model(ref: ModelRef, revision: Optional[str], pairs: InductionCounterfactualSpec | ProbeFile,
                settings: PatchSettings = PatchSettings(), plan: PatchPlan = PatchPlan(), device: str = "cpu",
                dtype: str = DEFAULT_DTYPE, progress: Optional[StageProgress] = None) -> PatchingReport:
    """Load one checkpoint (default: the last), build the pairs, run `run_patching`; the report names the checkpoint.

    pairs: the built-in induction counterfactual, or a probe file (core.tasks.probe_file).
    """
    checkpoint = resolve_checkpoint(ref, revision)
    if not isinstance(pairs, ProbeFile):  # a probe file's lengths are known once tokenized
        check_probe_fits(pairs, load_config(ref, checkpoint.revision))
    model = load_model(ref, checkpoint.revision, device=device, dtype=dtype)
    return patch_loaded(model, ref.name, checkpoint, pairs, settings, plan, progress)


def patch_loaded(model: Any, name: str, checkpoint: Checkpoint, pairs: InductionCounterfactualSpec | ProbeFile,
                 settings: PatchSettings = PatchSettings(), plan: PatchPlan = PatchPlan(),
                 progress: Optional[StageProgress] = None) -> PatchingReport:
    """`run_patching` on a loaded checkpoint (the app keeps models loaded), the pairs built for it; the report
    names the model and checkpoint."""
    pair = build_pairs(model, pairs)
    pair.check_contrast(settings.metric)  # before any forward: pairs that differ in nothing are refused here
    report = run_patching(model, pair, settings, plan, progress)
    report.provenance.update({"model": name, "revision": checkpoint.revision, "tokens": checkpoint.tokens,
                              "pair_spec": pairs.to_json()})
    return replace(report, model=name, revision=checkpoint.revision)
