"""Model -> a real model's circuit study (`python -m core study`): the induction or IOI section of a report.

Every stage's result is a small JSON record cached in core's store (kind "study", keyed by the model, its
checkpoint, the settings and the stage), so an interrupted study resumes where it stopped and a finished
one is free. The model is loaded only when a stage is missing. Stages reuse the project's pipelines:
the pattern screen and group ablation (core/pipelines/recipe.py), patching (patching.py), edges
(edges.py, core/ablation/edges/) and the head-role measures (study_roles.py, core/stats/ioi_roles.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch

from core.ablation.edges import EdgeSettings, faithfulness_curve, top_edges
from core.ablation.edges.runs import check_edge_model, check_edge_run_fits
from core.ablation.patching import PatchSettings
from core.ablation.study import AblationSettings, summarize_ablation
from core.choices import SKIPPABLE, STUDY_TASKS
from core.errors import HeadLabError
from core.heads import HeadSet, head_name
from core.model.loading import DEFAULT_DTYPE, load_config, load_model, parse_dtype
from core.model.refs import Checkpoint, ModelRef, checkpoint_path, read_manifest, resolve_checkpoint
from core.pipelines.edges import EdgePlan, run_edges, score_edges
from core.pipelines.patching import PatchPlan, run_patching
from core.pipelines.recipe import ScreenReport, ScreenSettings, ablate, screen
from core.pipelines.study_circuit import MIB_CONTEXT, acdc_cost, group_disposer, hhg_record, path_record, proposers_record
from core.pipelines.study_roles import ioi_head_roles, logit_differences
from core.results import JsonResult
from core.stats.ioi_roles import group_role_summary, kv_group_view, mean_pairwise_jaccard
from core.store import cache_key, get_or_compute
from core.tasks.ioi import IoiCounterfactualSpec, ioi_spec
from core.tasks.specs import probe_spec
from core.tasks.tokens import tokenizer_of_folder

ROLES_STAGE = "roles-mlp0"  # the roles stage's cache name: its copy score goes through MLP0 (study_roles.py)
STUDY_VERSION = "1"
# the stages with a faithfulness curve are cached under this suffix: CPR from the top edges by signed score, CMD by
# |score| (MIB's evaluation code); records cached before it ranked both by |score|
CURVE_RULE = "-mib-signed-cpr"
MAX_EXAMPLES = 2048  # pairs or probe sequences: more would take hours per stage on a CPU
# progress(stage, done, total)
StageProgress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class StudySettings(JsonResult):
    """What one study measures: the task, its size and its controls (everything but the model and device).

    n: IOI pairs or induction probe sequences; seq_len: the induction probes' length; n_controls: matched-random
    draws (head groups and edge sets; 19 is the fewest that can give p <= 0.05); top_k_heads: heads activation-
    patched after attribution ranks them; top_edges: the discovered edge set; ig_steps: EAP-IG's steps;
    resamples: bootstrap resamples of the pairs for the edge set's stability; allow_small_gap: keep (flagged)
    pairs whose clean-corrupted gap is reversed or under 2 standard errors (an untrained model's).
    """

    task: str
    quick: bool = False
    n: int = 128
    seq_len: int = 64
    seed: int = 42
    n_controls: int = 39
    top_k_heads: int = 40
    top_edges: int = 100
    ig_steps: int = 5
    resamples: int = 3
    allow_small_gap: bool = False

    def __post_init__(self) -> None:
        if self.task not in STUDY_TASKS:
            raise HeadLabError(f"study task {self.task!r} is unknown; use one of {', '.join(STUDY_TASKS)}.")
        for name in ("n", "seq_len", "n_controls", "top_k_heads", "top_edges", "ig_steps", "resamples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < 1:
                raise HeadLabError(f"study {name} is {value!r}; give a whole number of 1 or more.")
            object.__setattr__(self, name, int(value))
        if self.n > MAX_EXAMPLES:
            raise HeadLabError(f"--n {self.n} is more than {MAX_EXAMPLES} examples; every stage runs over all of them "
                               f"on this machine: use {MAX_EXAMPLES} or fewer (--quick uses 24).")
        if self.n < 4:
            raise HeadLabError(f"--n {self.n} is too few examples for any statistic; use 4 or more (--quick uses 24).")
        if self.resamples < 2:
            raise HeadLabError("stability compares resamples: use --resamples 2 or more (3 by default).")


def study_settings(task: str, quick: bool = False, n: Optional[int] = None, seed: int = 42,
                   allow_small_gap: bool = False) -> StudySettings:
    """The settings of `study --quick` (minutes on a busy 2-core machine) or of the full study."""
    if quick:
        return StudySettings(task=task, quick=True, n=24 if n is None else n, seq_len=32, seed=seed, n_controls=19,
                             top_k_heads=12, top_edges=50, ig_steps=3, resamples=3, allow_small_gap=allow_small_gap)
    return StudySettings(task=task, quick=False, n=128 if n is None else n, seed=seed, allow_small_gap=allow_small_gap)


class LazyModel:
    """The checkpoint, loaded the first time a stage needs it (a finished study never loads it)."""

    def __init__(self, ref: ModelRef, checkpoint: Checkpoint, device: str, dtype: str) -> None:
        self.ref, self.checkpoint, self.device, self.dtype = ref, checkpoint, device, dtype
        self._model = None

    def __call__(self) -> Any:
        if self._model is None:
            self._model = load_model(self.ref, self.checkpoint.revision, device=self.device, dtype=self.dtype)
        return self._model


def cached_stage(ref: ModelRef, checkpoint: Checkpoint, settings: StudySettings, stage: str,
                 compute: Callable[[], dict], dtype: str) -> dict:
    """The stage's JSON record from core's store, else compute() timed, stored and returned ("cached" says which)."""
    key = cache_key("study", ref.name, checkpoint.revision, settings.to_json(), STUDY_VERSION,
                    {"stage": stage, "dtype": dtype})
    fresh = {}

    def run() -> tuple[dict, dict]:
        start = time.perf_counter()
        result = compute()
        fresh["seconds"] = time.perf_counter() - start
        return {}, {"result": result, "seconds": fresh["seconds"]}

    _, meta = get_or_compute(key, run)
    return {**meta["result"], "seconds": meta["seconds"], "cached": "seconds" not in fresh}


def model_note(ref: ModelRef) -> dict:
    """What the report must say about the weights: the manifest's source and note (e.g. a 4-bit quantization)."""
    manifest = read_manifest(ref.name, missing_ok=True) if ref.kind == "zoo" else None
    if not manifest:
        return {"note": "", "source": {}}
    source = manifest.get("source") or {}
    keep = ("file", "sha256", "format", "architecture", "quantization", "model_name", "licence")
    return {"note": manifest.get("note", ""), "source": {k: source[k] for k in keep if k in source}}


def check_skip(skip: tuple[str, ...], task: str) -> tuple[str, ...]:
    """The IOI stages to leave out, refused when unknown or asked of the induction study."""
    skip = tuple(skip)
    unknown = [name for name in skip if name not in SKIPPABLE]
    if unknown:
        raise HeadLabError(f"--skip {','.join(unknown)}: unknown stage; leave out any of {', '.join(SKIPPABLE)}.")
    if skip and task != "ioi":
        raise HeadLabError("--skip names IOI stages; leave it out with --task induction.")
    return skip


def run_study(ref: ModelRef, settings: StudySettings, revision: Optional[str] = None, device: str = "cpu",
              dtype: str = DEFAULT_DTYPE, progress: Optional[StageProgress] = None, skip: tuple[str, ...] = ()) -> dict:
    """The whole study of one task on one checkpoint: {model, settings, stages..., wall_seconds}. skip: IOI stages
    left out (named in the report; the cache keys do not depend on it, so a later run adds them)."""
    start = time.perf_counter()
    skip = check_skip(skip, settings.task)
    checkpoint = resolve_checkpoint(ref, revision)
    config = load_config(ref, checkpoint.revision)
    folder = checkpoint_path(ref, checkpoint.revision)
    tokenizer = tokenizer_of_folder(folder, local=ref.kind != "hub", revision=revision)
    model = LazyModel(ref, checkpoint, device, dtype)
    shape = {"n_layers": int(config.num_hidden_layers), "n_heads": int(config.num_attention_heads),
             "n_kv_heads": int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)}
    out = {"model": ref.name, "revision": checkpoint.revision, "task": settings.task, "settings": settings.to_json(),
           "dtype": dtype, "device": device, "shape": shape, **model_note(ref)}
    if settings.task == "induction":
        out["induction"] = induction_section(ref, checkpoint, settings, tokenizer, model, shape, dtype, progress)
    else:
        if tokenizer is None:
            raise HeadLabError(f"{ref.name} has no tokenizer of its own (a byte-level zoo model); the ioi task needs "
                               "one with one-token names: use --task induction, or a real model such as smollm2-135m.")
        spec = IoiCounterfactualSpec(ioi_spec(tokenizer, settings.n, settings.seed), "abc", 0)
        check_edge_run_fits(config, spec.seq_len, parse_dtype(dtype), True, device)
        out["ioi"] = ioi_section(ref, checkpoint, settings, spec, model, shape, dtype, progress, skip)
    out["wall_seconds"] = time.perf_counter() - start
    out["stage_seconds"] = {name: record.get("seconds") for section in ("induction", "ioi") if section in out
                            for name, record in out[section].items() if isinstance(record, dict) and "seconds" in record}
    return out


