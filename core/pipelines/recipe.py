"""The spectral probe-circuit recipe end to end [SPC]: screen (Steps 1-2), then group ablation (Step 3).

`screen` measures every checkpoint once (through the HeadStats cache), turns the head outputs into
PR trajectories and the PR-integral ranking, and screens the final checkpoint's attention for the
six canonical patterns. The candidate induction circuit is the set of heads at or above the
membership threshold. `run_recipe` adds Step 3: the candidate against matched-random draws and the
upper bound, with the recipe's verdict.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from core.errors import HeadLabError
from core.heads import HeadSet, head_name
from core.model.loading import Checkpoint, ModelRef, list_checkpoints, load_config, load_model, resolve_checkpoint
from core.probe import HeadStats, collect_head_stats
from core.stats.selectivity import CLASS_THRESHOLD, INDUCTION_THRESHOLD, ScreenResult, selectivity
from core.stats.spectral import DEFAULT_DEFINITION, DEFAULT_RULE, SpectralResult, pr_per_head
from core.store import add_probe_spec_arguments, cached_head_stats, check_spec_fits_config, probe_spec_from_args
from core.tasks import (InductionProbeSpec, ProbeBatch, TextProbeSpec, make_induction_probe,
                        make_text_probe)

TASKS = ("induction", "text")


# ---------------------------------------------------------------------------------------------
# probe batches and cached head statistics


def probe_spec(task: str, n_examples: int = 256, seq_len: int = 64, seed: int = 42,
               token_low: int = 0, token_high: int = 256) -> InductionProbeSpec | TextProbeSpec:
    """The probe spec of a task; the zoo default is 256 sequences of 64 byte tokens."""
    if task == "induction":
        return InductionProbeSpec(n_examples=n_examples, seq_len=seq_len, token_low=token_low,
                                  token_high=token_high, seed=seed)
    if task == "text":
        return TextProbeSpec(n_examples=n_examples, seq_len=seq_len, seed=seed)
    raise HeadLabError(f"unknown probe task '{task}'; use one of: {', '.join(TASKS)}.")


def build_probe(spec: InductionProbeSpec | TextProbeSpec) -> ProbeBatch:
    return make_induction_probe(spec) if isinstance(spec, InductionProbeSpec) else make_text_probe(spec)


def head_stats(ref: ModelRef, checkpoint: Checkpoint, batch: ProbeBatch, model: Any = None,
               device: str = "cpu", chunk_size: int = 64,
               on_status: Optional[Callable[[str], None]] = None) -> HeadStats:
    """One checkpoint's HeadStats, from the cache or one instrumented pass (then cached)."""

    def compute() -> HeadStats:
        loaded = model if model is not None else load_model(ref, checkpoint.revision, device=device)
        provenance = {"model": ref.name, "revision": checkpoint.revision, "tokens": checkpoint.tokens}
        return collect_head_stats(loaded, batch, chunk_size=chunk_size, device=device, provenance=provenance)

    return cached_head_stats(ref, checkpoint.revision, dict(batch.spec), compute, on_status=on_status)


REFERENCE_PROBE_LENGTH = 256


def scaled_induction_threshold(query_pos, threshold_at_reference: float = INDUCTION_THRESHOLD) -> float:
    """The membership threshold for this probe's length: the same share of attention on p+1.

    Membership is judged against the uniform baseline 1/(q+1), so a head's selectivity is its
    attention share times (q+1): 50x at the reference T = 256 means >= 19.5% of the attention on
    p+1. A zoo probe of T = 64 caps selectivity at 64x, so the same share is 12.5x there.
    """
    mean_keys = float((query_pos.double() + 1).mean())  # query_pos: [example]
    return threshold_at_reference * mean_keys / REFERENCE_PROBE_LENGTH


def screen_checkpoint(stats: HeadStats, baseline: str = "random", class_threshold: float = CLASS_THRESHOLD,
                      induction_threshold: Optional[float] = None, n_null_draws: int = 500) -> ScreenResult:
    """Step 2 on one checkpoint's HeadStats (the null needs the stored attention rows).

    induction_threshold: None scales the reference 50x to the probe length (scaled_induction_threshold).
    """
    if induction_threshold is None:
        induction_threshold = scaled_induction_threshold(stats.query_pos)
    if stats.attn_query is not None:
        return ScreenResult.from_attention(
            stats.attn_query.float(), stats.query_pos, stats.induction_pos, stats.duplicate_pos,
            baseline=baseline, threshold=class_threshold, induction_threshold=induction_threshold,
            n_null_draws=n_null_draws,
        )
    targets = {name: stats.pattern(name) for name in stats.patterns}
    sel, names = selectivity(targets, stats.attn_baseline, baseline, stats.query_pos)
    member_sel, _ = selectivity(targets, stats.attn_baseline, "uniform", stats.query_pos, names)
    return ScreenResult(patterns=names, selectivity=sel, baseline=baseline, n_examples=stats.n_examples,
                        threshold=class_threshold, induction_threshold=induction_threshold,
                        membership_selectivity=member_sel)


