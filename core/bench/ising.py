"""Benchmark of the pseudolikelihood Ising fit: the batched joint fit against per-spin scikit-learn.

`python -m core bench ising`. Spins come from a planted Ising model with known communities
(`planted_ising_model`) by Gibbs sampling (`gibbs_sample`); the tests use the same two functions
for fits with a known answer.
"""

from __future__ import annotations

import time
from typing import Any

import networkx as nx
import numpy as np
import torch
from threadpoolctl import threadpool_limits

from core.stats.ising import DEFAULT_C, fit_ising_pseudolikelihood, fit_ising_sklearn
from core.stats.spins import as_array, check_spins


def planted_ising_model(n_spins: int, seed: int = 0, *, community: int = 16, density: float = 0.5,
                        coupling: tuple[float, float] = (0.1, 0.3), positive_share: float = 0.8,
                        cross_std: float = 0.05, cross_degree: float = 4.0, field_std: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """A sparse-ish Ising model with planted communities: (J [n, n] symmetric zero diagonal, h [n]).

    Within a community of `community` spins each pair is coupled with probability `density`,
    |J| ~ U(coupling), positive with probability positive_share; across communities about
    cross_degree weak N(0, cross_std) couplings per spin. With the defaults, pseudolikelihood fits on
    2000 samples of 256 spins have mean |J| about 0.04, 99th percentile 0.28 and maximum 0.5-0.7,
    close to the published OLMo-1B fits (0.06 / 0.29 / 0.9); stronger couplings (e.g. (0.1, 0.4))
    push some spins towards an ordered, nearly separable regime, where every solver needs many
    more iterations.
    """
    rng = np.random.default_rng(seed)
    comm = np.arange(n_spins) // community
    same = comm[:, None] == comm[None, :]
    p = np.where(same, density, min(1.0, cross_degree / n_spins))
    edges = np.triu(rng.random((n_spins, n_spins)) < p, 1)
    sign = np.where(rng.random((n_spins, n_spins)) < positive_share, 1.0, -1.0)
    vals = np.where(same, rng.uniform(*coupling, (n_spins, n_spins)) * sign, rng.normal(0.0, cross_std, (n_spins, n_spins)))
    J = np.where(edges, vals, 0.0)
    J = J + J.T
    h = rng.normal(0.0, field_std, n_spins)
    return J, h


def gibbs_sample(J: Any, h: Any, n_samples: int, seed: int = 0, *, n_chains: int = 100, burn_in: int = 300,
                 thin: int = 5) -> np.ndarray:
    """Spins [n_samples, n] in {-1, +1} from P(s) ~ exp(sum_{i<j} J_ij s_i s_j + sum_i h_i s_i).

    Parallel chains, each swept color class by color class (a greedy coloring of the coupling graph,
    so every class is updated exactly in one vectorized step); burn_in sweeps, then one sample every
    `thin` sweeps per chain.
    """
    J = as_array(J)
    h = as_array(h)
    n = len(h)
    rng = np.random.default_rng(seed)
    coloring = nx.greedy_color(nx.from_numpy_array((J != 0).astype(np.int8)), strategy="largest_first")
    classes = [np.array(sorted(i for i, c in coloring.items() if c == k)) for k in sorted(set(coloring.values()))]
    chains = max(1, min(n_chains, n_samples))
    per_chain = -(-n_samples // chains)
    s = rng.choice([-1.0, 1.0], size=(chains, n))  # [chain, spin]
    saved = []
    for sweep in range(burn_in + per_chain * thin):
        for idx in classes:
            local = s @ J[:, idx] + h[idx]                          # [chain, len(idx)]
            up = rng.random(local.shape) < 1.0 / (1.0 + np.exp(-2.0 * local))
            s[:, idx] = np.where(up, 1.0, -1.0)
        if sweep >= burn_in and (sweep - burn_in) % thin == thin - 1:
            saved.append(s.copy())
    return np.stack(saved, 0).reshape(-1, n)[:n_samples].astype(np.int8)


# ---------------------------------------------------------------- bench


def _upper(a: np.ndarray) -> np.ndarray:
    return a[np.triu_indices(a.shape[0], 1)]


def bench_ising(n_spins: int = 256, n_samples: int = 2000, seed: int = 0, repeats: int = 3, compare_lbfgs: bool = False,
                coupling: tuple[float, float] = (0.1, 0.3)) -> dict:
    """Joint fit vs per-spin scikit-learn at the reference settings, both judged against a tight solution.

    Samples come from planted_ising_model by Gibbs sampling. Times are wall-clock (the joint fit: the
    median of `repeats` runs after a warm-up) with two torch threads, and again with one (scikit-learn
    runs single-threaded: its fastest setting for these small problems); CPU times are reported too,
    since other processes may share the cores. The tight solution is exact-Hessian float64 Newton to a relative step of
    1e-10, started from the scikit-learn fit (independent of the joint fit; the optimum is unique).
    """
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        J_true, h_true = planted_ising_model(n_spins, seed, coupling=tuple(coupling))
        t0 = time.perf_counter()
        with threadpool_limits(limits=1):  # small matrix products: one thread is fastest on shared cores
            spins = gibbs_sample(J_true, h_true, n_samples, seed)
        gibbs_s = time.perf_counter() - t0
        check_spins(spins)
        # warm-up (library initialisation, thread pools) on a small slice, untimed
        fit_ising_sklearn(spins[:, :8], C=DEFAULT_C)
        fit_ising_pseudolikelihood(spins[:, :32], C=DEFAULT_C)

        t0, c0 = time.perf_counter(), time.process_time()
        sk = fit_ising_sklearn(spins, C=DEFAULT_C, max_iter=500)
        sklearn_s, sklearn_cpu = time.perf_counter() - t0, time.process_time() - c0

        def time_joint(threads: int):
            torch.set_num_threads(threads)
            fit_ising_pseudolikelihood(spins[:, :32], C=DEFAULT_C)  # warm-up at this thread count
            walls, cpus = [], []
            for _ in range(max(1, repeats)):
                t0, c0 = time.perf_counter(), time.process_time()
                fit = fit_ising_pseudolikelihood(spins, C=DEFAULT_C, method="joint")
                walls.append(time.perf_counter() - t0)
                cpus.append(time.process_time() - c0)
            return fit, walls, cpus

        joint_1, joint_times_1, joint_cpu_1 = time_joint(1)
        joint, joint_times, joint_cpu = time_joint(2)   # the reported joint_s: two threads
        joint_s, joint_s_1 = float(np.median(joint_times)), float(np.median(joint_times_1))

        torch.set_num_threads(1)  # untimed; one thread is the robust choice on shared cores
        t0 = time.perf_counter()
        tight = fit_ising_pseudolikelihood(spins, C=DEFAULT_C, method="newton", tol=1e-10, max_iter=60, init=sk)
        tight_s = time.perf_counter() - t0

        def rel(J):
            return float(np.linalg.norm(J - tight.J) / np.linalg.norm(tight.J))

        def gap(fit):
            return float((fit.objective - tight.objective) / abs(tight.objective))

        out = {
            "sklearn_s": sklearn_s, "joint_s": joint_s, "speedup": sklearn_s / joint_s,
            "rel_diff_J": rel(joint.J), "rel_diff_J_sklearn": rel(sk.J),
            "objective_gap_joint": gap(joint), "objective_gap_sklearn": gap(sk),
            "sklearn_cpu_s": sklearn_cpu, "joint_cpu_s": float(np.median(joint_cpu)),
            "joint_times_s": joint_times, "joint_iterations": joint.n_iter, "joint_converged": joint.converged,
            "joint_s_1thread": joint_s_1, "speedup_1thread": sklearn_s / joint_s_1, "joint_times_s_1thread": joint_times_1,
            "joint_cpu_s_1thread": float(np.median(joint_cpu_1)), "rel_diff_J_1thread": rel(joint_1.J),
            "objective_gap_joint_1thread": gap(joint_1),
            "sklearn_max_iterations": sk.n_iter, "sklearn_converged": sk.converged,
            "tight_s": tight_s, "tight_converged": tight.converged, "tight_objective": tight.objective,
            "recovery_corr_J": float(np.corrcoef(_upper(joint.J), _upper(J_true))[0, 1]),
            "gibbs_s": gibbs_s, "n_spins": n_spins, "n_samples": n_samples, "seed": seed, "C": DEFAULT_C,
            "coupling": list(coupling),
            "torch_threads": 2, "sklearn_threads": 1,
            "solver": "joint = batched inexact Newton (PCG, float32 curvature, float64 gradients)",
        }
        if compare_lbfgs:
            t0 = time.perf_counter()
            lb = fit_ising_pseudolikelihood(spins, C=DEFAULT_C, method="lbfgs")
            out.update({"lbfgs_s": time.perf_counter() - t0, "rel_diff_J_lbfgs": rel(lb.J), "objective_gap_lbfgs": gap(lb),
                        "lbfgs_iterations": lb.n_iter})
        return out
    finally:
        torch.set_num_threads(previous_threads)
