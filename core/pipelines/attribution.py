"""Gradient attribution vs causal importance [HHG]: hidden heroes, gradient bloats, superadditivity.

METHODS.md, "Gradient attribution vs causal importance". For a model trained on sequence reversal
or sorting, every component (each attention head, each MLP) gets

- a gradient magnitude G: the mean over B out-of-distribution (OOD) batches of the Frobenius norm
  of the loss gradient over the component's parameters (`gradient_magnitudes`);
- a causal importance C: the drop in OOD exact-match accuracy (greedy decoding) when the component
  is ablated through the ablation engine (`causal_importance`);

and the two are compared by rank: Spearman rho, rank differences d = rank_G - rank_C, classes
(d >= 6 "bloat": large gradient, small effect; d <= -6 "hero": small gradient, large effect),
joint ablation of all bloats / all heroes with two superadditivity ratios, and a summary over seeds.
Preset runs store one JSON per model under reports/attribution/<ablation mode> (`run_preset`); `stored_summaries`
regroups them (per task and settings) for the app's seed-level figures (core/figures/attribution.py).
The measures are in core/pipelines/attribution_measures.py, the statistics and result types (no
model) in core/pipelines/attribution_results.py; this module runs them on a model and a preset.

Choices fixed here (named in every result's settings):
- Components are named "L1H3" (head 3 of layer 1) and "L1MLP" (the MLP of layer 1), ordered layer
  by layer: the heads of layer l (0..H-1), then the MLP of layer l; the reference code's sorted
  "L{l}_H{h}", "L{l}_MLP" keys give the same order.
- Gradient blocks are weights only, no biases. "paper": a head's W_V rows and W_O columns together,
  an MLP's output matrix, norm divided by sqrt(number of weights). "reference": the head's W_V rows,
  the MLP's output matrix, unnormalised (as the reference code). A head's bias slice is left out
  because the paper names the W_V and W_O slices; W_O's bias is shared by all heads of a layer.
- Gradients are taken on a plain Hugging Face model (`core.model.loading.load_hf_model`): the
  TransformerBridge splits GPT-NeoX's fused QKV weight into copies, so the fused weight of a
  bridge-wrapped model gets no gradient.
- Mean ablation replaces a head's hook_z slice / an MLP's output by its per-position mean over the
  evaluation sequences (teacher-forced clean runs on the same examples that are scored). The
  reference code uses one mean over batch and positions instead; HeadLab follows METHODS.md.
- Superadditivity ratios are undefined (None, with the reason) for fewer than 2 components or when
  the single damages sum to <= 0 (then the mean and the sum are both non-positive).
- Spread over seeds is the population standard deviation (ddof=0).
- Greedy exact match is computed in one teacher-forced pass per example (the argmax at every answer
  position right), which equals step-by-step greedy decoding for a causal model and is n+1 times
  cheaper; a test checks the two agree example by example.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from core.ablation.spec import MODE_HELP, mode_label
from core.errors import HeadLabError
from core.executor import Executor, ProgressBar, Task, tqdm_progress
from core.model.loading import DEFAULT_DTYPE, dtype_name, load_hf_model, load_model
from core.model.refs import ModelRef, list_zoo, repair_hint, resolve_checkpoint
from core.pipelines.attribution_measures import (
    AccuracyUnderAblation,
    NoOODLengthError,
    ProgressFn,
    bridge_logits_fn,
    check_model_for_task,
    component_blocks,
    gradient_magnitudes,
    pick_ood_length,
    single_damages,
)
from core.pipelines.attribution_results import AttributionResult, AttributionSettings, AttributionSummary, assemble_result, summarize
from core.results import package_versions
from core.tasks.sequences import OOD_ACCURACY_BAND, OOD_LENGTHS, TASKS
from core.workspace import atomic_write_json, reports_dir, zoo_dir
from core.zoo.presets import preset_models


# ----------------------------------------------------------------------------------------------
# One model
# ----------------------------------------------------------------------------------------------


def analyze_model(
    hf_model: Any, bridge: Any, settings: AttributionSettings, model_name: str = "", revision: str | None = None,
    manifest_task: str | None = None, progress: ProgressFn | None = None,
) -> AttributionResult:
    """The whole analysis of one model: OOD length, G, C, ranks, classes, joint ablations.

    hf_model: the plain Hugging Face model (gradients); bridge: a TransformerBridge over the same
    weights (ablations). manifest_task: the task the zoo manifest names, when known.
    """
    name = model_name or "model"
    check_model_for_task(hf_model, settings.task, manifest_task, name)
    blocks = component_blocks(hf_model)
    if (blocks.n_layers, blocks.n_heads) != (int(bridge.cfg.n_layers), int(bridge.cfg.n_heads)):
        raise HeadLabError("the Hugging Face model and the bridge differ in shape; load both from the same checkpoint.")
    if progress is not None:
        progress("clean accuracy per OOD length", 0, 1)
    length, accuracy = pick_ood_length(bridge_logits_fn(bridge), settings.task, settings.n_examples, settings.seed, settings.ood_length)
    if progress is not None:
        progress("clean accuracy per OOD length", 1, 1)
    G = gradient_magnitudes(hf_model, settings.task, length, settings.n_batches, settings.batch_size, settings.seed,
                            settings.gradient_variant, progress)
    evaluator = AccuracyUnderAblation(bridge, settings.task, length, settings.n_examples, settings.seed,
                                      settings.ablation_mode, blocks.components)
    C = single_damages(evaluator, blocks.components, progress)
    provenance = {
        "versions": package_versions(), "ood_length_rule": "given" if settings.ood_length is not None else
        f"first of {OOD_LENGTHS.start}..{OOD_LENGTHS.stop - 1} with clean accuracy in [{OOD_ACCURACY_BAND[0]}, {OOD_ACCURACY_BAND[1]}]",
        "gradient_blocks": {c: [p.name + f"[{_fmt(p.rows)}, {_fmt(p.cols)}]" for p in
                                (blocks.paper if settings.gradient_variant == "paper" else blocks.reference)[c]]
                            for c in blocks.components},
        "gradient_batches": f"{settings.n_batches} batches of {settings.batch_size} at length {length}, generator seeded from (seed, 1)",
        "evaluation": f"{settings.n_examples} examples make_sequence_batch(task, {length}, n, seed={settings.seed}), greedy "
                      "exact match (computed in one teacher-forced pass, identical for a causal model)",
        "ablation": ablation_provenance(settings.ablation_mode),
    }

    def joint_damage(members: Sequence[str]) -> float:
        stage = f"joint ablation of {len(members)} components"
        if progress is not None:
            progress(stage, 0, 1)
        value = evaluator.damage(members)
        if progress is not None:
            progress(stage, 1, 1)
        return value

    result = assemble_result(name, revision, blocks.components, G, C, evaluator.clean, accuracy, length, settings,
                             joint_damage)
    return replace(result, notes=tuple(blocks.notes) + result.notes, provenance=provenance)


def _fmt(s: slice) -> str:
    return ":" if s.start is None and s.stop is None else f"{s.start}:{s.stop}"


def manifest_task(ref: Any) -> str | None:
    """The task a zoo (or local HeadLab) model's manifest names; None when there is no manifest."""
    root = zoo_dir() / ref.name if ref.kind == "zoo" else Path(ref.name) if ref.kind == "local" else None
    if root is None or not (root / "manifest.json").is_file():
        return None
    try:
        return json.loads((root / "manifest.json").read_text()).get("task")
    except (OSError, ValueError):
        raise HeadLabError(f"{root / 'manifest.json'} is unreadable; {repair_hint(root)}.") from None