# ---------------------------------------------------------------------------------------------
# Steps 1 and 2 over training


@dataclass(frozen=True)
class ScreenReport:
    """Steps 1-2 of one model over its checkpoints, with provenance.

    spectral:  PR [checkpoint, layer, head], PR-integral and ranking (Step 1)
    final:     the pattern screen at the final checkpoint (Step 2)
    selectivity_by_checkpoint: [checkpoint, pattern, layer, head], for animating the screen
    """

    model: str
    checkpoints: tuple[Checkpoint, ...]
    probe_spec: dict
    spectral: SpectralResult
    final: ScreenResult
    selectivity_by_checkpoint: np.ndarray
    shape: tuple[int, int]

    @property
    def candidate_circuit(self) -> HeadSet:
        """Heads whose induction selectivity reaches the membership threshold at the final checkpoint."""
        return self.final.induction_heads

    def heads_of_class(self, name: str) -> HeadSet:
        return HeadSet.from_mask(self.final.classes == name)

    def to_json(self) -> dict:
        spectral = self.spectral.to_json()
        return {
            "model": self.model,
            "checkpoints": [c.to_json() for c in self.checkpoints],
            "probe_spec": self.probe_spec,
            "shape": list(self.shape),
            "spectral": spectral,
            "top_k_spectral": [head_name(h) for h in self.spectral.top_heads],
            "final_screen": self.final.to_json(),
            "selectivity_by_checkpoint": self.selectivity_by_checkpoint.tolist(),
            "candidate_circuit": [head_name(h) for h in self.candidate_circuit],
            "previous_token_circuit": [head_name(h) for h in self.final.previous_token_circuit],
            "fractions": self.final.fractions(),
        }

    @classmethod
    def from_json(cls, data: dict) -> "ScreenReport":
        return cls(
            model=data["model"],
            checkpoints=tuple(Checkpoint.from_json(c) for c in data["checkpoints"]),
            probe_spec=data["probe_spec"],
            spectral=SpectralResult.from_json(data["spectral"]),
            final=ScreenResult.from_json(data["final_screen"]),
            selectivity_by_checkpoint=np.asarray(data["selectivity_by_checkpoint"], dtype=float),
            shape=tuple(data["shape"]),
        )


def screen(ref: ModelRef, spec: InductionProbeSpec | TextProbeSpec, k: int | float = 0.18,
           definition: str = DEFAULT_DEFINITION, rule: str = DEFAULT_RULE, baseline: str = "random",
           class_threshold: float = CLASS_THRESHOLD, induction_threshold: Optional[float] = None,
           n_null_draws: int = 500, device: str = "cpu",
           progress: Optional[Callable[[int, int, str], None]] = None) -> ScreenReport:
    """Steps 1-2 over every checkpoint of `ref`. progress(done, total, revision) after each one.

    induction_threshold: None scales the reference 50x (at T = 256) to the probe length
    (see scaled_induction_threshold); a number is used as given.
    """
    checkpoints = tuple(list_checkpoints(ref))
    check_spec_fits_config(spec, load_config(ref, checkpoints[-1].revision))
    batch = build_probe(spec)
    if induction_threshold is None:
        induction_threshold = scaled_induction_threshold(batch.query_pos)
    pr, sel_by_ckpt = [], []
    final_screen = None
    for index, ckpt in enumerate(checkpoints):
        stats = head_stats(ref, ckpt, batch, device=device)
        pr.append(pr_per_head(stats.z_query, definition))
        is_final = index == len(checkpoints) - 1
        result = screen_checkpoint(stats, baseline, class_threshold, induction_threshold,
                                   n_null_draws if is_final else 0)
        sel_by_ckpt.append(result.selectivity)
        if is_final:
            final_screen = result
        if progress:
            progress(index + 1, len(checkpoints), ckpt.revision)
    tokens = [c.tokens for c in checkpoints]
    usable = [i for i, t in enumerate(tokens) if t > 0]
    if len(usable) < 2:
        raise HeadLabError(
            f"{ref.name} has fewer than two checkpoints with known token counts; the PR-integral "
            "needs a training trajectory (pick a model with checkpoints)."
        )
    spectral = SpectralResult.build(np.stack(pr), tokens, k=k, definition=definition, rule=rule,
                                    revisions=[c.revision for c in checkpoints])
    n_layers, n_heads = final_screen.selectivity.shape[1:]
    return ScreenReport(model=ref.name, checkpoints=checkpoints, probe_spec=dict(batch.spec),
                        spectral=spectral, final=final_screen,
                        selectivity_by_checkpoint=np.stack(sel_by_ckpt), shape=(n_layers, n_heads))


