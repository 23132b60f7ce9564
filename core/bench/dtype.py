"""Benchmark: bfloat16 against float32 on real pretrained models, in time and in every statistic's error.

`python -m core bench dtype` loads each model twice (float32 and bfloat16, the same weights) and, on
the same inputs, measures:
- a bare forward of N x T tokens in each dtype (alternating repeats; medians and their ratio) and
  the top-1 agreement of the two forwards over every position;
- the probe pass's per-head statistics (participation ratio of the head output, the selectivity of
  each attention pattern, mean max attention): the largest absolute difference, that difference over
  the statistic's spread across heads, Spearman rank agreement over heads and the top-5 heads' overlap;
- an ablation study (the three most induction-selective heads against matched controls): the
  candidate's and each control's mean delta per metric, differences set against the bootstrap CI
  half-width of the float32 candidate delta (the statistic's own sampling noise);
- activation patching of every head on IOI pairs (prompts tokenized by the model's own tokenizer):
  the largest score difference, Spearman over heads and the top-10 heads' overlap. Attribution
  patching runs in float32 whatever the model's dtype, so it has no bfloat16 error to measure; its
  float32 scores against activation patching's give the top-k recovery curve (patch --top-k).
Every statistic is accumulated in float32 in both dtypes (HeadStats, query_metrics, patching metrics).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.ablation.patching import PatchSettings, activation_patching, attribution_patching
from core.ablation.study import AblationSettings, ablation_study
from core.choices import REAL_MODEL_NAMES as REAL_MODELS
from core.heads import HeadSet
from core.model.hooks import model_shape
from core.model.loading import load_model
from core.model.memory import lean_forward
from core.model.refs import ModelRef, resolve_checkpoint
from core.probe import collect_head_stats
from core.stats.inference import METRICS, spearman
from core.stats.selectivity import selectivity
from core.stats.spectral import pr_per_head
from core.tasks.induction import InductionProbeSpec
from core.tasks.probe_file import read_probe_file

DTYPES = ("float32", "bfloat16")
IOI_NAMES = (" Mary", " John", " Tom", " James", " Sarah", " Anna", " David", " Paul")
IOI_TEMPLATES = (
    "When{a} and{b} went to the store,{b} gave a drink to",
    "When{a} and{b} went to the park,{b} gave a ball to",
    "After{a} and{b} went to the office,{b} handed a letter to",
    "Then{a} and{b} had a long talk, and{b} gave a book to",
)


def ioi_pairs_jsonl(n_pairs: int, seed: int = 0) -> str:
    """IOI pairs as probe-file lines: clean "When A and B ..., B gave ... to" (answer " A"), corrupted with
    the subject swapped ("..., A gave ... to", answer " B"); names drawn without repeats per pair."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(int(n_pairs)):
        a, b = rng.choice(len(IOI_NAMES), size=2, replace=False)
        a, b = IOI_NAMES[a], IOI_NAMES[b]
        template = IOI_TEMPLATES[i % len(IOI_TEMPLATES)]
        lines.append(json.dumps({"prompt": template.format(a=a, b=b), "target": a,
                                 "corrupted_prompt": template.format(a=b, b=a), "corrupted_target": b}))
    return "\n".join(lines) + "\n"


def topk_recovery(estimate: np.ndarray, exact: np.ndarray, ks: list[int], top: tuple[int, ...] = (5, 10, 20)) -> dict:
    """How many of `exact`'s top-m heads the top-k of `estimate` contains, for each m and k, ranking heads by
    the size of their effect |score| (denoising: the corrupted run scores 0; a head that hurts counts too).

    estimate, exact: [layer, head] denoising scores on the same scale. Returns {"m=M": [count at each k]}
    and the k at which each top-m is fully recovered.
    """
    est_order = np.argsort(-np.abs(estimate.ravel()), kind="stable")
    exact_order = np.argsort(-np.abs(exact.ravel()), kind="stable")
    counts, full_at = {}, {}
    for m in top:
        want = set(exact_order[:m].tolist())
        counts[f"m={m}"] = [len(want & set(est_order[:k].tolist())) for k in ks]
        ranks = [int(np.where(est_order == i)[0][0]) + 1 for i in want]
        full_at[f"m={m}"] = max(ranks)
    return {"k": list(ks), "recovered": counts, "k_recovering_all": full_at}


