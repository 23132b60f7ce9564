"""Model -> patching report: activation patching of every head, attribution patching and their rank agreement,
and, when asked, a group of heads against random controls and a path between heads.

`run_patching` works on a loaded model and a PatchPair; `patch_model` loads a checkpoint first and
builds the pairs from their spec (the induction probe's counterfactual, or a probe file tokenized
with the model's own tokenizer). What to run besides the
per-head scan is one frozen `PatchPlan`; how to patch is core.ablation.patching.PatchSettings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

from core.ablation.patching import (GroupPatching, HeadAttribution, HeadPatching, PatchSettings, PathPatching,
                                    activation_patching, attribution_patching, check_components, group_patching,
                                    path_patching)
from core.ablation.patching.runs import GRADIENT_METRICS
from core.errors import HeadLabError
from core.heads import HeadSet
from core.model.hooks import model_context_length
from core.model.loading import DEFAULT_DTYPE, load_config, load_model
from core.model.refs import Checkpoint, ModelRef, resolve_checkpoint
from core.probe import check_probe_fits
from core.results import JsonResult
from core.stats.inference import spearman
from core.tasks.counterfactual import InductionCounterfactualSpec, PatchPair
from core.tasks.probe_file import ProbeFile

# progress(stage, done, total): stage is "activation", "attribution", "group" or "path"
StageProgress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class PatchPlan(JsonResult):
    """What runs besides activation patching of every head.

    attribution: also attribution patching of every head, with its Spearman rank agreement;
    group: heads patched together against random controls; senders, receivers, components: a path
    (both or neither), into the receivers' q, k and/or v.
    """

    attribution: bool = True
    group: Optional[HeadSet] = None
    senders: Optional[HeadSet] = None
    receivers: Optional[HeadSet] = None
    components: tuple[str, ...] = ("k",)

    def __post_init__(self) -> None:
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
    start = time.perf_counter()
    activation = activation_patching(model, pair, settings, stage("activation"))
    seconds["activation"] = time.perf_counter() - start
    attribution = rho = rho_p = None
    notes = []
    if plan.attribution and settings.metric not in GRADIENT_METRICS:
        notes.append(f"attribution patching skipped: {settings.metric} is a step function, with no useful gradient.")
    elif plan.attribution:
        start = time.perf_counter()
        attribution = attribution_patching(model, pair, settings, stage("attribution"))
        seconds["attribution"] = time.perf_counter() - start
        rho, rho_p = spearman(attribution.scores.ravel(), activation.scores.ravel())
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
    report = run_patching(model, build_pairs(model, pairs), settings, plan, progress)
    report.provenance.update({"model": name, "revision": checkpoint.revision, "tokens": checkpoint.tokens,
                              "pair_spec": pairs.to_json()})
    return replace(report, model=name, revision=checkpoint.revision)