def add_screen_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="zoo name, local Hugging Face folder or hub name")
    add_probe_spec_arguments(parser)
    parser.add_argument("--k", type=float, default=0.18, help="top-K: a count (>= 1) or a fraction (default 0.18)")
    parser.add_argument("--pr", choices=("entropy", "classic"), default=DEFAULT_DEFINITION,
                        help="PR definition (default: entropy effective rank, the reference code's)")
    parser.add_argument("--rule", choices=("trapezoid", "paper_sum"), default=DEFAULT_RULE,
                        help="PR-integral rule (default trapezoid on log tokens)")
    parser.add_argument("--baseline", choices=("random", "uniform"), default="random")
    parser.add_argument("--class-threshold", type=float, default=CLASS_THRESHOLD)
    parser.add_argument("--induction-threshold", type=float, default=None,
                        help="membership threshold (uniform baseline); default 50x at T=256, scaled to the "
                             "probe length (12.5x at T=64: the same 19.5%% attention share)")


def _k_from_arg(k: float) -> int | float:
    return int(k) if k >= 1 else float(k)


def cli_screen(args: argparse.Namespace) -> dict:
    from tqdm import tqdm

    ref = ModelRef.parse(args.model)
    bar = tqdm(total=len(list_checkpoints(ref)), unit="ckpt", desc=f"screen {ref.name}")

    def progress(done: int, total: int, revision: str) -> None:
        bar.set_postfix_str(revision)
        bar.update(1)

    try:
        report = screen(ref, probe_spec_from_args(args), k=_k_from_arg(args.k), definition=args.pr, rule=args.rule,
                        baseline=args.baseline, class_threshold=args.class_threshold,
                        induction_threshold=args.induction_threshold, device=args.device, progress=progress)
    finally:
        bar.close()
    out = report.to_json()
    print(f"top-K spectral ({len(report.spectral.top_heads)}): {', '.join(out['top_k_spectral'])}")
    print(f"candidate induction circuit (>= {report.final.induction_threshold:.3g}x, uniform baseline): "
          f"{', '.join(out['candidate_circuit']) or 'none'}")
    print(f"previous-token circuit (same threshold, uniform baseline): {', '.join(out['previous_token_circuit']) or 'none'}")
    for name, value in out["fractions"].items():
        print(f"{name}: {value if value is None else round(value, 4)}")
    return out


# ---------------------------------------------------------------------------------------------
# Step 3: group ablation, and the recipe end to end


def ablate(ref: ModelRef, revision: Optional[str], selection: HeadSet, spec, n_controls: int = 20,
           controls: str = "matched", mode: str = "zero", seed: int = 123, device: str = "cpu",
           progress: Optional[Callable[[int, int], None]] = None, model: Any = None):
    """Group ablation of `selection` at one checkpoint against controls and the upper bound."""
    from core.ablation.engine import ablation_study

    checkpoint = resolve_checkpoint(ref, revision)
    check_spec_fits_config(spec, load_config(ref, checkpoint.revision))
    loaded = model if model is not None else load_model(ref, checkpoint.revision, device=device)
    result = ablation_study(loaded, build_probe(spec), selection, n_controls=n_controls, controls=controls,
                            mode=mode, seed=seed, device=device, progress=progress)
    result.provenance.update({"model": ref.name, "revision": checkpoint.revision, "tokens": checkpoint.tokens})
    return result


def summarize_ablation(result) -> dict:
    """The figures a reader wants first: mean deltas, z, p, and every verdict with its rule."""
    out = {"selection": [head_name(h) for h in result.selection], "n_controls": len(result.controls),
           "notes": list(result.notes), "metrics": {}, "verdicts": {}}
    for metric, stats in result.stats.items():
        out["metrics"][metric] = {key: stats.get(key) for key in
                                  ("clean", "candidate_delta", "control_mean", "control_std", "z", "p",
                                   "rank", "upper_bound_delta", "candidate_ci") if key in stats}
    for name, verdict in result.verdicts.items():
        out["verdicts"][name] = {"label": verdict.label, "rule": verdict.rule}
    return out


def _print_summary(title: str, summary: dict) -> None:
    print(title)
    for metric, stats in summary["metrics"].items():
        figures = "  ".join(f"{k}={v:.4g}" for k, v in stats.items() if isinstance(v, (int, float)))
        print(f"  {metric:13s} {figures}")
    for name, verdict in summary["verdicts"].items():
        print(f"  verdict {name}: {verdict['label']}  ({verdict['rule']})")
    for note in summary["notes"]:
        print(f"  note: {note}")


