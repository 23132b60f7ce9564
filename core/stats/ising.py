"""Co-activation proposal [CVC], step 2: a pairwise Ising model of the spins by pseudolikelihood.

For each head i an L2 logistic regression of s_i on all other spins, C = 1000 on the summed
log-loss with an unpenalised intercept (the reference's per-spin scikit-learn fit); J = coef / 2
symmetrized with zero diagonal, h = intercept / 2 (METHODS.md, "Co-activation"). The N regressions
are independent, so HeadLab solves them together (`fit_ising_pseudolikelihood`, a batched inexact
Newton method) and keeps the per-spin scikit-learn fit (`fit_ising_sklearn`) as the reference.

Spins come from core.stats.spins; clusters of |J| are core.stats.clusters; per-stratum fits and
their null are core.stats.routes; the speed benchmark is core.bench.ising.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from threadpoolctl import threadpool_limits

from core.choices import ISING_C as DEFAULT_C
from core.errors import HeadLabError
from core.results import JsonResult
from core.stats.spins import as_array, check_spins, constant_heads



@dataclass(frozen=True, eq=False)  # array fields: compare fits by their arrays, not ==
class IsingFit(JsonResult):
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


def check_converged(fit: IsingFit, what: str, allow_unconverged: bool = False) -> None:
    """Refuse to cluster a fit that did not converge: its J is wherever the iterations stopped, not the optimum.

    allow_unconverged: go on anyway (the result then carries converged False, and the CLI says so).
    """
    if fit.converged or allow_unconverged:
        return
    raise HeadLabError(f"{what} did not converge in {fit.n_iter} iterations ({fit.method}); its couplings are not "
                       "the fit's optimum, so clusters of them mean little. Use more examples, a smaller C (stronger "
                       "L2), or cluster it anyway with allow_unconverged (--allow-unconverged).")


def couplings_from_coef(coef: Any, intercept: Any) -> tuple[np.ndarray, np.ndarray]:
    """J = (coef / 2 + its transpose) / 2 with zero diagonal, h = intercept / 2 (reference convention)."""
    w = as_array(coef)
    J = w / 2.0
    J = (J + J.T) / 2.0
    np.fill_diagonal(J, 0.0)
    return J, as_array(intercept) / 2.0


def penalised_objective(spins: Any, coef: Any, intercept: Any, C: float = DEFAULT_C, *, per_spin: bool = False):
    """Sum over spins i of C * sum_m logloss(s_i^m | s_-i^m) + 0.5 * ||coef_i||^2 (intercept unpenalised).

    This is exactly what scikit-learn's LogisticRegression(C) minimises for each spin; coef's diagonal
    is ignored (spin i does not predict itself).
    """
    s = torch.as_tensor(as_array(spins))
    w = torch.as_tensor(as_array(coef)).clone()
    w.fill_diagonal_(0.0)
    b = torch.as_tensor(as_array(intercept))
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
    s = check_spins(spins, allow_constant=constant == "zero", allow_few_samples=allow_few_samples, n_head=n_head)
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
    s = check_spins(spins, allow_few_samples=True)
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
