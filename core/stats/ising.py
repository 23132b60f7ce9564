"""Co-activation proposal [CVC]: Ising communities of attention heads (METHODS.md, "Co-activation").

The model-free half of the method, as pure functions on arrays:

1. signal per (example, head) = max attention over keys at the query position; binarize each head at
   its own median (strictly greater -> +1, else -1);
2. a pairwise Ising model by pseudolikelihood: for each head i an L2 logistic regression of s_i on
   all other spins, C = 1000 on the summed log-loss with an unpenalised intercept (the reference's
   per-spin scikit-learn fit); J = coef / 2 symmetrized with zero diagonal, h = intercept / 2.
   The N regressions are independent, so HeadLab solves them together (`fit_ising_pseudolikelihood`,
   a batched inexact Newton method) and keeps the per-spin scikit-learn fit as the reference;
3. spectral clustering of |J| (scikit-learn, exactly as the reference), scored against supervised
   head classes by ARI / NMI / purity for each k;
4. per-cluster composition, purity and isolation, and the candidate community (argmax of
   purity x isolation x size factor among clusters within the size bounds);
5. for MoE models: routing strata by k-means on router weights, one Ising fit per stratum, the best
   within-stratum ARI, and its random-partition null z-score.

Heads are flat indices f = layer * n_head + head in every array; supervised labels are keyed by
(layer, head). The closure test itself (ablation) lives with the ablation engine.
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from core.errors import HeadLabError

Head = tuple[int, int]

DEFAULT_C = 1000.0
DEFAULT_KS = (4, 6, 8, 10, 12)
AFFINITY_EPS = 1e-12      # added to |J| before spectral clustering (reference)
ISOLATION_FLOOR = 1e-12   # outside_mean_J floor in the isolation ratio (reference)
Z_STD_FLOOR = 1e-9        # a zero null spread is floored here, as the closure z (METHODS.md)


# ---------------------------------------------------------------- small helpers


def _numpy(x: Any, dtype=np.float64) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype)


def _head_label(f: int, n_head: int | None) -> str:
    if n_head:
        layer, head = divmod(int(f), int(n_head))
        return f"L{layer}H{head}"
    return f"head {int(f)}"


def _heads_text(flat: Iterable[int], n_head: int | None, limit: int = 12) -> str:
    flat = [int(f) for f in flat]
    names = [_head_label(f, n_head) for f in flat[:limit]]
    more = f" and {len(flat) - limit} more" if len(flat) > limit else ""
    return ", ".join(names) + more


def _check_spins(spins: Any, *, allow_constant: bool = False, allow_few_samples: bool = False,
                 n_head: int | None = None) -> np.ndarray:
    """Validate a [example, head] matrix of +-1 spins; returns it as float64."""
    s = _numpy(spins)
    if s.ndim != 2 or s.shape[0] < 2 or s.shape[1] < 2:
        raise HeadLabError(f"spins must be an [example, head] matrix with at least 2 of each, got shape {tuple(s.shape)}; "
                           "pass the binarized signal of all heads.")
    if not np.all((s == 1.0) | (s == -1.0)):
        raise HeadLabError("spins must be +1 or -1 only; binarize the signal with binarize_at_median first.")
    m, n = s.shape
    if m < n and not allow_few_samples:
        raise HeadLabError(f"{m} examples for {n} heads: the pseudolikelihood fit needs at least as many examples as heads; "
                           "use a larger probe batch (more examples).")
    if not allow_constant:
        const = constant_heads(s)
        if len(const):
            raise HeadLabError(f"{len(const)} head(s) never change sign ({_heads_text(const, n_head)}), so their coupling is "
                               "undefined; drop them (drop_constant_heads / --drop-constant) or use more varied examples.")
    return s


def constant_heads(spins: Any) -> np.ndarray:
    """Flat indices of heads whose spin is the same in every example (their regression has one class)."""
    s = _numpy(spins)
    return np.flatnonzero(np.all(s == s[:1], axis=0))


# ---------------------------------------------------------------- 1. signal and spins


def max_attention_signal(attn_max: Any) -> np.ndarray:
    """Flatten per-(example, layer, head) max attention at the query position to [example, layer * n_head + head]."""
    a = _numpy(attn_max)
    if a.ndim != 3 or min(a.shape) < 1:
        raise HeadLabError(f"expected max attention as [example, layer, head], got shape {tuple(a.shape)}; "
                           "pass the cached per-head maximum attention at the query position.")
    if not np.all(np.isfinite(a)):
        raise HeadLabError("the max-attention signal has NaN or infinite values; recompute the probe cache.")
    e, n_layer, n_head = a.shape
    return a.reshape(e, n_layer * n_head)  # signal: [example, layer * n_head + head]


def binarize_at_median(signal: Any, *, n_head: int | None = None, allow_constant: bool = False,
                       allow_few_samples: bool = False) -> np.ndarray:
    """Spins [example, head] in {-1, +1}: +1 where the head's signal is strictly above its own median.

    A head whose spin never changes (constant signal, or more than half the examples tied at the
    maximum) raises HeadLabError naming it, unless allow_constant; then drop it with drop_constant_heads.
    """
    x = _numpy(signal)
    if x.ndim != 2 or x.shape[0] < 2 or x.shape[1] < 2:
        raise HeadLabError(f"expected a signal [example, head] with at least 2 of each, got shape {tuple(x.shape)}.")
    if not np.all(np.isfinite(x)):
        raise HeadLabError("the signal has NaN or infinite values; recompute the probe cache.")
    median = np.median(x, axis=0)                              # [head]
    spins = np.where(x > median[None, :], 1, -1).astype(np.int8)  # [example, head]
    _check_spins(spins, allow_constant=allow_constant, allow_few_samples=allow_few_samples, n_head=n_head)
    return spins


def drop_constant_heads(spins: Any) -> tuple[np.ndarray, np.ndarray]:
    """(spins of the varying heads [example, kept], their flat indices [kept])."""
    s = np.asarray(spins)
    keep = np.setdiff1d(np.arange(s.shape[1]), constant_heads(s))
    return s[:, keep], keep


# ---------------------------------------------------------------- 2. pseudolikelihood Ising fit


@dataclass(frozen=True, eq=False)  # array fields: compare fits by their arrays, not ==
class IsingFit:
    """A pseudolikelihood Ising fit. coef[i, j] = weight of spin j in spin i's logistic conditional."""

    J: np.ndarray            # [head, head] symmetric, zero diagonal: (coef + coef.T) / 4
    h: np.ndarray            # [head] intercept / 2
    coef: np.ndarray         # [head, head] zero diagonal
    intercept: np.ndarray    # [head]
    objective: float         # sum over spins of the penalised objective (see penalised_objective)
    n_iter: int              # outer iterations (joint) or the largest per-spin iteration count (sklearn)
    converged: bool
    method: str
    C: float = DEFAULT_C
    constant_heads: tuple[int, ...] = ()  # heads with a constant spin, given zero coupling (constant="zero")

    def to_json(self) -> dict:
        return {
            "J": self.J.tolist(), "h": self.h.tolist(), "coef": self.coef.tolist(), "intercept": self.intercept.tolist(),
            "objective": float(self.objective), "n_iter": int(self.n_iter), "converged": bool(self.converged),
            "method": self.method, "C": float(self.C), "constant_heads": [int(i) for i in self.constant_heads],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "IsingFit":
        return cls(
            J=np.asarray(data["J"], dtype=np.float64), h=np.asarray(data["h"], dtype=np.float64),
            coef=np.asarray(data["coef"], dtype=np.float64), intercept=np.asarray(data["intercept"], dtype=np.float64),
            objective=float(data["objective"]), n_iter=int(data["n_iter"]), converged=bool(data["converged"]),
            method=str(data["method"]), C=float(data.get("C", DEFAULT_C)),
            constant_heads=tuple(int(i) for i in data.get("constant_heads", ())),
        )


def couplings_from_coef(coef: Any, intercept: Any) -> tuple[np.ndarray, np.ndarray]:
    """J = (coef / 2 + its transpose) / 2 with zero diagonal, h = intercept / 2 (reference convention)."""
    w = _numpy(coef)
    J = w / 2.0
    J = (J + J.T) / 2.0
    np.fill_diagonal(J, 0.0)
    return J, _numpy(intercept) / 2.0


def penalised_objective(spins: Any, coef: Any, intercept: Any, C: float = DEFAULT_C, *, per_spin: bool = False):
    """Sum over spins i of C * sum_m logloss(s_i^m | s_-i^m) + 0.5 * ||coef_i||^2 (intercept unpenalised).

    This is exactly what scikit-learn's LogisticRegression(C) minimises for each spin; coef's diagonal
    is ignored (spin i does not predict itself).
    """
    s = torch.as_tensor(_numpy(spins))
    w = torch.as_tensor(_numpy(coef)).clone()
    w.fill_diagonal_(0.0)
    b = torch.as_tensor(_numpy(intercept))
    z = s @ w.T + b                                            # logits: [example, spin]
    loss = C * F.softplus(-s * z).sum(0) + 0.5 * (w * w).sum(1)  # [spin]; logloss(y, z) = softplus(-s z)
    return loss.numpy() if per_spin else float(loss.sum())


class _Problem:
    """The N conditional regressions as one batch. Row i of theta [N, N+1] = (coef_i, intercept_i)."""

    def __init__(self, spins: np.ndarray, C: float, hvp_dtype: torch.dtype):
        s = torch.as_tensor(spins, dtype=torch.float64)
        m, n = s.shape
        self.C, self.m, self.n = float(C), m, n
        self.S = s                                                        # [M, N]
        self.X = torch.cat([s, torch.ones(m, 1, dtype=torch.float64)], 1)  # [M, N+1]; last column = intercept
        self.Y = (s + 1.0) / 2.0                                          # [M, N] labels in {0, 1}
        self.Xl = self.X.to(hvp_dtype)                                    # low-precision copy for curvature products
        self.reg = torch.ones(n + 1, dtype=torch.float64)
        self.reg[-1] = 0.0                                                # intercept unpenalised
        self.hvp_dtype = hvp_dtype

    def mask(self, rows: torch.Tensor) -> torch.Tensor:
        """[len(rows), N+1] with 0 at each problem's own spin (coef_ii is fixed at 0)."""
        out = torch.ones(len(rows), self.n + 1, dtype=torch.float64)
        out[torch.arange(len(rows)), rows] = 0.0
        return out

    def objective(self, theta: torch.Tensor) -> torch.Tensor:
        z = self.X @ theta.T
        return self.C * F.softplus(-self.S * z).sum(0) + 0.5 * (theta * theta * self.reg).sum(1)

    def exact_hessians(self, d: torch.Tensor, rows: torch.Tensor, dtype: torch.dtype = torch.float64,
                       chunk: int = 16) -> torch.Tensor:
        """H_i = C X^T diag(d_i) X + diag(reg) with row/column i replaced by the unit vector: [r, N+1, N+1]."""
        r, k = len(rows), self.n + 1
        x = self.X.to(dtype)
        dd = d.to(dtype)
        H = torch.empty(r, k, k, dtype=dtype)
        for a in range(0, r, chunk):
            A = x[None] * dd[:, a:a + chunk].T[:, :, None]                # [c, M, N+1]
            H[a:a + chunk] = self.C * (A.transpose(1, 2) @ x)
        H += torch.diag(self.reg.to(dtype))
        j = torch.arange(r)
        H[j, rows, :] = 0.0
        H[j, :, rows] = 0.0
        H[j, rows, rows] = 1.0
        return H

    def newton_steps(self, g: torch.Tensor, d: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor,
                     dtype: torch.dtype = torch.float64, eta: float = 0.1) -> torch.Tensor:
        """Exact-Hessian Newton directions -H_i^{-1} g_i by Cholesky.

        In low precision first, accepted where the float64 residual ||H step + g|| <= eta ||g||;
        the rest in float64 (a float32 Hessian cannot resolve a nearly separable problem's
        intercept direction). Where even float64 fails (almost no curvature along the unpenalised
        intercept), Levenberg-Marquardt damping is added until the factorisation succeeds: any
        positive definite system still gives a descent direction.
        """
        if dtype != torch.float64:
            H = self.exact_hessians(d, rows, dtype)
            L, info = torch.linalg.cholesky_ex(H)
            step = torch.cholesky_solve(-g.to(dtype)[:, :, None], L)[:, :, 0].double() * mask
            hv = self.C * (((self.X @ step.T) * d).T @ self.X) + step * self.reg
            res = ((hv + g) * mask).norm(dim=1)
            bad = torch.nonzero((info != 0) | ~torch.isfinite(res) | (res > eta * g.norm(dim=1))).flatten()
            if len(bad):
                step[bad] = self.newton_steps(g[bad], d[:, bad], rows[bad], mask[bad])
            return step
        H = self.exact_hessians(d, rows, torch.float64)
        L, info = torch.linalg.cholesky_ex(H)
        step = torch.cholesky_solve(-g[:, :, None], L)[:, :, 0]
        bad = torch.nonzero((info != 0) | ~torch.isfinite(step).all(1)).flatten()
        if len(bad):
            Hb = H[bad]
            scale = Hb.diagonal(dim1=1, dim2=2).abs().amax(1)                # [b]
            eye = torch.eye(Hb.shape[-1], dtype=torch.float64)
            todo = torch.ones(len(bad), dtype=torch.bool)
            for power in range(-12, 3, 2):
                Lb, info_b = torch.linalg.cholesky_ex(Hb + (10.0 ** power) * scale[:, None, None] * eye)
                trial = torch.cholesky_solve(-g[bad][:, :, None], Lb)[:, :, 0]
                ok = todo & (info_b == 0) & torch.isfinite(trial).all(1)
                step[bad[ok]] = trial[ok]
                todo &= ~ok
                if not todo.any():
                    break
            if todo.any():                                                   # last resort: a scaled gradient step
                step[bad[todo]] = -g[bad[todo]] / scale[todo, None]
        return step * mask


def _line_search(prob: _Problem, theta, step, z, u, rows, n_newton: int = 2) -> torch.Tensor:
    """Per-problem step length t minimising the convex phi_i(t) = f_i(theta_i + t step_i).

    Safeguarded 1-D Newton from t = 1 on phi'(t) (bracketed, so it cannot run away); float32 is
    plenty for a step length and much faster here. u = X step^T: [M, r].
    """
    dt = torch.float32
    zf, uf, y = z.to(dt), u.to(dt), prob.Y[:, rows].to(dt)
    ss = (step * step * prob.reg).sum(1).to(dt)
    ts = (theta * step * prob.reg).sum(1).to(dt)
    r = len(rows)
    t = torch.ones(r, dtype=dt)
    lo = torch.zeros(r, dtype=dt)
    hi = torch.full((r,), math.inf, dtype=dt)
    for _ in range(n_newton):
        p = torch.sigmoid(zf + uf * t)
        d1 = prob.C * ((p - y) * uf).sum(0) + ts + t * ss
        d2 = prob.C * (p * (1.0 - p) * uf * uf).sum(0) + ss
        lo = torch.where(d1 < 0, t, lo)
        hi = torch.where(d1 > 0, t, hi)
        t_new = t - d1 / torch.clamp(d2, min=1e-30)
        inside = (t_new > lo) & (t_new < hi)
        fallback = torch.where(torch.isinf(hi), 2.0 * t, (lo + hi) / 2.0)
        t = torch.where(inside, t_new, fallback)
    return t.double()


def _armijo(prob: _Problem, theta, step, g, z, u, rows, max_halvings: int = 60) -> torch.Tensor:
    """Backtracking (Armijo) step lengths in float64 on the true objective, for the hard problems.

    Robust to the huge directions of nearly separable problems, where a 1-D Newton model is poor.
    """
    s = prob.S[:, rows]
    reg = prob.reg
    f0 = prob.C * F.softplus(-s * z).sum(0) + 0.5 * (theta * theta * reg).sum(1)
    slope = (g * step).sum(1)                                              # < 0 for a descent direction
    t = torch.ones(len(rows), dtype=torch.float64)
    todo = torch.ones(len(rows), dtype=torch.bool)
    for _ in range(max_halvings):
        th_t = theta + t[:, None] * step
        ft = prob.C * F.softplus(-s * (z + u * t)).sum(0) + 0.5 * (th_t * th_t * reg).sum(1)
        ok = ft <= f0 + 1e-4 * t * slope
        todo &= ~ok
        if not todo.any():
            break
        t = torch.where(todo, t * 0.5, t)
    return torch.where(todo, torch.zeros_like(t), t)


def _fit_newton(spins: np.ndarray, C: float, tol: float, max_iter: int, exact: bool,
                cg_max: int = 10, eta: float = 0.1, hvp_dtype: torch.dtype = torch.float32,
                theta0: torch.Tensor | None = None) -> tuple[torch.Tensor, int, bool]:
    """Batched Newton over all N regressions. Returns theta [N, N+1], iterations, converged.

    exact=False (the fast path): each Newton direction by preconditioned conjugate gradients with
    Hessian-vector products for all problems at once (two GEMMs), stopped at relative residual eta.
    The preconditioner is (c_i X^T X + I) restricted to problem i's coordinates, with
    c_i = C * mean(p(1 - p)), applied to all problems through one eigendecomposition of X^T X; it is
    the Hessian at theta = 0 (up to the intercept's penalty) and within a small factor of it while
    the fitted probabilities are not extreme. A problem whose CG stalls (a nearly separable one) takes exact-Hessian Newton steps
    from then on (see newton_steps), with an Armijo line search.
    exact=True: exact float64 Hessians for all, every iteration (the tight reference).
    Gradients and logits are float64, so the low-precision curvature only shapes the path, not the
    optimum. A problem stops when its (undamped) Newton step is below tol relative to its parameters.
    """
    prob = _Problem(spins, C, hvp_dtype)
    n = prob.n
    theta = torch.zeros(n, n + 1, dtype=torch.float64) if theta0 is None else theta0.double() * prob.mask(torch.arange(n))
    z_all = prob.X @ theta.T                                               # logits [M, N], kept up to date
    active = torch.arange(n)
    is_hard = torch.zeros(n, dtype=torch.bool)   # CG stalled once: exact Hessians from then on
    if not exact:
        lam, U = torch.linalg.eigh(prob.X.T @ prob.X)                      # X^T X = U diag(lam) U^T
        lam = lam.clamp(min=0.0)
    it = 0
    full_mask = prob.mask(torch.arange(n))
    for it in range(1, max_iter + 1):
        rows = active
        full = len(rows) == n                                              # all active: work on views, no copies
        mask = full_mask if full else full_mask[rows]
        th = theta if full else theta[rows]
        z = z_all if full else z_all[:, rows]
        p = torch.sigmoid(z)
        g = (prob.C * (p - (prob.Y if full else prob.Y[:, rows])).T @ prob.X + th * prob.reg) * mask
        d = p * (1.0 - p)                                                  # [M, r] curvature weights
        step = torch.zeros_like(th)
        if exact:
            hard = torch.arange(len(rows))
        else:
            easy = torch.nonzero(~is_hard[rows]).flatten()
            hard = torch.nonzero(is_hard[rows]).flatten()
            if len(easy):
                if len(easy) == len(rows):
                    x, stalled = _pcg_direction(prob, g, d, rows, mask, lam, U, eta, cg_max)
                    step = x
                else:
                    x, stalled = _pcg_direction(prob, g[easy], d[:, easy], rows[easy], mask[easy], lam, U, eta, cg_max)
                    step[easy] = x
                hard = torch.cat([hard, easy[stalled]])
                is_hard[rows[easy[stalled]]] = True
        if len(hard):
            step[hard] = prob.newton_steps(g[hard], d[:, hard], rows[hard], mask[hard],
                                           torch.float64 if exact else hvp_dtype, eta)
        u = prob.X @ step.T                                                # [M, r]
        # Far from the optimum a line search keeps Newton stable; close to it the full step is right.
        t = torch.ones(len(rows), dtype=torch.float64)
        far = step.norm(dim=1) > 1e-2 * (th.norm(dim=1) + 1e-2)
        hard_mask = torch.zeros(len(rows), dtype=torch.bool)
        hard_mask[hard] = True
        soft = torch.nonzero(far & ~hard_mask).flatten()
        if len(soft) == len(rows):
            t = _line_search(prob, th, step, z, u, rows)
        elif len(soft):
            t[soft] = _line_search(prob, th[soft], step[soft], z[:, soft], u[:, soft], rows[soft])
        firm = torch.nonzero(far & hard_mask).flatten()
        if len(firm):
            t[firm] = _armijo(prob, th[firm], step[firm], g[firm], z[:, firm], u[:, firm], rows[firm])
        new_th = th + t[:, None] * step
        if full:
            theta, z_all = new_th, z + u * t
        else:
            theta[rows] = new_th
            z_all[:, rows] = z + u * t
        # converged: the Newton step itself (not the damped move) is small relative to the parameters
        done = (step.norm(dim=1) <= tol * (new_th.norm(dim=1) + tol)) | (g.norm(dim=1) == 0)
        active = rows[~done]
        if len(active) == 0:
            return theta, it, True
    return theta, it, False


def _pcg(g: torch.Tensor, hvp, precondition, target: torch.Tensor, cg_max: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched preconditioned CG for H_i x_i = -g_i, one row per problem, each with its own scalars.

    hvp(v, idx) and precondition(v, idx) act on the rows idx (idx None: all rows, no gather).
    Returns (x, stalled rows): the rows whose residual is still above target after cg_max iterations
    or that met non-positive curvature. Every CG iterate from 0 is a descent direction, so x is
    usable either way.
    """
    r = g.shape[0]
    x = torch.zeros_like(g)
    res = -g
    zr = precondition(res, None)
    pdir = zr.clone()
    rz = (res * zr).sum(1)
    live = res.norm(dim=1) > target
    stalled = torch.zeros(r, dtype=torch.bool)
    for _ in range(cg_max):
        n_live = int(live.sum())
        if n_live == 0:
            break
        if n_live == r:                                                    # every row still running: no gathers
            hp = hvp(pdir, None)
            curv = (pdir * hp).sum(1)
            if bool((torch.isfinite(curv) & (curv > 0)).all()):
                alpha = rz / curv
                x += alpha[:, None] * pdir
                res -= alpha[:, None] * hp
                zr = precondition(res, None)
                rz_new = (res * zr).sum(1)
                pdir = zr + (rz_new / rz)[:, None] * pdir
                rz = rz_new
                live = res.norm(dim=1) > target
                continue
        idx = torch.nonzero(live).flatten()
        p_i = pdir[idx]
        hp = hvp(p_i, idx)
        curv = (p_i * hp).sum(1)
        broken = ~(torch.isfinite(curv) & (curv > 0))                      # no usable curvature: leave to exact Newton
        if broken.any():
            stalled[idx[broken]] = True
            live[idx[broken]] = False
            keep = ~broken
            idx, p_i, hp, curv = idx[keep], p_i[keep], hp[keep], curv[keep]
            if len(idx) == 0:
                continue
        alpha = rz[idx] / curv
        x[idx] += alpha[:, None] * p_i
        res_i = res[idx] - alpha[:, None] * hp
        res[idx] = res_i
        z_i = precondition(res_i, idx)
        rz_new = (res_i * z_i).sum(1)
        pdir[idx] = z_i + (rz_new / rz[idx])[:, None] * p_i
        rz[idx] = rz_new
        live[idx] = res_i.norm(dim=1) > target[idx]
    return x, torch.nonzero(live | stalled).flatten()


def _pcg_direction(prob: _Problem, g, d, rows, mask, lam, U, eta: float, cg_max: int):
    """Approximate Newton directions for the easy problems: PCG with low-precision Hessian-vector
    products for all of them at once and the scaled-Gram preconditioner (see _fit_newton)."""
    dt = prob.hvp_dtype
    r = len(rows)
    c = prob.C * d.mean(0)                                                 # [r]
    winv = 1.0 / (c[:, None] * lam[None, :] + 1.0)                         # [r, N+1]
    bcol = (winv * U[rows]) @ U.T                                          # [r, N+1]: A_i^{-1} e_i
    own_idx = (torch.arange(r), rows)
    bii = bcol[own_idx]
    dl = d.to(dt)
    xl = prob.Xl
    ul = U.to(dt)
    winv_l = winv.to(dt)

    def precondition(v, idx):
        # (A_i restricted to coordinates != i)^{-1} v_i, via the Schur complement of the full inverse.
        if idx is None:
            av = (((v.to(dt) @ ul) * winv_l) @ ul.T).double()
            return (av - bcol * (av[own_idx] / bii)[:, None]) * mask
        av = (((v.to(dt) @ ul) * winv_l[idx]) @ ul.T).double()
        own = av[torch.arange(len(idx)), rows[idx]]
        return (av - bcol[idx] * (own / bii[idx])[:, None]) * mask[idx]

    def hvp(v, idx):
        w = dl if idx is None else dl[:, idx]
        hv = prob.C * (((xl @ v.to(dt).T) * w).T @ xl).double()
        return (hv + v * prob.reg) * (mask if idx is None else mask[idx])

    return _pcg(g, hvp, precondition, eta * g.norm(dim=1), cg_max)


def _fit_lbfgs(spins: np.ndarray, C: float, tol: float, max_iter: int) -> tuple[torch.Tensor, int, bool]:
    """All N problems as one objective, torch L-BFGS with strong-Wolfe line search (comparison path).

    One line search is shared by all problems, so the slowest problem sets the pace; kept to show
    why the batched Newton method is the default.
    """
    prob = _Problem(spins, C, torch.float64)
    n = prob.n
    mask = prob.mask(torch.arange(n))
    theta = torch.zeros(n, n + 1, dtype=torch.float64, requires_grad=True)
    grad_scale = prob.C * prob.m  # gradient entries are O(C M) at theta = 0
    opt = torch.optim.LBFGS([theta], lr=1.0, max_iter=max_iter, max_eval=2 * max_iter, history_size=20,
                            tolerance_grad=tol * grad_scale * 1e-3, tolerance_change=0.0, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = prob.objective(theta * mask).sum()
        loss.backward()
        return loss

    opt.step(closure)
    n_iter = int(opt.state[theta]["n_iter"])
    return (theta.detach() * mask), n_iter, n_iter < max_iter


FIT_METHODS = ("joint", "newton", "lbfgs", "sklearn")


FIT_DEFAULTS = {"joint": (1e-4, 100), "newton": (1e-10, 100), "lbfgs": (1e-6, 2000), "sklearn": (1e-4, 500)}  # (tol, max_iter)


def fit_ising_pseudolikelihood(spins: Any, C: float = DEFAULT_C, method: str = "joint", tol: float | None = None,
                               max_iter: int | None = None, *, constant: str = "error", n_head: int | None = None,
                               allow_few_samples: bool = False, init: IsingFit | None = None) -> IsingFit:
    """Pseudolikelihood Ising fit: all N L2 logistic regressions s_i ~ s_-i (C on the summed log-loss,
    unpenalised intercept), the reference's objective.

    method: "joint" (default; batched inexact Newton, see _fit_newton), "newton" (exact Hessians, for a
    tightly converged solution), "lbfgs" (one torch L-BFGS over the summed objective), "sklearn"
    (per-spin LogisticRegression, the reference; tol/max_iter are scikit-learn's there).
    tol (default per method, FIT_DEFAULTS): a problem stops when its Newton step is below tol
    relative to its parameters ("joint", "newton"); scikit-learn's tol for "sklearn".
    constant: "error" (default) or "zero" = heads with a constant spin get zero couplings and field.
    init: start the Newton methods from another fit's coefficients (the optimum is unique, so this
    only saves iterations; the bench polishes the scikit-learn fit into the tight solution this way).
    """
    if method not in FIT_METHODS:
        raise HeadLabError(f"unknown fit method {method!r}; use one of {', '.join(FIT_METHODS)}.")
    tol = FIT_DEFAULTS[method][0] if tol is None else float(tol)
    max_iter = FIT_DEFAULTS[method][1] if max_iter is None else int(max_iter)
    if constant not in ("error", "zero"):
        raise HeadLabError(f"constant must be 'error' or 'zero', got {constant!r}.")
    if not (C > 0 and math.isfinite(C)):
        raise HeadLabError(f"C must be a positive number, got {C}; the reference uses C = 1000.")
    s = _check_spins(spins, allow_constant=constant == "zero", allow_few_samples=allow_few_samples, n_head=n_head)
    m, n = s.shape
    const = constant_heads(s)
    keep = np.setdiff1d(np.arange(n), const)
    if len(keep) < 2:
        raise HeadLabError("fewer than 2 heads vary over these examples; there is nothing to couple.")
    sk = s[:, keep]
    if method == "sklearn":
        sub = fit_ising_sklearn(sk, C=C, max_iter=max_iter, tol=tol)
        w, b, n_iter, converged = sub.coef, sub.intercept, sub.n_iter, sub.converged
    else:
        if method == "lbfgs":
            theta, n_iter, converged = _fit_lbfgs(sk, C, tol, max_iter)
        else:
            theta0 = None
            if init is not None:
                if init.coef.shape != (n, n):
                    raise HeadLabError(f"init has {init.coef.shape[0]} heads, the spins {n}; start from a fit of the same heads.")
                theta0 = torch.as_tensor(np.concatenate([init.coef[np.ix_(keep, keep)], init.intercept[keep, None]], 1))
            theta, n_iter, converged = _fit_newton(sk, C, tol, max_iter, exact=method == "newton", theta0=theta0)
        w, b = theta[:, :-1].numpy().copy(), theta[:, -1].numpy().copy()
        np.fill_diagonal(w, 0.0)
    coef = np.zeros((n, n))
    coef[np.ix_(keep, keep)] = w
    intercept = np.zeros(n)
    intercept[keep] = b
    J, h = couplings_from_coef(coef, intercept)
    objective = penalised_objective(sk, w, b, C)
    return IsingFit(J=J, h=h, coef=coef, intercept=intercept, objective=objective, n_iter=int(n_iter),
                    converged=bool(converged), method=method, C=float(C), constant_heads=tuple(int(i) for i in const))


def fit_ising_sklearn(spins: Any, C: float = DEFAULT_C, max_iter: int = 500, tol: float = 1e-4,
                      threads: int | None = 1) -> IsingFit:
    """The reference: one scikit-learn LogisticRegression(C, lbfgs, max_iter) per spin.

    threads=1 (BLAS and OpenMP) by default: each problem is a small matrix-vector workload, and
    multi-threaded regions on cores shared with other processes slow it down by orders of magnitude.
    None leaves the libraries' defaults.
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_limits

    s = _check_spins(spins, allow_few_samples=True)
    m, n = s.shape
    coef = np.zeros((n, n))
    intercept = np.zeros(n)
    iters = []
    with threadpool_limits(limits=threads), warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for i in range(n):
            others = np.delete(np.arange(n), i)
            lr = LogisticRegression(C=C, solver="lbfgs", max_iter=max_iter, tol=tol)
            lr.fit(s[:, others], (s[:, i] > 0).astype(np.int64))
            coef[i, others] = lr.coef_[0]
            intercept[i] = lr.intercept_[0]
            iters.append(int(lr.n_iter_[0]))
    J, h = couplings_from_coef(coef, intercept)
    return IsingFit(J=J, h=h, coef=coef, intercept=intercept, objective=penalised_objective(s, coef, intercept, C),
                    n_iter=max(iters), converged=max(iters) < max_iter, method="sklearn", C=float(C))


# ---------------------------------------------------------------- 3. spectral clusters and scores


def _check_J(J: Any) -> np.ndarray:
    a = _numpy(J)
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] < 3:
        raise HeadLabError(f"J must be a square [head, head] matrix of at least 3 heads, got shape {tuple(a.shape)}.")
    if not np.all(np.isfinite(a)):
        raise HeadLabError("J has NaN or infinite entries; refit the Ising model.")
    if not np.allclose(a, a.T, rtol=1e-8, atol=1e-12):
        raise HeadLabError("J must be symmetric; symmetrize it as (J + J.T) / 2 (couplings_from_coef does).")
    return a


def spectral_clusters(J: Any, k: int, n_init: int | None = None, random_state: int = 0) -> np.ndarray:
    """Cluster ids [head] from scikit-learn SpectralClustering on the affinity |J| + 1e-12 (diagonal 0).

    Exactly the reference call: affinity="precomputed", assign_labels="kmeans", random_state 0;
    n_init None = scikit-learn's default (10; the reference's per-k labels), 1 for the reference's
    candidate selection. Labels depend on the scikit-learn / scipy versions (pinned in requirements).
    """
    from sklearn.cluster import SpectralClustering

    a = _check_J(J)
    n = a.shape[0]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 2 <= int(k) < n:
        raise HeadLabError(f"k = {k} clusters is not possible with {n} heads; choose k between 2 and {n - 1}.")
    affinity = np.abs(a) + AFFINITY_EPS
    np.fill_diagonal(affinity, 0.0)
    kwargs = {} if n_init is None else {"n_init": int(n_init)}
    model = SpectralClustering(n_clusters=int(k), affinity="precomputed", assign_labels="kmeans",
                               random_state=random_state, **kwargs)
    return model.fit_predict(affinity).astype(np.int64)


def labels_from_classifications(classifications: Iterable[Mapping[str, Any]]) -> dict[Head, str]:
    """{(layer, head): class} from a supervised mechinterp JSON's `classifications` list (top-K heads)."""
    out: dict[Head, str] = {}
    for row in classifications:
        out[(int(row["layer"]), int(row["head"]))] = str(row["classification"])
    return out


def _flat_labels(labels_by_head: Mapping[Head, str], n_heads_total: int, n_head: int) -> dict[int, str]:
    if not isinstance(n_head, (int, np.integer)) or n_head < 1 or n_heads_total % n_head:
        raise HeadLabError(f"n_head = {n_head} does not divide the {n_heads_total} heads; pass the heads per layer.")
    out: dict[int, str] = {}
    for (layer, head), cls in labels_by_head.items():
        f = int(layer) * int(n_head) + int(head)
        if not (0 <= int(head) < n_head and 0 <= f < n_heads_total):
            raise HeadLabError(f"labelled head L{layer}H{head} is outside the model's {n_heads_total // n_head} x {n_head} heads; "
                               "check the labels file belongs to this model.")
        out[f] = str(cls)
    if not out:
        raise HeadLabError("no supervised head labels given; run the pattern screen (Step 2) first or pass its classes.")
    return out


@dataclass(frozen=True)
class ClusterMetrics:
    """Agreement of one clustering with the supervised classes, over the labelled heads only."""

    k: int
    n_evaluated: int
    ari: float
    nmi: float
    purity: float
    composition: dict[int, dict[str, int]] = field(compare=False)  # cluster -> class -> count

    def to_json(self) -> dict:
        return {"k": self.k, "n_evaluated": self.n_evaluated, "ari": self.ari, "nmi": self.nmi, "purity": self.purity,
                "composition": {str(c): dict(v) for c, v in self.composition.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ClusterMetrics":
        return cls(k=int(data["k"]), n_evaluated=int(data["n_evaluated"]), ari=float(data["ari"]), nmi=float(data["nmi"]),
                   purity=float(data["purity"]),
                   composition={int(c): {str(k): int(v) for k, v in comp.items()} for c, comp in data["composition"].items()})


def cluster_metrics(cluster_labels: Any, labels_by_head: Mapping[Head, str], *, n_head: int, k: int | None = None) -> ClusterMetrics:
    """ARI, NMI (scikit-learn, arithmetic normalisation) and purity of a clustering vs the supervised classes.

    Only heads present in labels_by_head count; class names are mapped to sorted integers;
    purity = sum over clusters of the majority-class count / n_evaluated.
    """
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    pred_all = np.asarray(cluster_labels).astype(np.int64)
    flat = _flat_labels(labels_by_head, len(pred_all), n_head)
    heads = sorted(flat)
    classes = sorted(set(flat.values()))
    gt = np.array([classes.index(flat[f]) for f in heads])
    pred = pred_all[heads]
    composition: dict[int, dict[str, int]] = {}
    for c in sorted(set(pred.tolist())):
        members = gt[pred == c]
        composition[int(c)] = {classes[g]: int((members == g).sum()) for g in sorted(set(members.tolist()))}
    purity = sum(max(v.values()) for v in composition.values()) / len(heads)
    return ClusterMetrics(k=int(k if k is not None else len(set(pred_all.tolist()))), n_evaluated=len(heads),
                          ari=float(adjusted_rand_score(gt, pred)), nmi=float(normalized_mutual_info_score(gt, pred)),
                          purity=float(purity), composition=composition)


@dataclass(frozen=True)
class AriByK:
    """Spectral clusterings for several k, each scored against the supervised classes; best_k = best ARI."""

    ks: tuple[int, ...]
    metrics: tuple[ClusterMetrics, ...]
    best_k: int
    cluster_labels: dict[int, tuple[int, ...]] = field(compare=False)  # k -> cluster id per head
    n_init: int | None = None

    def metric(self, k: int) -> ClusterMetrics:
        return self.metrics[self.ks.index(k)]

    def to_json(self) -> dict:
        return {"ks": list(self.ks), "metrics": [m.to_json() for m in self.metrics], "best_k": self.best_k,
                "cluster_labels": {str(k): list(v) for k, v in self.cluster_labels.items()}, "n_init": self.n_init}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "AriByK":
        return cls(ks=tuple(int(k) for k in data["ks"]), metrics=tuple(ClusterMetrics.from_json(m) for m in data["metrics"]),
                   best_k=int(data["best_k"]),
                   cluster_labels={int(k): tuple(int(x) for x in v) for k, v in data["cluster_labels"].items()},
                   n_init=data.get("n_init"))


def ari_by_k(J: Any, labels_by_head: Mapping[Head, str], ks: Sequence[int] = DEFAULT_KS, *, n_head: int,
             n_init: int | None = None, random_state: int = 0) -> AriByK:
    """Spectral clustering of |J| for each k, scored by ARI / NMI / purity; best_k = highest ARI (smallest k on ties)."""
    ks = tuple(int(k) for k in ks)
    if not ks:
        raise HeadLabError("no k given; pass at least one number of clusters (reference: 4 6 8 10 12).")
    labels = {k: spectral_clusters(J, k, n_init=n_init, random_state=random_state) for k in ks}
    metrics = tuple(cluster_metrics(labels[k], labels_by_head, n_head=n_head, k=k) for k in ks)
    best = max(range(len(ks)), key=lambda i: (metrics[i].ari, -i))
    return AriByK(ks=ks, metrics=metrics, best_k=ks[best], cluster_labels={k: tuple(int(x) for x in v) for k, v in labels.items()},
                  n_init=n_init)


# ---------------------------------------------------------------- 4. candidate community


@dataclass(frozen=True)
class ClusterInfo:
    """One community: members, supervised composition, and how isolated it is in |J|."""

    cluster: int
    size: int
    heads: tuple[Head, ...]
    layers: tuple[int, ...]
    composition: dict[str, int] = field(compare=False)  # class -> count among the labelled members
    n_classified: int = 0
    purity: float = 0.0
    within_mean_J: float = 0.0
    outside_mean_J: float = 0.0
    isolation_ratio: float = 0.0
    combined_score: float | None = None  # purity * isolation * min(size, max)/max; None when not scored
    eligible: bool = False                # min_size <= size <= max_size

    def to_json(self) -> dict:
        d = asdict(self)
        d["heads"] = [list(h) for h in self.heads]
        d["layers"] = list(self.layers)
        d["composition"] = dict(self.composition)
        return d

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ClusterInfo":
        d = dict(data)
        d["heads"] = tuple((int(a), int(b)) for a, b in d["heads"])
        d["layers"] = tuple(int(x) for x in d["layers"])
        d["composition"] = {str(k): int(v) for k, v in d["composition"].items()}
        return cls(**d)


def cluster_table(J: Any, cluster_labels: Any, labels_by_head: Mapping[Head, str], *, n_head: int,
                  min_size: int = 4, max_size: int = 12) -> tuple[ClusterInfo, ...]:
    """Per-cluster figures as the reference computes them (MANIFEST Addendum), sorted by cluster id.

    within_mean_J = mean |J_ij| over member pairs i < j; outside_mean_J = mean |J_ij| over (member,
    non-member) pairs; isolation = within / max(outside, 1e-12); purity = majority-class share of the
    labelled members ('unclassified' is a class). combined_score is computed for clusters with
    min_size <= size <= max_size, or for every cluster when none qualifies.
    """
    a = np.abs(_check_J(J))
    np.fill_diagonal(a, 0.0)
    n = a.shape[0]
    pred = np.asarray(cluster_labels).astype(np.int64)
    if pred.shape != (n,):
        raise HeadLabError(f"cluster labels must give one cluster per head ({n}), got shape {tuple(pred.shape)}.")
    if not 1 <= min_size <= max_size:
        raise HeadLabError(f"size bounds {min_size}..{max_size} are empty; use 1 <= min_size <= max_size (reference: 4..12).")
    flat = _flat_labels(labels_by_head, n, n_head)
    ids = sorted(set(pred.tolist()))
    eligible = {c: min_size <= int((pred == c).sum()) <= max_size for c in ids}
    scored = eligible if any(eligible.values()) else {c: True for c in ids}
    out = []
    for c in ids:
        members = np.flatnonzero(pred == c)
        others = np.flatnonzero(pred != c)
        composition: dict[str, int] = {}
        for f in members:
            if int(f) in flat:
                composition[flat[int(f)]] = composition.get(flat[int(f)], 0) + 1
        n_classified = sum(composition.values())
        purity = max(composition.values()) / n_classified if n_classified else 0.0
        block = a[np.ix_(members, members)]
        iu = np.triu_indices(len(members), 1)
        within = float(block[iu].mean()) if len(members) > 1 else 0.0
        outside = float(a[np.ix_(members, others)].mean()) if len(others) else 0.0
        isolation = within / max(outside, ISOLATION_FLOOR)
        size = len(members)
        score = purity * isolation * min(size, max_size) / max_size if scored[c] else None
        heads = tuple(divmod(int(f), n_head) for f in members)
        out.append(ClusterInfo(cluster=int(c), size=size, heads=heads, layers=tuple(sorted({l for l, _ in heads})),
                               composition=composition, n_classified=n_classified, purity=float(purity),
                               within_mean_J=within, outside_mean_J=outside, isolation_ratio=float(isolation),
                               combined_score=None if score is None else float(score), eligible=eligible[c]))
    return tuple(out)


def select_candidate(table: Sequence[ClusterInfo]) -> ClusterInfo:
    """The scored cluster with the highest combined score (the first one on ties)."""
    scored = [c for c in table if c.combined_score is not None]
    if not scored:
        raise HeadLabError("no cluster has a combined score; build the table with cluster_table first.")
    return max(scored, key=lambda c: c.combined_score)


@dataclass(frozen=True)
class CandidateSelection:
    """The candidate community and the table it was chosen from."""

    k: int
    n_init: int | None
    min_size: int
    max_size: int
    fallback: bool                        # no cluster within the size bounds: all clusters were scored
    clusters: tuple[ClusterInfo, ...]
    candidate: ClusterInfo
    cluster_labels: tuple[int, ...] = field(compare=False, default=())

    def to_json(self) -> dict:
        return {"k": self.k, "n_init": self.n_init, "min_size": self.min_size, "max_size": self.max_size,
                "fallback": self.fallback, "clusters": [c.to_json() for c in self.clusters],
                "candidate": self.candidate.to_json(), "cluster_labels": list(self.cluster_labels)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "CandidateSelection":
        return cls(k=int(data["k"]), n_init=data.get("n_init"), min_size=int(data["min_size"]), max_size=int(data["max_size"]),
                   fallback=bool(data["fallback"]), clusters=tuple(ClusterInfo.from_json(c) for c in data["clusters"]),
                   candidate=ClusterInfo.from_json(data["candidate"]),
                   cluster_labels=tuple(int(x) for x in data.get("cluster_labels", ())))


def propose_candidate(J: Any, labels_by_head: Mapping[Head, str], *, n_head: int, k: int = 12, n_init: int | None = 1,
                      min_size: int = 4, max_size: int = 12, random_state: int = 0,
                      cluster_labels: Any = None) -> CandidateSelection:
    """Cluster |J| into k communities (reference: n_init = 1 for this step) and pick the candidate.

    Pass cluster_labels to score an existing partition instead of clustering again.
    """
    labels = spectral_clusters(J, k, n_init=n_init, random_state=random_state) if cluster_labels is None \
        else np.asarray(cluster_labels).astype(np.int64)
    table = cluster_table(J, labels, labels_by_head, n_head=n_head, min_size=min_size, max_size=max_size)
    return CandidateSelection(k=int(k), n_init=n_init, min_size=min_size, max_size=max_size,
                              fallback=not any(c.eligible for c in table), clusters=table,
                              candidate=select_candidate(table), cluster_labels=tuple(int(x) for x in labels))


# ---------------------------------------------------------------- 5. route-conditional analysis (MoE)


def route_strata(router_weights: Any, K: int = 4, seed: int = 0, n_init: int = 10) -> np.ndarray:
    """Routing stratum [example] by k-means (scikit-learn) on the concatenated per-layer router softmax weights.

    router_weights: [example, layer * n_expert] at the query position.
    """
    from sklearn.cluster import KMeans

    if router_weights is None:
        raise HeadLabError("this model has no routers; route conditioning needs a mixture-of-experts model.")
    w = _numpy(router_weights)
    if w.ndim != 2 or w.size == 0:
        raise HeadLabError(f"router weights must be [example, layer * n_expert], got shape {tuple(w.shape)}; "
                           "route conditioning needs a mixture-of-experts model.")
    if not np.all(np.isfinite(w)):
        raise HeadLabError("router weights have NaN or infinite values; recompute them.")
    if isinstance(K, bool) or not isinstance(K, (int, np.integer)) or not 2 <= K <= w.shape[0]:
        raise HeadLabError(f"K = {K} strata is not possible with {w.shape[0]} examples; choose K between 2 and the number of examples.")
    km = KMeans(n_clusters=int(K), random_state=seed, n_init=n_init)
    return km.fit_predict(w).astype(np.int64)


@dataclass(frozen=True)
class StratumResult:
    """Best agreement with the supervised classes among the spectral clusterings of one stratum's J."""

    stratum: int
    n_examples: int
    best_k: int
    ari: float
    nmi: float
    purity: float
    n_constant_heads: int = 0

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "StratumResult":
        return cls(**dict(data))


@dataclass(frozen=True)
class RouteStatistic:
    """The route-conditional statistic: max (and mean) over strata of the best within-stratum ARI."""

    per_stratum: tuple[StratumResult, ...]
    max_ari: float
    mean_ari: float
    J_by_stratum: dict[int, np.ndarray] = field(compare=False, default_factory=dict, repr=False)  # not in JSON

    def to_json(self) -> dict:
        return {"per_stratum": [r.to_json() for r in self.per_stratum], "max_ari": self.max_ari, "mean_ari": self.mean_ari}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RouteStatistic":
        return cls(per_stratum=tuple(StratumResult.from_json(r) for r in data["per_stratum"]),
                   max_ari=float(data["max_ari"]), mean_ari=float(data["mean_ari"]))


def stratum_statistic(spins: Any, strata: Any, labels_by_head: Mapping[Head, str], ks: Sequence[int] = DEFAULT_KS, *,
                      n_head: int, C: float = DEFAULT_C, n_init: int | None = None, random_state: int = 0,
                      min_stratum_size: int | None = None, fit_method: str = "joint") -> RouteStatistic:
    """Fit one Ising model per stratum, cluster it for each k, keep the best ARI; statistic = max over strata.

    Heads whose spin is constant inside a stratum get zero couplings there (they cannot be fitted).
    A stratum with fewer examples than min_stratum_size (default: the number of heads) is an error.
    """
    s = _check_spins(spins, allow_constant=True, allow_few_samples=True, n_head=n_head)
    st = np.asarray(strata).astype(np.int64)
    if st.shape != (s.shape[0],):
        raise HeadLabError(f"strata must give one stratum per example ({s.shape[0]}), got shape {tuple(st.shape)}.")
    need = s.shape[1] if min_stratum_size is None else int(min_stratum_size)
    results, Js = [], {}
    for g in sorted(set(st.tolist())):
        rows = np.flatnonzero(st == g)
        if len(rows) < need:
            raise HeadLabError(f"stratum {g} has {len(rows)} examples, fewer than {need}; use fewer strata (smaller K) "
                               "or more examples.")
        fit = fit_ising_pseudolikelihood(s[rows], C=C, method=fit_method, constant="zero", n_head=n_head,
                                         allow_few_samples=True)
        scores = ari_by_k(fit.J, labels_by_head, ks, n_head=n_head, n_init=n_init, random_state=random_state)
        best = scores.metric(scores.best_k)
        results.append(StratumResult(stratum=int(g), n_examples=len(rows), best_k=scores.best_k, ari=best.ari, nmi=best.nmi,
                                     purity=best.purity, n_constant_heads=len(fit.constant_heads)))
        Js[int(g)] = fit.J
    aris = [r.ari for r in results]
    return RouteStatistic(per_stratum=tuple(results), max_ari=float(max(aris)), mean_ari=float(np.mean(aris)), J_by_stratum=Js)


def null_z(observed: float, null_values: Sequence[float]) -> float:
    """z = (observed - mean(null)) / std(null, ddof=0), the spread floored at 1e-9 (reference)."""
    v = np.asarray(null_values, dtype=np.float64)
    if v.size == 0:
        raise HeadLabError("the null distribution is empty; draw at least one random partition.")
    return float((observed - v.mean()) / max(float(v.std(ddof=0)), Z_STD_FLOOR))


PARTITIONS = ("matched", "reference")


def random_partition(n_examples: int, strata_sizes: Sequence[int], seed: int, partition: str = "matched") -> np.ndarray:
    """A random stratum label per example.

    "matched" (METHODS.md): a random permutation of strata with exactly the given sizes.
    "reference" (the reference code): uniform labels RandomState(seed).randint(0, K, n_examples),
    whose sizes only match on average (reproduces the published null's group sizes for seeds 0..9).
    """
    sizes = [int(x) for x in strata_sizes]
    if partition not in PARTITIONS:
        raise HeadLabError(f"unknown partition {partition!r}; use one of {', '.join(PARTITIONS)}.")
    if len(sizes) < 2 or min(sizes) < 1:
        raise HeadLabError(f"need at least 2 non-empty strata, got sizes {sizes}.")
    rs = np.random.RandomState(seed)
    if partition == "reference":
        return rs.randint(0, len(sizes), n_examples).astype(np.int64)
    if sum(sizes) != n_examples:
        raise HeadLabError(f"strata sizes {sizes} add up to {sum(sizes)}, not the {n_examples} examples.")
    return rs.permutation(np.repeat(np.arange(len(sizes)), sizes)).astype(np.int64)


@dataclass(frozen=True)
class RouteNull:
    """The random-partition null of the route-conditional statistic, and the observed z-scores."""

    partition: str
    seeds: tuple[int, ...]
    null_max: tuple[float, ...]
    null_mean: tuple[float, ...]
    null_max_mean: float
    null_max_std: float                      # ddof = 0
    null_mean_mean: float
    null_mean_std: float
    observed_max: float | None = None
    observed_mean: float | None = None
    z_max: float | None = None
    z_mean: float | None = None
    p_max_exceed: float | None = None        # share of null draws >= observed
    p_mean_exceed: float | None = None
    draws: tuple[RouteStatistic, ...] = field(compare=False, default=(), repr=False)

    def to_json(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "draws"}
        d["seeds"], d["null_max"], d["null_mean"] = list(self.seeds), list(self.null_max), list(self.null_mean)
        d["draws"] = [r.to_json() for r in self.draws]
        return d

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RouteNull":
        d = dict(data)
        d["seeds"] = tuple(int(x) for x in d["seeds"])
        d["null_max"] = tuple(float(x) for x in d["null_max"])
        d["null_mean"] = tuple(float(x) for x in d["null_mean"])
        d["draws"] = tuple(RouteStatistic.from_json(r) for r in d.get("draws", ()))
        return cls(**d)


def summarize_null(null_max: Sequence[float], null_mean: Sequence[float], *, partition: str, seeds: Sequence[int],
                   observed_max: float | None = None, observed_mean: float | None = None,
                   draws: Sequence[RouteStatistic] = ()) -> RouteNull:
    """Null mean / std (ddof=0), z-scores and exceedance shares from the per-draw statistics."""
    vmax, vmean = np.asarray(null_max, dtype=np.float64), np.asarray(null_mean, dtype=np.float64)
    z_max = null_z(observed_max, vmax) if observed_max is not None else None
    z_mean = null_z(observed_mean, vmean) if observed_mean is not None else None
    return RouteNull(partition=partition, seeds=tuple(int(x) for x in seeds), null_max=tuple(vmax.tolist()),
                     null_mean=tuple(vmean.tolist()), null_max_mean=float(vmax.mean()), null_max_std=float(vmax.std(ddof=0)),
                     null_mean_mean=float(vmean.mean()), null_mean_std=float(vmean.std(ddof=0)),
                     observed_max=observed_max, observed_mean=observed_mean, z_max=z_max, z_mean=z_mean,
                     p_max_exceed=None if observed_max is None else float((vmax >= observed_max).mean()),
                     p_mean_exceed=None if observed_mean is None else float((vmean >= observed_mean).mean()),
                     draws=tuple(draws))


def random_partition_null(spins: Any, strata_sizes: Sequence[int], labels_by_head: Mapping[Head, str],
                          ks: Sequence[int] = DEFAULT_KS, *, n_head: int, n_null: int = 10, seed: int = 0,
                          partition: str = "matched", observed: RouteStatistic | None = None, C: float = DEFAULT_C,
                          n_init: int | None = None, min_stratum_size: int | None = None) -> RouteNull:
    """The same per-stratum pipeline on n_null random partitions (seeds seed, seed+1, ...), and z of the observed statistic."""
    if n_null < 1:
        raise HeadLabError(f"n_null = {n_null}; draw at least one random partition (reference: 10).")
    s = _numpy(spins)
    seeds = [seed + d for d in range(n_null)]
    draws = []
    for sd in seeds:
        labels = random_partition(s.shape[0], strata_sizes, sd, partition)
        draws.append(stratum_statistic(s, labels, labels_by_head, ks, n_head=n_head, C=C, n_init=n_init,
                                       min_stratum_size=min_stratum_size))
    return summarize_null([d.max_ari for d in draws], [d.mean_ari for d in draws], partition=partition, seeds=seeds,
                          observed_max=None if observed is None else observed.max_ari,
                          observed_mean=None if observed is None else observed.mean_ari,
                          draws=[RouteStatistic(per_stratum=d.per_stratum, max_ari=d.max_ari, mean_ari=d.mean_ari) for d in draws])


# ---------------------------------------------------------------- known Ising models (tests, bench)


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
    import networkx as nx

    J = _numpy(J)
    h = _numpy(h)
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
        from threadpoolctl import threadpool_limits

        t0 = time.perf_counter()
        with threadpool_limits(limits=1):  # small matrix products: one thread is fastest on shared cores
            spins = gibbs_sample(J_true, h_true, n_samples, seed)
        gibbs_s = time.perf_counter() - t0
        _check_spins(spins)
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