def _progress_bar(desc: str):
    from tqdm import tqdm

    bar = tqdm(total=0, unit="cond", desc=desc)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    return bar, progress


def add_ablate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="zoo name, local Hugging Face folder or hub name")
    parser.add_argument("--revision", default=None, help="checkpoint (default: the final one)")
    parser.add_argument("--heads", required=True, help='heads to ablate, e.g. "L1H3,L1H5" or "L1H*"')
    parser.add_argument("--controls", type=int, default=20, help="random control draws (default 20)")
    parser.add_argument("--control-kind", choices=("matched", "any-layer"), default="matched",
                        help="matched: same layers and counts (default); any-layer: same size anywhere")
    parser.add_argument("--mode", choices=("zero", "mean"), default="zero")
    parser.add_argument("--control-seed", type=int, default=123)
    add_probe_spec_arguments(parser)


def cli_ablate(args: argparse.Namespace) -> dict:
    from core.heads import parse_heads

    ref = ModelRef.parse(args.model)
    config = load_config(ref, resolve_checkpoint(ref, args.revision).revision)
    selection = parse_heads(args.heads, config.num_hidden_layers, config.num_attention_heads)
    bar, progress = _progress_bar(f"ablate {ref.name}")
    try:
        result = ablate(ref, args.revision, selection, probe_spec_from_args(args), args.controls, args.control_kind,
                        args.mode, args.control_seed, args.device, progress)
    finally:
        bar.close()
    summary = summarize_ablation(result)
    _print_summary(f"ablating {', '.join(summary['selection'])} ({result.mode}) vs {summary['n_controls']} "
                   f"{args.control_kind} controls", summary)
    return {"summary": summary, "result": result.to_json()}


def run_recipe(ref: ModelRef, spec, n_controls: int = 20, mode: str = "zero", seed: int = 123,
               device: str = "cpu", progress: Optional[Callable[[str], None]] = None) -> dict:
    """Screen, take the candidate induction circuit, ablate it against matched-random draws and the
    upper bound; also ablate the previous-token circuit (composition: it feeds the induction heads),
    chosen by the same membership rule as the induction circuit."""
    say = progress or (lambda text: None)
    say("screening checkpoints")
    report = screen(ref, spec, device=device)
    circuit = report.candidate_circuit
    out: dict[str, Any] = {"model": ref.name, "screen": report.to_json()}
    if len(circuit) == 0:
        out["verdict"] = {"label": "no candidate",
                          "rule": f"no head reached {report.final.induction_threshold:g}x induction selectivity"}
        return out
    final = report.checkpoints[-1].revision
    model = load_model(ref, final, device=device)
    say(f"ablating the candidate circuit {circuit}")
    result = ablate(ref, final, circuit, spec, n_controls, "matched", mode, seed, device, model=model)
    out["candidate"] = {"summary": summarize_ablation(result), "result": result.to_json()}
    out["verdict"] = out["candidate"]["summary"]["verdicts"].get("recipe")
    prev_heads = report.final.previous_token_circuit
    if len(prev_heads):
        say(f"ablating the previous-token circuit {prev_heads}")
        try:
            composition = ablate(ref, final, prev_heads, spec, n_controls, "matched", mode, seed, device, model=model)
        except HeadLabError as exc:  # e.g. more than half of a layer: no matched control exists
            composition = ablate(ref, final, prev_heads, spec, n_controls, "any-layer", mode, seed, device, model=model)
            out["composition_note"] = f"matched controls impossible ({exc}); used any-layer controls"
        out["composition"] = {"summary": summarize_ablation(composition), "result": composition.to_json()}
    return out


def add_recipe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="zoo name, local Hugging Face folder or hub name")
    parser.add_argument("--controls", type=int, default=20, help="matched-random draws (default 20)")
    parser.add_argument("--mode", choices=("zero", "mean"), default="zero")
    parser.add_argument("--control-seed", type=int, default=123)
    add_probe_spec_arguments(parser)


def cli_recipe(args: argparse.Namespace) -> dict:
    ref = ModelRef.parse(args.model)
    out = run_recipe(ref, probe_spec_from_args(args), args.controls, args.mode, args.control_seed, args.device,
                     progress=lambda text: print(f"... {text}"))
    screen_out = out["screen"]
    print(f"candidate circuit: {', '.join(screen_out['candidate_circuit']) or 'none'}")
    if "candidate" in out:
        _print_summary("Step 3, candidate circuit:", out["candidate"]["summary"])
    if "composition" in out:
        _print_summary("previous-token circuit (composition):", out["composition"]["summary"])
    verdict = out.get("verdict") or {}
    print(f"recipe verdict: {verdict.get('label')}  ({verdict.get('rule')})")
    return out