def _compare(a: np.ndarray, b: np.ndarray, top: int) -> dict:
    """float32 values a and bfloat16 values b over heads [layer, head]: the bf16 error and rank agreement."""
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    diff = float(np.abs(a - b).max())
    spread = float(a.std())
    rho, _ = spearman(a, b)
    top_a, top_b = set(np.argsort(-a, kind="stable")[:top].tolist()), set(np.argsort(-b, kind="stable")[:top].tolist())
    return {"max_abs_diff": diff, "float32_spread_sd": spread, "max_diff_over_spread": diff / spread if spread else None,
            "spearman": rho, f"top{top}_overlap": len(top_a & top_b)}


def _head_statistics(stats: Any) -> dict[str, np.ndarray]:
    """The probe pass's per-head statistics HeadLab reports: PR, each pattern's selectivity, mean max attention."""
    targets = {name: stats.pattern(name).numpy() for name in stats.patterns}
    sel, names = selectivity(targets, stats.attn_baseline.numpy(), "random", stats.query_pos.numpy())
    out = {"pr": pr_per_head(stats.z_query), "max_attention": stats.attn_max.float().mean(0).numpy()}
    out.update({f"selectivity_{name}": sel[i] for i, name in enumerate(names)})
    return out


@torch.no_grad()
def _forward_times(models: dict[str, Any], tokens: torch.Tensor, repeats: int) -> tuple[dict, float]:
    """Median bare-forward seconds per dtype (alternating) and the top-1 agreement at every position."""
    times: dict[str, list[float]] = {d: [] for d in models}
    argmax = {}
    for _ in range(int(repeats)):
        for dtype, model in models.items():
            with lean_forward(model):
                t0 = time.perf_counter()
                logits = model(tokens)  # [example, pos, vocab]
                times[dtype].append(time.perf_counter() - t0)
            argmax[dtype] = logits.argmax(-1)
            del logits
    agreement = float((argmax["float32"] == argmax["bfloat16"]).float().mean())
    return {d: {"median_s": statistics.median(t), "times_s": t} for d, t in times.items()}, agreement


def _ablation(models: dict[str, Any], batch: Any, selection: HeadSet, n_controls: int) -> dict:
    """One study per dtype; per metric the candidate's and controls' mean-delta differences."""
    results, seconds = {}, {}
    for dtype, model in models.items():
        t0 = time.perf_counter()
        results[dtype] = ablation_study(model, batch, selection, AblationSettings(n_controls=n_controls, min_controls=1,
                                                                                    n_boot=500))
        seconds[dtype] = time.perf_counter() - t0
    out = {"selection": str(selection), "n_controls": n_controls, "seconds": seconds, "metrics": {}}
    for metric in METRICS:
        a, b = results["float32"].stats[metric], results["bfloat16"].stats[metric]
        ci = a["candidate_ci"]
        half_width = (ci[1] - ci[0]) / 2
        cand = abs(a["candidate_delta"] - b["candidate_delta"])
        ctrl = float(np.abs(np.subtract(a["control_deltas"], b["control_deltas"])).max())
        out["metrics"][metric] = {
            "float32_candidate_delta": a["candidate_delta"], "bfloat16_candidate_delta": b["candidate_delta"],
            "candidate_abs_diff": cand, "controls_max_abs_diff": ctrl, "float32_candidate_ci_half_width": half_width,
            "max_diff_over_ci_half_width": max(cand, ctrl) / half_width if half_width else None,
            "clean_abs_diff": abs(a["clean"] - b["clean"]),
        }
    return out


