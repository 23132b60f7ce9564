"""`python -m core bench TARGET`: each benchmark's run, printing its ratios (what they measure lives in core/bench/).

Imported when a benchmark runs; its arguments, the machine record and `bench all` are in core/cli/bench.py.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from core.bench.ablation import bench_ablation
from core.bench.dtype import bench_dtype
from core.bench.edges import EdgeBenchPlan, bench_edges
from core.bench.ising import bench_ising
from core.bench.live import bench_live
from core.bench.load import bench_load
from core.bench.patch import bench_patch
from core.bench.probe import bench_probe, load_bench_model
from core.bench.scale import bench_scale
from core.bench.screen import TARGET_CANDIDATE_S, TARGET_VERDICT_S, bench_screen
from core.bench.sweep import bench_sweep
from core.errors import HeadLabError
from core.model.hooks import model_vocab_size
from core.tasks import InductionProbeSpec


# ---------------------------------------------------------------- bench ablation


def cli_bench_ablation(args: argparse.Namespace) -> dict:
    if args.threads is not None and args.threads < 1:
        raise HeadLabError(f"--threads is {args.threads}; give a whole number of at least 1, or leave it out.")
    result = bench_ablation(args.n_examples, args.seq_len, args.controls, args.repeats, args.seed, args.chunk_size,
                            args.device, args.dtype, args.threads)
    print(
        f"ablation bench (N={result['n_examples']}, T={result['seq_len']}, {result['n_conditions']} conditions incl. clean, "
        f"selection {result['selection']}): naive {result['naive_s']:.3f}s, engine {result['engine_s']:.3f}s, "
        f"speedup {result['speedup']:.2f}x (CPU time: {result['speedup_cpu']:.2f}x), "
        f"max metric diff {result['max_metric_diff']:.2e}; from a kept clean run {result['engine_kept_clean_s']:.3f}s "
        f"({result['speedup_kept_clean_vs_engine']:.2f}x the engine; CPU time {result['speedup_kept_clean_vs_engine_cpu']:.2f}x; "
        f"identical: {result['kept_clean_identical']}; {result['threads']} threads)"
    )
    return result


# ---------------------------------------------------------------- bench ising


def cli_bench_ising(args: argparse.Namespace) -> dict:
    r = bench_ising(args.n_spins, args.n_samples, args.seed, args.repeats, args.lbfgs, tuple(args.coupling))
    rows = [("per-spin scikit-learn", r["sklearn_s"], r["rel_diff_J_sklearn"], r["objective_gap_sklearn"]),
            ("joint, 2 torch threads", r["joint_s"], r["rel_diff_J"], r["objective_gap_joint"]),
            ("joint, 1 torch thread", r["joint_s_1thread"], r["rel_diff_J_1thread"], r["objective_gap_joint_1thread"])]
    if "lbfgs_s" in r:
        rows.append(("joint torch L-BFGS", r["lbfgs_s"], r["rel_diff_J_lbfgs"], r["objective_gap_lbfgs"]))
    print(f"ising bench: N={r['n_spins']} spins, M={r['n_samples']} Gibbs samples, C={r['C']:g}")
    print(f"{'fit':<26}{'time s':>10}{'rel diff J':>14}{'objective gap':>16}")
    for name, t, d, g in rows:
        print(f"{name:<26}{t:>10.3f}{d:>14.2e}{g:>16.2e}")
    print(f"speedup {r['speedup']:.1f}x with 2 torch threads, {r['speedup_1thread']:.1f}x with 1 "
          f"(CPU time, 1 thread: {r['sklearn_cpu_s'] / r['joint_cpu_s_1thread']:.1f}x); "
          f"tight solution: exact Newton from the scikit-learn fit, {r['tight_s']:.1f}s")
    return r


# ---------------------------------------------------------------- bench live


def cli_bench_live(args: argparse.Namespace) -> dict:
    result = bench_live(args.model, args.revision, args.heads, args.controls, args.n_examples, args.seq_len,
                        args.repeats, args.threads, args.device, args.dtype)
    own, kept = result["median_s"]["own_clean_run"], result["median_s"]["kept_clean_run"]
    print(f"live bench ({result['model']} {result['revision']}, {result['selection']} vs {result['n_controls']} matched "
          f"+ upper bound, N={result['n_examples']}, T={result['seq_len']}, {result['threads']} threads): "
          f"own clean run: candidate {own['candidate']:.2f}s, verdict {own['verdict']:.2f}s; kept clean run: "
          f"candidate {kept['candidate']:.2f}s, verdict {kept['verdict']:.2f}s "
          f"({result['speedup_verdict_kept_vs_own']:.2f}x); identical: {result['identical']}")
    return result


# ---------------------------------------------------------------- bench load


def cli_bench_load(args: argparse.Namespace) -> dict:
    """`python -m core bench load`: print the slowdowns and return the numbers (the CLI writes --json)."""
    r = bench_load(args.steps, args.repeats, args.n, args.seq_len)
    print(f"bench load: {r['steps']} training steps and one probe pass (N={r['probe_n_examples']}, "
          f"T={r['probe_seq_len']}), alone and beside one busy loop; {r['cpu_count']} CPUs, medians of {r['repeats']}; "
          f"load average before {r['load_average_before'][0]}; other work seen alone: "
          f"{r['other_work_cpus_alone_per_repeat']} CPUs")
    for work in ("training", "probe"):
        print(f"  {work:<9} policy ({r['threads_alone']} -> {r['threads_loaded']} threads): "
              f"{r[f'{work}_alone_s']:.2f} s alone, {r[f'{work}_loaded_s']:.2f} s loaded, "
              f"slowdown {r[f'slowdown_{work}']:.2f}x (target <= 2x)")
        print(f"  {'':<9} old setting ({r['fixed_threads']} threads, spin-wait): "
              f"{r[f'fixed_threads_{work}_alone_s']:.2f} s alone, {r[f'fixed_threads_{work}_loaded_s']:.2f} s loaded, "
              f"slowdown {r[f'fixed_threads_slowdown_{work}']:.2f}x; the policy is "
              f"{r[f'policy_speedup_loaded_{work}']:.2f}x faster under load")
    return r


# ---------------------------------------------------------------- bench patch


def cli_bench_patch(args: argparse.Namespace) -> dict:
    result = bench_patch(args.model, args.revision, args.n_examples, args.seq_len, args.repeats, args.device, args.dtype)
    rho = "undefined" if result["spearman"] is None else f"{result['spearman']:.3f}"
    print(f"patch bench ({result['model']} {result['revision']}, N={result['n_examples']}, T={result['seq_len']}, "
          f"{result['n_heads_total']} heads): activation {result['activation_s']:.2f}s, attribution "
          f"{result['attribution_s']:.2f}s, speedup {result['speedup_attribution_vs_activation']:.1f}x "
          f"(CPU time {result['speedup_cpu']:.1f}x), Spearman {rho}; activation with full forwards "
          f"{result['activation_full_s']:.2f}s, the replay {result['speedup_replay_vs_full_forwards']:.2f}x faster "
          f"(largest score difference {result['replay_max_score_diff']:.2g})")
    return result


# ---------------------------------------------------------------- bench edges


def cli_bench_edges(args: argparse.Namespace) -> dict:
    if any(n < 1 for n in args.ig_steps):
        raise HeadLabError(f"--ig-steps is {args.ig_steps}; give whole numbers of interpolation steps, at least 1 each.")
    plan = EdgeBenchPlan(args.task, args.n_examples, args.seq_len, tuple(args.ig_steps), args.sample_edges,
                         args.sample_top, args.sample_seed, not args.no_curves)
    r = bench_edges(args.model, args.revision, plan, None if args.no_shape else args.shape, device=args.device,
                    dtype=args.dtype)
    print(f"edges bench ({r['model']} {r['revision']}, N={r['n_examples']}, T={r['seq_len']}, {r['edges']} edges): "
          f"brute force {r['brute_force_s']:.2f}s, EAP {r['eap_s']:.3f}s: {r['speedup_eap_vs_brute_force']:.1f}x "
          f"(target >= 50x), Spearman {r['spearman_eap_vs_brute_force']:.3f}; EAP-IG ({r['ig_steps']} steps) "
          f"{r['eap_ig_s']:.3f}s: {r['eap_ig_over_eap']:.2f}x EAP (target <= 6x), Spearman {r['spearman_eap_ig_vs_brute_force']:.3f}")
    if "shape" in r:
        print(f"  EAP at {r['shape']} ({r['shape_edges']} edges), {r['shape_n_examples']} x {r['shape_seq_len']} tokens: "
              f"{r['shape_eap_s']:.1f}s, peak memory {r['peak_memory_gib']:.2f} GiB (limit 24 GiB)")
    for name, a in r["agreement"].items():
        rho = "undefined" if a["spearman_above_floor"] is None else f"{a['spearman_above_floor']:.3f}"
        curve = r.get("faithfulness", {}).get(name)
        print(f"  {name}: Spearman {a['spearman']:.3f} over {a['n_edges']} edges, {rho} over the {a['n_above_floor']} "
              f"above {a['floor']} of the gap; top-k overlap {a['top_k']}"
              + ("" if curve is None else f"; CPR {curve['cpr']:.3f}, CMD {curve['cmd']:.3f}"))
    if "brute force" in r.get("faithfulness", {}):
        curve = r["faithfulness"]["brute force"]
        print(f"  brute force's own ranking: CPR {curve['cpr']:.3f}, CMD {curve['cmd']:.3f}")
    return r


# ---------------------------------------------------------------- bench probe


def cli_bench_probe(args: argparse.Namespace) -> dict:
    """`python -m core bench probe`: print the timing table and return it (the CLI writes --json)."""
    torch.set_num_threads(int(args.threads))
    model = load_bench_model(args.model, args.revision, args.device, args.dtype)
    vocab = model_vocab_size(model)
    spec = InductionProbeSpec(n_examples=args.n, seq_len=args.seq_len, token_low=0,
                              token_high=min(256, vocab), seed=42)
    batch = spec.build()
    result = bench_probe(model, batch, repeats=args.repeats, chunk_size=args.chunk_size, device=args.device)
    result["model"] = str(args.model)
    print(f"probe N={result['n_examples']} T={result['seq_len']} chunk={result['chunk_size']} "
          f"model {args.model} ({result['n_layers']} layers x {result['n_heads']} heads, d_model {result['d_model']}; "
          f"{result['dtype']} on {result['device']}); medians of {result['repeats']}")
    print(f"  {'bare forward':<28}{result['bare_s']:9.4f} s")
    print(f"  {'instrumented (one pass)':<28}{result['instrumented_s']:9.4f} s   "
          f"{result['overhead_ratio']:.2f}x bare (target <= 1.5x)")
    print(f"  {'three reference passes':<28}{result['three_pass_s']:9.4f} s   "
          f"instrumented is {result['speedup_vs_three_pass']:.2f}x faster (target >= 2x)")
    return result


# ---------------------------------------------------------------- bench dtype


def cli_bench_dtype(args: argparse.Namespace) -> dict:
    for name in ("n_examples", "seq_len", "repeats", "controls", "pairs", "threads"):
        if getattr(args, name) < 1:
            raise HeadLabError(f"--{name.replace('_', '-')} is {getattr(args, name)}; give a whole number of at least 1.")
    torch.set_num_threads(args.threads)
    r = bench_dtype(tuple(args.models), args.n_examples, args.seq_len, args.repeats, args.controls, args.pairs,
                    args.skip_patching)
    for name, m in r["models"].items():
        print(f"dtype bench {name} (N={r['n_examples']}, T={r['seq_len']}, {r['threads']} threads): forward float32 "
              f"{m['forward']['float32']['median_s']:.2f} s, bfloat16 {m['forward']['bfloat16']['median_s']:.2f} s "
              f"({m['forward_speedup_bf16']:.2f}x); top-1 agreement {m['top1_agreement_every_position']:.3f}")
        for key, c in m["probe_statistics"].items():
            print(f"  probe {key}: max |diff| {c['max_abs_diff']:.3g} ({c['max_diff_over_spread'] or 0:.3f} of the "
                  f"spread over heads), Spearman {c['spearman']:.4f}, top-5 overlap {c['top5_overlap']}")
        for metric, a in m["ablation"]["metrics"].items():
            print(f"  ablation {metric}: candidate delta {a['float32_candidate_delta']:.4g} vs {a['bfloat16_candidate_delta']:.4g};"
                  f" largest diff {a['max_diff_over_ci_half_width'] or 0:.3f} of the CI half-width")
        if "patching" in m:
            p = m["patching"]
            print(f"  activation patching: max |diff| {p['activation']['max_abs_diff']:.3g}, Spearman "
                  f"{p['activation']['spearman']:.4f}, top-10 overlap {p['activation']['top10_overlap']}")
    return r


# ---------------------------------------------------------------- bench scale


def cli_bench_scale(args: argparse.Namespace) -> dict:
    n = args.n if args.n is not None else (2000 if args.device.startswith("cuda") else 16)
    if n < 1 or args.repeats < 1 or args.chunk_size < 1 or args.controls < 1:
        raise HeadLabError("--n, --repeats, --chunk-size and --controls take whole numbers of at least 1.")
    if args.edge_pairs < 0 or args.ig_steps < 1:
        raise HeadLabError("--edge-pairs takes a whole number of pairs (0 skips the edge timing) and --ig-steps at least 1.")
    r = bench_scale(n, args.shape, args.repeats, args.chunk_size, args.controls, args.device, args.dtype, args.model,
                    args.edge_pairs, args.ig_steps)
    print(f"scale bench: {r['shape']} ({r['n_layers']} x {r['n_heads']} heads, d_model {r['d_model']}, vocab {r['vocab']}), "
          f"reference batch N={r['n_examples']} of {r['reference_n_examples']}, T={r['seq_len']}; {r['dtype']} on {r['device']}")
    print(f"  bare forward {r['bare_s']:.2f} s, instrumented {r['instrumented_s']:.2f} s: "
          f"{r['instrumented_over_bare']:.2f}x bare (target <= 1.3x)")
    print(f"  ablation, {r['ablation_conditions']} conditions: naive {r['ablation_naive_s']:.2f} s, "
          f"engine {r['ablation_engine_s']:.2f} s: {r['ablation_speedup']:.2f}x (target >= 2x); "
          f"max metric difference {r['ablation_max_metric_diff']:.1e}")
    if "eap_s" in r:
        print(f"  edges ({r['edges']}, {r['edge_pairs']} pairs of {r['edge_seq_len']} tokens): forward + backward "
              f"{r['forward_backward_s']:.2f} s (to the activations alone {r['forward_input_backward_s']:.2f} s); "
              f"EAP {r['eap_s']:.2f} s: {r['eap_over_forward_backward']:.2f}x (target <= 3x), "
              f"{r['eap_over_forward_input_backward']:.2f}x the activations-only backward; EAP-IG ({r['ig_steps']} steps) "
              f"{r['eap_ig_s']:.2f} s: {r['eap_ig_over_forward_backward']:.2f}x")
    print(f"  peak memory {r['peak_memory_bytes'] / 2**30:.2f} GiB")
    return r


# ---------------------------------------------------------------- bench screen


def cli_bench_screen(args: argparse.Namespace) -> dict:
    result = bench_screen(args.model, args.revision, args.heads, args.clicks, args.n_examples, args.seq_len, args.dtype,
                          args.url)
    median = result["median_s"]
    print(f"screen bench ({result['model']} {result['revision']}, {result['heads']} vs 20 matched + upper bound, "
          f"N={result['n_examples']}, T={result['seq_len']}, {result['dtype']}, {result['clicks']} clicks): candidate median "
          f"{median['candidate']:.2f}s (max {max(result['candidate_s']):.2f}s, target {TARGET_CANDIDATE_S:.0f}s), "
          f"verdict median {median['verdict']:.2f}s (max {max(result['verdict_s']):.2f}s, target "
          f"{TARGET_VERDICT_S:.0f}s); every click within the targets: {result['all_within_targets']}")
    print(f"the lab's probe-size panel before the clicks: {result['probe_size_panel']}")
    return result


# ---------------------------------------------------------------- bench sweep


def cli_bench_sweep(args: argparse.Namespace) -> dict:
    r = bench_sweep(args.models, args.cpus, not args.no_cluster)
    print(f"sweep bench: {r['checkpoints']} checkpoints of {', '.join(r['models'])}, cold cache, default zoo probe")
    print(f"  serial (1 thread per task) {r['serial_s']:.1f} s; serial ({r['process_threads']} threads) "
          f"{r['serial_own_threads_s']:.1f} s")
    print(f"  ray, {r['cpus']} workers x 1 thread: {r['ray_s']:.1f} s (start-up {r['ray_startup_s']:.1f} s apart): "
          f"{r['speedup_ray_vs_serial']:.2f}x serial (target >= 1.6), {r['speedup_ray_vs_serial_own_threads']:.2f}x "
          f"serial at {r['process_threads']} threads; identical: {r['identical']}")
    if "cluster_s" in r:
        print(f"  two-node cluster ({r['cluster_nodes']} nodes x 1 CPU): {r['cluster_s']:.1f} s: "
              f"{r['speedup_cluster_vs_serial']:.2f}x serial; identical: {r['cluster_identical']}")
    return r