# ---------------------------------------------------------------------------------------------
# induction


def screen_summary(report: ScreenReport) -> dict:
    """The screen's figures the study reads: both circuits, the threshold and the membership selectivities."""
    final = report.final
    membership = {name: np.asarray(final.membership_of(name)).tolist() for name in ("induction", "previous-token")}
    return {"probe_spec": report.probe_spec, "candidate_circuit": [head_name(h) for h in report.candidate_circuit],
            "previous_token_circuit": [head_name(h) for h in final.previous_token_circuit],
            "induction_threshold": float(final.induction_threshold), "membership_selectivity": membership,
            "fractions": final.fractions()}


def ablation_record(result: Any, kind: str, note: str = "") -> dict:
    """The candidate against its controls: rank, p, z, verdicts, and the loss with and without it."""
    summary = summarize_ablation(result)
    loss = summary["metrics"].get("loss", {})
    return {"summary": summary, "controls": kind, "note": note,
            "loss_clean": loss.get("clean"),
            "loss_ablated": None if loss.get("clean") is None else loss["clean"] + loss["candidate_delta"]}


def induction_section(ref: ModelRef, checkpoint: Checkpoint, settings: StudySettings, tokenizer: Any,
                      model: LazyModel, shape: dict, dtype: str, progress: Optional[StageProgress]) -> dict:
    """Both probes' pattern screens, the candidate ablated on the repeated-sequence probe against matched-random
    controls, and the per-layer and per-KV-group views."""
    s = settings
    specs = {task: probe_spec(task, s.n, s.seq_len, s.seed, None, None, tokenizer)
             for task in ("induction", "induction-repeat")}
    out: dict = {}
    for i, (task, spec) in enumerate(specs.items()):
        _say(progress, "screen", i, len(specs))
        out[f"screen_{task}"] = cached_stage(ref, checkpoint, s, f"screen-{task}", lambda spec=spec: screen_summary(
            screen(ref, spec, ScreenSettings(n_null_draws=100), device=model.device, dtype=dtype)), dtype)
    _say(progress, "screen", len(specs), len(specs))
    candidate = out["screen_induction"]["candidate_circuit"]
    chosen_note = ""
    if not candidate:
        values = np.asarray(out["screen_induction"]["membership_selectivity"]["induction"])
        order = np.argsort(-values, axis=None)[:3]
        candidate = [head_name(divmod(int(i), shape["n_heads"])) for i in order]
        chosen_note = ("no head reached the membership threshold; the 3 heads of highest induction selectivity "
                       "were ablated instead")

    def ablate_candidate() -> dict:
        heads = HeadSet(tuple(tuple(int(x) for x in name[1:].split("H")) for name in candidate))
        bar = (lambda done, total: progress("ablation", done, total)) if progress else None
        matched = AblationSettings(n_controls=s.n_controls, controls="matched", n_boot=500)
        try:
            result = ablate(ref, checkpoint.revision, heads, specs["induction-repeat"], matched, model.device, bar,
                            model=model(), dtype=dtype)
            return ablation_record(result, "matched", chosen_note)
        except HeadLabError as exc:  # more than half of a layer: no matched control exists
            any_layer = AblationSettings(n_controls=s.n_controls, controls="any-layer", n_boot=500)
            result = ablate(ref, checkpoint.revision, heads, specs["induction-repeat"], any_layer, model.device, bar,
                            model=model(), dtype=dtype)
            return ablation_record(result, "any-layer", f"{chosen_note} matched controls impossible ({exc})".strip())

    out["ablation"] = cached_stage(ref, checkpoint, s, "ablation", ablate_candidate, dtype)
    out["candidate"] = candidate
    out["groups"] = group_views(out["screen_induction"], shape)
    return out