def analyze_ref(ref: Any, settings: AttributionSettings, revision: str | None = None, device: str = "cpu",
                progress: ProgressFn | None = None, dtype: str = DEFAULT_DTYPE) -> AttributionResult:
    """Load a model (plain HF for gradients, a bridge for ablations) on `device` in `dtype` and analyse it."""
    trained_for = manifest_task(ref)
    check_model_for_task(None, settings.task, trained_for, ref.name)  # before any weight is read
    resolved = revision if ref.kind == "hub" else resolve_checkpoint(ref, revision).revision
    hf_model = load_hf_model(ref, resolved, device, dtype)
    check_model_for_task(hf_model, settings.task, trained_for, ref.name)
    bridge = load_model(ref, resolved, device, dtype)
    result = analyze_model(hf_model, bridge, settings, ref.name, resolved, trained_for, progress)
    return replace(result, provenance={**result.provenance, "model_ref": ref.to_json(), "device": device,
                                       "dtype": dtype_name(dtype)})


# ----------------------------------------------------------------------------------------------
# Preset runs and their stored per-model results
# ----------------------------------------------------------------------------------------------


def ablation_provenance(mode: str) -> dict:
    """What a result's provenance says about its ablation: the mode, what it writes, and where."""
    site = ("heads: the d_head columns of the attention output after W_O (blocks.{l}.attn.hook_out)"
            if mode == "reference-slice" else "heads: blocks.{l}.attn.hook_z (before W_O)")
    return {"mode": mode_label(mode), "replacement": MODE_HELP[mode], "site": site + "; MLPs: the MLP output hook; every position",
            "statistics": "the evaluation sequences' teacher-forced clean run"}


