"""`python -m core bench ...`: the benchmarks' command-line wiring (what they measure lives in core/bench/).

Each benchmark is a pair `add_bench_<name>_arguments(parser)` / `cli_bench_<name>(args) -> dict`, listed in
`BENCHES`. Every result carries a `machine` record (CPU model, cores, torch threads, load average at the
start, date, commit), so a committed JSON says where and when its numbers were measured.
`python -m core bench all --out docs/measurements/` runs every benchmark at its defaults and writes
one `bench-<name>.json` each; the docs quote only figures found in those files.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Callable

import torch

from core.bench.ablation import bench_ablation
from core.bench.dtype import REAL_MODELS, bench_dtype
from core.bench.edges import EdgeBenchPlan, bench_edges
from core.bench.ising import bench_ising
from core.bench.live import bench_live
from core.bench.load import bench_load
from core.bench.patch import bench_patch
from core.bench.probe import bench_probe, load_bench_model
from core.bench.scale import bench_scale
from core.bench.screen import TARGET_CANDIDATE_S, TARGET_VERDICT_S, bench_screen
from core.bench.sweep import DEFAULT_MODELS, bench_sweep
from core.cli.probe import add_device_arguments
from core.errors import HeadLabError
from core.model.hooks import model_vocab_size
from core.tasks import InductionProbeSpec
from core.workspace import atomic_write_json, check_output_file
from core.zoo.presets import PYTHIA_SHAPES

REPO_ROOT = Path(__file__).resolve().parents[2]


def machine_record() -> dict:
    """Where and when a benchmark ran: CPU model, cores, torch threads, load average, date, commit."""
    cpu_model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {
        "cpu_model": cpu_model, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit, "uncommitted_changes": dirty, "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


# ---------------------------------------------------------------- bench ablation


def add_bench_ablation_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n-examples", type=int, default=64, help="probe examples N (default 64)")
    parser.add_argument("--seq-len", type=int, default=64, help="sequence length T (default 64)")
    parser.add_argument("--controls", type=int, default=20, help="matched-random controls (default 20)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats; medians are reported (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random model and batch")
    parser.add_argument("--chunk-size", type=int, default=None, help="conditions stacked per forward (default 1 on CPU)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: HeadLab's choice for the CPUs' load, as every command makes it)")
    add_device_arguments(parser)


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


def add_bench_ising_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n-spins", type=int, default=256, help="spins N (default 256)")
    parser.add_argument("--n-samples", type=int, default=2000, help="Gibbs samples M (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the planted model and the sampler")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of the joint fit; the median is reported")
    parser.add_argument("--lbfgs", action="store_true", help="also time one torch L-BFGS over the summed objective")
    parser.add_argument("--coupling", type=float, nargs=2, default=(0.1, 0.3), metavar=("LOW", "HIGH"),
                        help="range of the planted within-community |J| (default 0.1 0.3; 0.1 0.4 is a harder, partly ordered regime)")


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


def add_bench_live_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="induction-neox", help="zoo model (default induction-neox)")
    parser.add_argument("--revision", default=None, help="checkpoint (default: the final one)")
    parser.add_argument("--heads", default="L1H1,L1H3,L1H6", help="the heads ablated (default L1H1,L1H3,L1H6)")
    parser.add_argument("--controls", type=int, default=20, help="matched-random controls (default 20)")
    parser.add_argument("--n-examples", type=int, default=256, help="probe examples N (default 256)")
    parser.add_argument("--seq-len", type=int, default=64, help="sequence length T (default 64)")
    parser.add_argument("--repeats", type=int, default=4, help="timed repeats; medians are reported (default 4)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the lab's choice at a click)")
    add_device_arguments(parser)


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


def add_bench_load_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=40, help="training steps per measurement (default 40)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the whole sequence; medians are reported (default 3)")
    parser.add_argument("--n", type=int, default=256, help="probe sequences N (default 256, the app's default)")
    parser.add_argument("--seq-len", type=int, default=64, help="probe length T (default 64)")


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


def add_bench_patch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="induction-neox", help="zoo model (default induction-neox)")
    parser.add_argument("--revision", default=None, help="checkpoint (default: the final one)")
    parser.add_argument("--n-examples", type=int, default=256, help="pairs N (default 256)")
    parser.add_argument("--seq-len", type=int, default=64, help="sequence length T (default 64)")
    parser.add_argument("--repeats", type=int, default=1, help="timed repeats; medians are reported (default 1)")
    add_device_arguments(parser)


def cli_bench_patch(args: argparse.Namespace) -> dict:
    result = bench_patch(args.model, args.revision, args.n_examples, args.seq_len, args.repeats, args.device, args.dtype)
    rho = "undefined" if result["spearman"] is None else f"{result['spearman']:.3f}"
    print(f"patch bench ({result['model']} {result['revision']}, N={result['n_examples']}, T={result['seq_len']}, "
          f"{result['n_heads_total']} heads): activation {result['activation_s']:.2f}s, attribution "
          f"{result['attribution_s']:.2f}s, speedup {result['speedup_attribution_vs_activation']:.1f}x "
          f"(CPU time {result['speedup_cpu']:.1f}x), Spearman {rho}")
    return result


# ---------------------------------------------------------------- bench edges


def add_bench_edges_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="induction-neox", help="zoo model (default induction-neox)")
    parser.add_argument("--revision", default=None, help="checkpoint (default: the final one)")
    parser.add_argument("--n-examples", type=int, default=32, help="pairs N (default 32)")
    parser.add_argument("--seq-len", type=int, default=32, help="sequence length T (default 32)")
    parser.add_argument("--ig-steps", type=int, nargs="+", default=[5, 20],
                        help="EAP-IG interpolation steps, one run each (default 5 20; the first is timed and also run "
                             "by MIB's rule)")
    parser.add_argument("--task", choices=["induction", "ioi"], default="induction",
                        help="the pairs: the induction counterfactual (default) or IOI's ABC pairs (a real tokenizer)")
    parser.add_argument("--sample-edges", type=int, default=None,
                        help="patch this many random edges, plus each method's top --sample-top (default: every edge)")
    parser.add_argument("--sample-top", type=int, default=20, help="with --sample-edges: each method's top edges patched too")
    parser.add_argument("--sample-seed", type=int, default=0, help="seed of the random edge sample (default 0)")
    parser.add_argument("--no-curves", action="store_true", help="skip the faithfulness curves at MIB's edge fractions")
    parser.add_argument("--shape", choices=sorted(PYTHIA_SHAPES), default="pythia-160m",
                        help="published architecture for the memory run, random weights (default pythia-160m)")
    parser.add_argument("--no-shape", action="store_true", help="skip the run at the published shape")
    add_device_arguments(parser)


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


def add_bench_probe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="induction-neox",
                        help="zoo name, local Hugging Face folder or hub name (default: the quick zoo induction model)")
    parser.add_argument("--revision", default=None, help="checkpoint revision (default: the final one)")
    parser.add_argument("--n", type=int, default=256, help="probe sequences (default 256)")
    parser.add_argument("--seq-len", type=int, default=64, help="probe length T (default 64)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats; medians are reported (default 5)")
    parser.add_argument("--chunk-size", type=int, default=64, help="examples per forward (default 64)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: on shared CPUs more threads make the ratios noisy)")
    add_device_arguments(parser)




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


def add_bench_dtype_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", default=list(REAL_MODELS),
                        help="zoo models, each loaded in float32 and bfloat16 (default: the two real models)")
    parser.add_argument("--n-examples", type=int, default=16, help="probe examples N (default 16)")
    parser.add_argument("--seq-len", type=int, default=64, help="sequence length T (default 64)")
    parser.add_argument("--repeats", type=int, default=3, help="timed forward repeats; medians are reported (default 3)")
    parser.add_argument("--controls", type=int, default=5, help="matched-random controls of the ablation study (default 5)")
    parser.add_argument("--pairs", type=int, default=8, help="IOI pairs activation-patched over every head (default 8)")
    parser.add_argument("--skip-patching", action="store_true", help="leave out the patching comparison")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")


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


def add_bench_scale_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, default=None,
                        help="probe sequences, the first N of the reference batch (default: 2000 on CUDA, 16 on the CPU)")
    parser.add_argument("--shape", choices=sorted(PYTHIA_SHAPES), default="pythia-160m", help="published architecture")
    parser.add_argument("--model", default=None,
                        help="a zoo model's real weights instead of the random shape (e.g. smollm2-135m)")
    parser.add_argument("--repeats", type=int, default=1, help="timed repeats; medians are reported (default 1)")
    parser.add_argument("--chunk-size", type=int, default=16, help="probe examples per forward (default 16)")
    parser.add_argument("--controls", type=int, default=20, help="matched-random draws (default 20)")
    parser.add_argument("--edge-pairs", type=int, default=8,
                        help="pairs for EAP / EAP-IG over every edge vs a forward + backward (default 8; 0 skips)")
    parser.add_argument("--ig-steps", type=int, default=5, help="EAP-IG interpolation steps (default 5)")
    add_device_arguments(parser)


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


def add_bench_screen_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="induction-neox", help="zoo model (default induction-neox)")
    parser.add_argument("--revision", default=None, help="checkpoint (default: the final one)")
    parser.add_argument("--heads", default="L1H1,L1H3,L1H6", help="the heads ablated (default L1H1,L1H3,L1H6)")
    parser.add_argument("--clicks", type=int, default=8, help="clicks, each a fresh study (default 8)")
    parser.add_argument("--n-examples", type=int, default=256, help="probe examples N (default 256)")
    parser.add_argument("--seq-len", type=int, default=64, help="sequence length T (default 64)")


def cli_bench_screen(args: argparse.Namespace) -> dict:
    result = bench_screen(args.model, args.revision, args.heads, args.clicks, args.n_examples, args.seq_len)
    median = result["median_s"]
    print(f"screen bench ({result['model']} {result['revision']}, {result['heads']} vs 20 matched + upper bound, "
          f"N={result['n_examples']}, T={result['seq_len']}, {result['clicks']} clicks): candidate median "
          f"{median['candidate']:.2f}s (max {max(result['candidate_s']):.2f}s, target {TARGET_CANDIDATE_S:.0f}s), "
          f"verdict median {median['verdict']:.2f}s (max {max(result['verdict_s']):.2f}s, target "
          f"{TARGET_VERDICT_S:.0f}s); every click within the targets: {result['all_within_targets']}")
    return result


# ---------------------------------------------------------------- bench sweep


def add_bench_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), help="zoo models whose checkpoints are swept")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray instance (default 2)")
    parser.add_argument("--no-cluster", action="store_true", help="skip the simulated two-node cluster")


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


# ---------------------------------------------------------------- the table and `bench all`

# bench target -> (add arguments, run, one-line help)
BENCHES: dict[str, tuple[Callable, Callable, str]] = {
    "probe": (add_bench_probe_arguments, cli_bench_probe, "instrumented pass vs bare forward vs three passes"),
    "ablation": (add_bench_ablation_arguments, cli_bench_ablation, "ablation engine vs naive per-condition loop"),
    "ising": (add_bench_ising_arguments, cli_bench_ising, "joint pseudolikelihood fit vs per-spin scikit-learn"),
    "load": (add_bench_load_arguments, cli_bench_load,
             "training steps and a probe pass, alone and beside a competing process"),
    "scale": (add_bench_scale_arguments, cli_bench_scale,
              "Pythia-160m shape, reference batch: instrumented pass, peak memory, ablation engine"),
    "sweep": (add_bench_sweep_arguments, cli_bench_sweep,
              "probe over every checkpoint of two zoo models: serial vs Ray, one and two nodes"),
    "patch": (add_bench_patch_arguments, cli_bench_patch, "attribution vs activation patching over every head of a zoo model"),
    "edges": (add_bench_edges_arguments, cli_bench_edges,
              "EAP vs brute-force edge patching, EAP-IG vs EAP, EAP's memory at Pythia-160m's shape"),
    "dtype": (add_bench_dtype_arguments, cli_bench_dtype,
              "bfloat16 vs float32 on the real models: forward time and every statistic's error"),
    "live": (add_bench_live_arguments, cli_bench_live,
             "the ablation lab's click: recording its own clean run vs from the kept one"),
    "screen": (add_bench_screen_arguments, cli_bench_screen,
               "the ablation lab's click in a real browser: candidate and verdict on screen"),
}


def with_machine(run: Callable[[argparse.Namespace], dict]) -> Callable[[argparse.Namespace], dict]:
    """`run`, with the machine record taken before it starts added to its result."""
    def run_with_machine(args: argparse.Namespace) -> dict:
        machine = machine_record()
        result = run(args)
        return {**result, "machine": machine}
    return run_with_machine


def add_bench_all_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="folder for bench-<name>.json (e.g. docs/measurements/)")
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHES), default=None, help="run only these benchmarks")
    parser.add_argument("--skip", nargs="+", choices=sorted(BENCHES), default=(), help="leave these benchmarks out")


def cli_bench_all(args: argparse.Namespace) -> dict:
    """Every benchmark at its defaults, one after another (never side by side: they share the cores)."""
    names = [name for name in (args.only or BENCHES) if name not in set(args.skip)]
    if not names:
        raise HeadLabError("--only and --skip leave no benchmark to run; name at least one that --skip does not.")
    paths = {name: args.out / f"bench-{name}.json" for name in names}
    for path in paths.values():
        check_output_file(path, "--out")  # before an hour of work, not after it
    written = {}
    for name in names:
        add_arguments, run, _ = BENCHES[name]
        parser = argparse.ArgumentParser(prog=f"bench {name}")
        add_arguments(parser)
        started = time.perf_counter()
        result = with_machine(run)(parser.parse_args([]))
        result["bench_wall_s"] = round(time.perf_counter() - started, 2)
        atomic_write_json(paths[name], result)
        print(f"wrote {paths[name]} ({result['bench_wall_s']:.0f} s)")
        written[name] = str(paths[name])
    return {"written": written}