def circuit_labels(screen_record: dict, shape: dict) -> np.ndarray:
    """[layer, head] "induction", "previous-token" or "" from a screen's two circuits."""
    labels = np.full((shape["n_layers"], shape["n_heads"]), "", dtype=object)
    for key, label in (("previous_token_circuit", "previous-token"), ("candidate_circuit", "induction")):
        for name in screen_record[key]:
            layer, head = (int(x) for x in name[1:].split("H"))
            labels[layer, head] = label
    return labels


def group_views(screen_record: dict, shape: dict) -> dict:
    """Whole-layer counts and the KV groups: do the query heads of one group share a role?"""
    labels = circuit_labels(screen_record, shape)
    records = kv_group_view(labels, shape["n_kv_heads"])
    roles = ("induction", "previous-token")
    per_layer = [{"layer": layer, **{role: int((labels[layer] == role).sum()) for role in roles}}
                 for layer in range(shape["n_layers"]) if (labels[layer] != "").any()]
    return {"per_layer": per_layer, "kv_groups": [r for r in records if any(r["classes"])],
            "summary": group_role_summary(records, roles), "heads_per_group": shape["n_heads"] // shape["n_kv_heads"]}


# ---------------------------------------------------------------------------------------------
# IOI


def _say(progress: Optional[StageProgress], stage: str, done: int, total: int) -> None:
    if progress is not None:
        progress(stage, done, total)


def edge_record(report: Any, top: int) -> dict:
    """An edge run's figures: the top edges, the MIB curve, the controls' verdict (not every edge's score)."""
    scores = report.scores
    out = {"method": scores.method, "n_edges": len(scores.edges), "clean_value": scores.clean_value,
           "corrupted_value": scores.corrupted_value,
           "top_edges": [[edge, float(value)] for edge, value in scores.top(min(top, len(scores.edges)))],
           "discovered": list(report.discovered), "heads": [head_name(h) for h in report.heads],
           "notes": list(report.notes), "run_seconds": report.seconds}
    if report.curve is not None:
        c = report.curve
        out["curve"] = {"fractions": list(c.fractions), "n_edges_kept": list(c.n_edges_kept),
                        "faithfulness": list(c.faithfulness), "faithfulness_signed": list(c.faithfulness_signed),
                        "cpr": c.cpr, "cmd": c.cmd}
    if report.controls is not None:
        e = report.controls
        out["controls"] = {"faithfulness": e.faithfulness, "control_faithfulness": list(e.control_faithfulness),
                           "stats": e.stats, "verdict": e.verdict.label, "reasons": list(e.verdict.reasons)}
    return out


def patching_record(report: Any) -> dict:
    act = report.activation
    exact = np.ones(act.scores.shape, dtype=bool) if act.exact is None else np.asarray(act.exact, dtype=bool)
    order = np.argsort(-np.abs(act.scores), axis=None, kind="stable")[:15]
    n_heads = act.scores.shape[1]
    return {"clean_value": act.clean_value, "corrupted_value": act.corrupted_value,
            "scores": np.asarray(act.scores).tolist(), "exact": exact.tolist(),
            "attribution": None if report.attribution is None else np.asarray(report.attribution.scores).tolist(),
            "top_heads": [[head_name(divmod(int(i), n_heads)), float(act.scores.flat[i]), bool(exact.flat[i])]
                          for i in order],
            "spearman": report.spearman, "notes": list(report.notes), "run_seconds": report.seconds}


def ioi_section(ref: ModelRef, checkpoint: Checkpoint, settings: StudySettings, spec: IoiCounterfactualSpec,
                model: LazyModel, shape: dict, dtype: str, progress: Optional[StageProgress],
                skip: tuple[str, ...] = ()) -> dict:
    """Logit difference, attribution then activation patching, EAP and EAP-IG edges with MIB's curve, a random-
    edge baseline, the discovered set against matched-random edge sets, stability and head roles."""
    s = settings
    pair_cache: dict = {}

    def pair():
        if "pair" not in pair_cache:
            pair_cache["pair"] = spec.build()
        return pair_cache["pair"]

    def stage(name: str):
        return None if progress is None else (lambda done, total: progress(name, done, total))

    out: dict = {"pairs": {"n": s.n, "corruption": spec.corruption, "templates": list(spec.probe.templates),
                           "names": len(spec.probe.names), "seq_len": spec.seq_len}, "skipped": list(skip)}

    def run(name: str, key: str, compute: Callable[[], dict], cache_name: str = "") -> None:
        if name not in skip:
            out[key] = cached_stage(ref, checkpoint, s, cache_name or name, compute, dtype)

    out["logit_diff"] = cached_stage(ref, checkpoint, s, "logit-diff",
                                     lambda: logit_differences(model(), pair()), dtype)
    edge_settings = EdgeSettings(metric="logit_diff", replacement="resample", allow_small_gap=s.allow_small_gap)
    out["patching"] = cached_stage(ref, checkpoint, s, "patching", lambda: patching_record(run_patching(
        model(), pair(), PatchSettings(allow_small_gap=s.allow_small_gap), PatchPlan(attribution=True, top_k=min(s.top_k_heads, shape["n_layers"] *
                                                                                 shape["n_heads"])),
        progress)), dtype)
    run("roles", "roles", lambda: ioi_head_roles(model(), spec, pair(), out["logit_diff"]["clean_mean"]), ROLES_STAGE)
    for method, controls in (("eap", 0), ("eap-ig", s.n_controls)):
        plan = EdgePlan(method=method, ig_steps=s.ig_steps, top=s.top_edges, curve=True, n_controls=controls)
        run(f"edges-{method}", f"edges_{method}",
            lambda plan=plan: edge_record(run_edges(model(), pair(), edge_settings, plan, progress), s.top_edges),
            f"edges-{method}{CURVE_RULE}")

    def random_curve() -> dict:
        graph = check_edge_model(model())
        scores = np.random.default_rng(s.seed).standard_normal(graph.n_edges)
        c = faithfulness_curve(model(), pair(), scores, edge_settings, method="random", progress=stage("random curve"))
        return {"fractions": list(c.fractions), "n_edges_kept": list(c.n_edges_kept),
                "faithfulness": list(c.faithfulness), "faithfulness_signed": list(c.faithfulness_signed),
                "cpr": c.cpr, "cmd": c.cmd, "seed": s.seed}

    run("random-edges", "random_edges", random_curve, f"random-edges{CURVE_RULE}")
    run("stability", "stability", lambda: edge_stability(model(), pair(), s, edge_settings, stage("stability")))
    circuit_stages(out, ref, s, spec, model, pair, dtype, stage, run)
    out["mib_context"] = MIB_CONTEXT
    return out


def circuit_stages(out: dict, ref: ModelRef, s: StudySettings, spec: IoiCounterfactualSpec,
                   model: LazyModel, pair: Callable[[], Any], dtype: str, stage: Callable, run: Callable) -> None:
    """The stages on the discovered circuits (core/pipelines/study_circuit.py): the disposer on each edge method's
    heads, path patching into the top heads' q, k and v, the proposers, [HHG]'s ranks and ACDC's cost."""
    for method in ("eap", "eap-ig"):
        heads = out.get(f"edges_{method}", {}).get("heads")
        if heads:
            run("disposer", f"disposer_{method}", lambda heads=heads: group_disposer(
                model(), pair(), heads, s.n_controls, s.seed, stage(f"disposer {method}"), s.allow_small_gap),
                f"disposer-{method}")
            ablation = out.get(f"disposer_{method}", {}).get("ablation")
            if ablation and ablation.get("loss_clean") is not None:  # the report's controls column, in loss units
                control = ablation["summary"]["metrics"]["loss"]["control_mean"]
                ablation["loss_controls_mean"] = ablation["loss_clean"] + control
    run("paths", "paths", lambda: path_record(model(), pair(), out["patching"], out.get("roles"), s.n_controls, s.seed,
                                              stage("paths"), s.allow_small_gap))
    run("proposers", "proposers", lambda: proposers_record(ref, spec.probe, s.n_controls, model.device, dtype))
    if "proposers" in out:
        run("gradient-vs-causal", "gradient_vs_causal", lambda: hhg_record(
            model(), pair(), out["proposers"]["gradient"], stage("gradient vs causal"), s.allow_small_gap))
    edge_settings = EdgeSettings(metric="logit_diff", replacement="resample", allow_small_gap=s.allow_small_gap)
    run("acdc-cost", "acdc_cost", lambda: acdc_cost(model(), pair(), edge_settings), "acdc-cost-cpu")


def edge_stability(model: Any, pair: Any, settings: StudySettings, edge_settings: EdgeSettings,
                   progress: Optional[Callable[[int, int], None]] = None) -> dict:
    """EAP's top edge set on bootstrap resamples of the pairs (numpy default_rng(seed + r)); mean pairwise Jaccard."""
    sets = []
    plan = EdgePlan(method="eap", top=settings.top_edges, curve=False, n_controls=0)
    for r in range(settings.resamples):
        rng = np.random.default_rng(settings.seed + 1 + r)
        index = torch.from_numpy(rng.choice(pair.n_examples, size=pair.n_examples, replace=True))
        scores = score_edges(model, pair.select(index), edge_settings, plan)
        keep = top_edges(np.abs(np.asarray(scores.scores)), settings.top_edges)
        sets.append({scores.edges[i] for i in np.nonzero(keep)[0]})
        if progress is not None:
            progress(r + 1, settings.resamples)
    return {"k": settings.top_edges, "resamples": settings.resamples, "method": "eap",
            "mean_pairwise_jaccard": mean_pairwise_jaccard(sets),
            "resample": "bootstrap of the pairs, numpy default_rng(seed + 1 + r)"}