def attribution_dir() -> Path:
    """Where per-model results of preset runs are kept: reports_dir()/attribution/<ablation mode>/."""
    path = reports_dir() / "attribution"
    path.mkdir(parents=True, exist_ok=True)
    return path


def result_paths(name: str, settings: AttributionSettings) -> tuple[Path, Path]:
    """(result, skip record) of model `name` under `settings`: one folder per ablation mode, so the
    variants' results sit side by side. (Files directly in attribution_dir() are from before "mean"
    meant one mean over all positions, issue 18; nothing reads them.)"""
    folder = attribution_dir() / settings.ablation_mode
    return folder / f"{name}.json", folder / f"{name}.skipped.json"


def _record_dtype(data: dict) -> str:
    """The dtype a stored record (result or skip) was made in; records older than the dtype: float32."""
    return str(data.get("dtype") or (data.get("provenance") or {}).get("dtype") or DEFAULT_DTYPE)


def _stored(path: Path, settings: AttributionSettings, revision: str, dtype: str = DEFAULT_DTYPE) -> dict | None:
    """A stored per-model record (result or skip) made with the same settings on the same
    checkpoint in the same dtype, else None."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        same = (AttributionSettings.from_json(data["settings"]) == settings and data.get("revision") == revision
                and _record_dtype(data) == dtype_name(dtype))
        return data if same else None
    except (OSError, ValueError, KeyError, TypeError, HeadLabError):
        return None  # unreadable or from another version: recompute


def stored_result(name: str, settings: AttributionSettings, revision: str,
                  dtype: str = DEFAULT_DTYPE) -> AttributionResult | None:
    """The stored result of model `name` at `revision` made with `settings` in `dtype` (a preset
    run's result_paths), else None."""
    data = _stored(result_paths(name, settings)[0], settings, revision, dtype)
    return None if data is None else AttributionResult.from_json(data)


def stored_summaries(task: str | None = None, folder: Path | None = None) -> list[AttributionSummary]:
    """Summaries of the stored per-model results (attribution_dir() by default), one per group
    analysed alike (same task, settings and components), largest group first.

    Each summary names the models skipped under its settings, and stored results of zoo models
    retrained since (another final revision) as skipped, not counted. Unreadable files are left out.
    """
    folder = attribution_dir() if folder is None else Path(folder)
    groups: dict[tuple, list[AttributionResult]] = {}
    skipped: dict[AttributionSettings, list[tuple[str, str]]] = {}
    for path in sorted(folder.glob("*/*.json")):  # <ablation mode>/<model>.json
        if path.name.startswith("summary-"):
            continue
        try:
            data = json.loads(path.read_text())
            if path.name.endswith(".skipped.json"):
                skipped.setdefault(AttributionSettings.from_json(data["settings"]), []).append((str(data["model"]), str(data["reason"])))
                continue
            result = AttributionResult.from_json(data)
        except (OSError, ValueError, KeyError, TypeError, HeadLabError):
            continue  # unreadable or from another version
        if task is not None and result.task != task:
            continue
        current, _ = _zoo_status(result.model)
        if current is not None and result.revision != current:
            skipped.setdefault(result.settings, []).append(
                (result.model, f"stored result is for {result.revision}, the model was retrained to {current}; rerun the preset"))
            continue
        groups.setdefault((result.settings, result.components), []).append(result)
    summaries = [summarize(results, skipped.get(settings, ())) for (settings, _), results in groups.items()]
    return sorted(summaries, key=lambda s: -s.n_models)


def sequence_zoo_models() -> dict[str, str]:
    """{zoo model: task} for every zoo model whose manifest names reverse or sort."""
    out = {}
    for name in list_zoo():
        try:
            task = manifest_task(ModelRef(name, "zoo"))
        except HeadLabError:
            continue
        if task in TASKS:
            out[name] = task
    return out


def _zoo_status(name: str) -> tuple[str | None, str]:
    """(final revision, "") for a fully trained zoo model, else (None, why it cannot be analysed)."""
    path = zoo_dir() / name / "manifest.json"
    if not path.is_file():
        return None, "not trained"
    try:
        manifest = json.loads(path.read_text())
        checkpoints = sorted(manifest["checkpoints"], key=lambda c: (int(c["tokens"]), int(c["step"])))
    except (OSError, ValueError, KeyError, TypeError):
        return None, f"manifest {path} is unreadable"
    if not manifest.get("complete", True):
        return None, "still training (its manifest is not complete)"
    if not checkpoints:
        return None, "no checkpoints"
    return str(checkpoints[-1]["revision"]), ""


def attribution_model_task(name: str, settings: AttributionSettings, revision: str, device: str, dtype: str,
                           progress: ProgressFn | None = None) -> tuple[str, str]:
    """One model of a preset analysed and stored (an executor task): ("result", path) or ("skipped", reason).

    The result goes to its result_paths atomically (a model the OOD band skips: its skip record), so
    a rerun reuses it."""
    path, skip_path = result_paths(name, settings)
    try:
        result = analyze_ref(ModelRef(name, "zoo"), settings, revision, device=device, progress=progress, dtype=dtype)
    except NoOODLengthError as exc:
        atomic_write_json(skip_path, {"model": name, "revision": revision, "reason": str(exc), "settings": settings.to_json(),
                                      "dtype": dtype_name(dtype)})
        return "skipped", str(exc)
    atomic_write_json(path, result.to_json())
    skip_path.unlink(missing_ok=True)
    return "result", str(path)


def run_preset(preset: str, settings: AttributionSettings, device: str = "cpu", progress: bool = True,
               force: bool = False, dtype: str = DEFAULT_DTYPE,
               executor: Executor | None = None) -> tuple[AttributionSummary, dict[str, Path]]:
    """Analyse every model of the preset for `settings.task`, resumably: each model's result is
    stored atomically as attribution_dir()/<model>.json (a model skipped by the OOD band as
    <model>.skipped.json) and reused when its settings and dtype match. Returns the summary and the paths.

    executor: the models not stored yet run as its tasks, one per model (seeds in parallel on Ray);
    without one they run here one after another, with a per-model stage in the bar."""

    names = preset_models(preset, settings.task)
    if not names:
        raise HeadLabError(f"the {preset} preset has no {settings.task} models; pick another preset.")
    status = {n: _zoo_status(n) for n in names}
    ready = [n for n in names if status[n][0] is not None]
    if not ready:
        raise HeadLabError(f"none of the {preset} preset's {settings.task} models is trained; run python -m core zoo --preset {preset} first.")
    outcome: dict[str, tuple[str, str]] = {}  # name -> ("result", path) | ("skipped", reason)
    for name in ready:
        revision = status[name][0]
        path, skip_path = result_paths(name, settings)
        stored = None if force else _stored(path, settings, revision, dtype)
        stored_skip = None if force or stored is not None else _stored(skip_path, settings, revision, dtype)
        if stored is not None:
            outcome[name] = ("result", str(path))
        elif stored_skip is not None:
            outcome[name] = ("skipped", stored_skip["reason"])
    todo = [name for name in ready if name not in outcome]
    bar = ProgressBar(total=len(todo), desc=f"attribution {settings.task}", unit="model", disable=not progress)
    with bar:
        if executor is None:
            for name in todo:
                bar.set_postfix_str(name)
                stage = postfix_progress(bar, name) if progress else None
                outcome[name] = attribution_model_task(name, settings, status[name][0], device, dtype, stage)
                bar.update(1)
        else:
            tasks = [Task(f"attribution {name}", attribution_model_task, (name, settings, status[name][0], device, dtype))
                     for name in todo]
            for index, done in executor.results(tasks, tqdm_progress(bar) if progress else None):
                outcome[todo[index]] = done
    results: list[AttributionResult] = []
    skipped: list[tuple[str, str]] = [(n, status[n][1]) for n in names if status[n][0] is None]
    paths: dict[str, Path] = {}
    for name in ready:  # in the preset's order, whatever order the tasks finished in
        kind, value = outcome[name]
        if kind == "skipped":
            skipped.append((name, value))
        else:
            results.append(AttributionResult.from_json(json.loads(Path(value).read_text())))
            paths[name] = Path(value)
    if not results:
        reasons = "; ".join(f"{n}: {why}" for n, why in skipped)
        raise HeadLabError(f"no {settings.task} model of the {preset} preset could be analysed ({reasons}); see the reasons and retrain or pass --ood-length.")
    summary = summarize(results, skipped)
    summary_path = attribution_dir() / settings.ablation_mode / f"summary-{preset}-{settings.task}.json"
    atomic_write_json(summary_path, summary.to_json())
    paths["summary"] = summary_path
    return summary, paths


def postfix_progress(bar: Any, name: str) -> ProgressFn:
    """A ProgressFn that shows the current stage of one model in a tqdm bar's postfix."""

    def show(stage: str, done: int, total: int) -> None:
        bar.set_postfix_str(f"{name + ': ' if name else ''}{stage} {done}/{total}")

    return show