def _patching(models: dict[str, Any], n_pairs: int) -> dict:
    """Activation patching of every head per dtype, attribution in float32; errors and the top-k recovery."""
    with tempfile.TemporaryDirectory(prefix="headlab-bench-ioi-") as folder:
        path = Path(folder) / "ioi.jsonl"
        path.write_text(ioi_pairs_jsonl(n_pairs))
        probe_file = read_probe_file(path)
    settings = PatchSettings(allow_small_gap=True)
    scores, seconds, values = {}, {}, {}
    for dtype, model in models.items():
        pair = probe_file.build(model.tokenizer)
        t0 = time.perf_counter()
        result = activation_patching(model, pair, settings)
        seconds[dtype] = time.perf_counter() - t0
        scores[dtype] = result.scores
        values[dtype] = {"clean": result.clean_value, "corrupted": result.corrupted_value}
    t0 = time.perf_counter()
    attribution = attribution_patching(models["float32"], probe_file.build(models["float32"].tokenizer), settings)
    n_heads = int(scores["float32"].size)
    ks = sorted({k for k in (1, 2, 5, 10, 15, 20, 30, 40, 50, 75, 100) if k <= n_heads} | {n_heads})
    return {"n_pairs": n_pairs, "activation_seconds": seconds, "attribution_seconds": time.perf_counter() - t0,
            "runs": values, "activation": _compare(scores["float32"], scores["bfloat16"], 10),
            "attribution_vs_activation_spearman": spearman(attribution.scores.ravel(), scores["float32"].ravel())[0],
            "topk_recovery": topk_recovery(attribution.scores, scores["float32"], ks),
            "scores": {"activation_float32": scores["float32"].round(5).tolist(),
                       "activation_bfloat16": scores["bfloat16"].round(5).tolist(),
                       "attribution_float32": attribution.scores.round(5).tolist()}}


def _top_heads_one_per_layer(scores: np.ndarray, n_heads: int, count: int) -> HeadSet:
    """The `count` highest-scoring heads (scores [layer*head]), at most one per layer (so matched controls exist)."""
    picked: dict[int, int] = {}
    for i in np.argsort(-scores, kind="stable"):
        layer, head = divmod(int(i), n_heads)
        picked.setdefault(layer, head)
        if len(picked) == count:
            break
    return HeadSet(tuple(sorted(picked.items())))


def bench_dtype(models: tuple[str, ...] = REAL_MODELS, n_examples: int = 16, seq_len: int = 64, repeats: int = 3,
                n_controls: int = 5, n_pairs: int = 8, skip_patching: bool = False) -> dict:
    """Every measurement above for each model; torch's thread count is the caller's."""
    out: dict[str, Any] = {"n_examples": n_examples, "seq_len": seq_len, "repeats": repeats,
                           "threads": torch.get_num_threads(), "models": {}}
    for name in models:
        ref = ModelRef.parse(name)
        checkpoint = resolve_checkpoint(ref, None)
        loaded = {dtype: load_model(ref, checkpoint.revision, device="cpu", dtype=dtype) for dtype in DTYPES}
        batch = InductionProbeSpec(n_examples=n_examples, seq_len=seq_len, token_low=1000, token_high=10000, seed=42).build()
        forward, agreement = _forward_times(loaded, batch.tokens, repeats)
        record: dict[str, Any] = {
            "forward": forward, "forward_speedup_bf16": forward["float32"]["median_s"] / forward["bfloat16"]["median_s"],
            "top1_agreement_every_position": agreement}
        head_stats = {}
        for dtype, model in loaded.items():
            t0 = time.perf_counter()
            head_stats[dtype] = _head_statistics(collect_head_stats(model, batch))
            record.setdefault("probe_seconds", {})[dtype] = time.perf_counter() - t0
        record["probe_statistics"] = {key: _compare(head_stats["float32"][key], head_stats["bfloat16"][key], 5)
                                      for key in head_stats["float32"]}
        n_layers, n_heads, _ = model_shape(loaded["float32"])
        induction = head_stats["float32"]["selectivity_induction"].ravel()
        record["ablation"] = _ablation(loaded, batch, _top_heads_one_per_layer(induction, n_heads, 3), n_controls)
        if not skip_patching:
            record["patching"] = _patching(loaded, n_pairs)
        record["shape"] = {"n_layers": n_layers, "n_heads": n_heads}
        out["models"][name] = record
        del loaded
    return out
