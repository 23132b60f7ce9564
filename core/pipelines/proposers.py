"""Proposers vs disposer: four ways to propose a circuit, one closure test to judge them all.

Each method proposes a head set on the same model, checkpoint and probe batch. `PROPOSERS` is the one
registry of them (name, summary, function of `ProposalInputs`), read by the command line, the page and
the report; a new proposer is one entry there.

- "spectral":      the top heads by PR-integral (Step 1 of [SPC]);
- "pattern screen": the heads at or above the induction membership threshold (Step 2 of [SPC]);
- "co-activation": the candidate Ising community ([CVC]), when core.pipelines.coactivation can propose one;
- "gradient":      the heads with the largest loss gradient on the probe ([HHG]'s G, the paper's
                   normalised W_V + W_O block norm, at the query position of the probe batch).

The spectral and gradient proposals take as many heads as the pattern-screen circuit (or `size`
when given), so proposals of equal size compete. Every proposal is then ablated with the same
ablation engine, the same number and kind of random controls (any-layer by default, since the
proposals sit in different layers) and the same seed, and judged by the same closure rules
(METHODS.md "Closure test"). A proposal that cannot be made (no co-activation candidate, an
empty screen) is listed with its reason, never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch

from core.ablation.study import AblationSettings, ablation_study
from core.choices import PROPOSER_CONTROLS as DEFAULT_CONTROLS, PROPOSER_SUMMARIES
from core.errors import HeadLabError
from core.executor import Executor
from core.heads import HeadSet, head_name, parse_heads
from core.model.loading import DEFAULT_DTYPE, dtype_name, load_hf_model, load_model
from core.model.refs import resolve_checkpoint
from core.pipelines.attribution_measures import block_norms, component_blocks
from core.pipelines.attribution_results import component_name
from core.pipelines.coactivation import CoactivationSettings, coactivation
from core.pipelines.recipe import screen
from core.results import JsonResult

# The one closure test every proposal gets: any-layer controls (the proposals sit in different layers),
# no upper bound, a short bootstrap (the verdicts read z and the control range, not the interval).
DISPOSER = AblationSettings(n_controls=DEFAULT_CONTROLS, controls="any-layer", include_upper_bound=False, n_boot=200)
DEFAULT_SIZE_WHEN_SCREEN_EMPTY = 4


@dataclass(frozen=True)
class CircuitProposal:
    """One method's proposed circuit, or the reason it proposes none (heads empty); heads written as names in JSON."""

    method: str
    heads: HeadSet
    rationale: str

    def to_json(self) -> dict:
        return {"method": self.method, "heads": [head_name(h) for h in self.heads], "rationale": self.rationale}

    @classmethod
    def from_json(cls, data: dict) -> "CircuitProposal":
        heads = parse_heads(", ".join(data["heads"])) if data["heads"] else HeadSet.of(())
        return cls(data["method"], heads, data["rationale"])


@dataclass(frozen=True)
class Disposal(JsonResult):
    """The closure test of one proposal: per-metric candidate delta, control mean/std, rank and p among the
    controls, z; verdicts."""

    proposal: CircuitProposal
    metrics: dict            # metric -> {"candidate_delta", "control_mean", "control_std", "rank", "p", "n_controls", "z"}
    verdict_paper: str       # "pass" | "fail" | "fails in the wrong direction" | "not tested"
    verdict_reference: str
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class ProposersReport(JsonResult):
    """All proposals on one model and checkpoint, each disposed by the same closure test."""

    disposals: tuple[Disposal, ...]
    provenance: dict

    def survivors(self) -> tuple[str, ...]:
        return tuple(d.proposal.method for d in self.disposals if d.verdict_paper == "pass")

    def rows(self) -> list[dict]:
        """One flat row per proposal, for tables and CSV export."""
        out = []
        for d in self.disposals:
            row = {"method": d.proposal.method, "heads": ", ".join(head_name(h) for h in d.proposal.heads),
                   "size": len(d.proposal.heads), "verdict (paper)": d.verdict_paper,
                   "verdict (reference)": d.verdict_reference}
            for metric, figures in d.metrics.items():
                row[f"delta {metric}"] = figures.get("candidate_delta")
                row[f"z {metric}"] = figures.get("z")
            row["rationale"] = d.proposal.rationale
            out.append(row)
        return out

    def to_json(self) -> dict:
        """The fields and, for readers of the file, the survivors (from_json ignores them)."""
        return {**super().to_json(), "survivors": list(self.survivors())}


# ---------------------------------------------------------------------------------------------
# The proposers
# ---------------------------------------------------------------------------------------------


def top_heads(values: np.ndarray, size: int) -> HeadSet:
    """The `size` heads with the largest values ([layer, head]); ties broken by position (stable)."""
    values = np.asarray(values, dtype=np.float64)  # [layer, head]
    if values.ndim != 2:
        raise HeadLabError("top_heads needs a [layer, head] array.")
    if not 1 <= size <= values.size:
        raise HeadLabError(f"a proposal of {size} heads is impossible on a model with {values.size} heads; pick 1..{values.size}.")
    order = np.argsort(-values.ravel(), kind="stable")[:size]
    n_heads = values.shape[1]
    return HeadSet.of((int(f) // n_heads, int(f) % n_heads) for f in order)


def probe_gradient_magnitudes(hf_model: Any, tokens: torch.Tensor, query_pos: torch.Tensor, target: torch.Tensor,
                              batch_size: int = 64) -> np.ndarray:
    """[HHG]'s G on an induction-style probe: [layer, head] float64.

    The loss is the cross-entropy of the target at the query position; G of a head is the Frobenius
    norm of that loss's gradient over the head's W_V rows and W_O columns together, divided by the
    square root of their parameter count (the paper's default), averaged over batches of the probe.
    tokens: [example, pos]; query_pos, target: [example].
    """
    blocks = component_blocks(hf_model)
    heads = [component_name(layer, h) for layer in range(blocks.n_layers) for h in range(blocks.n_heads)]
    params = list({id(p.param): p.param for name in heads for p in blocks.paper[name]}.values())
    device = next(hf_model.parameters()).device
    was_training = hf_model.training
    hf_model.eval()
    saved = [p.requires_grad for p in params]
    total, n_batches = np.zeros(len(heads)), 0
    try:
        for p in params:
            p.requires_grad_(True)
        for start in range(0, tokens.shape[0], batch_size):
            rows = slice(start, start + batch_size)
            toks = tokens[rows].to(device)
            q = query_pos[rows].to(device)
            with torch.enable_grad():
                logits = hf_model(toks).logits  # [batch, pos, vocab]
                logits_q = logits[torch.arange(toks.shape[0], device=device), q].float()
                loss = torch.nn.functional.cross_entropy(logits_q, target[rows].to(device))
                grads = torch.autograd.grad(loss, params, allow_unused=True)
            by_id = {id(p): (torch.zeros_like(p) if g is None else g.detach()) for p, g in zip(params, grads)}
            total += block_norms(blocks.paper, by_id, heads, normalise=True)
            n_batches += 1
    finally:
        for p, flag in zip(params, saved):
            p.requires_grad_(flag)
        hf_model.train(was_training)
    return (total / max(n_batches, 1)).reshape(blocks.n_layers, blocks.n_heads)


def spectral_proposal(report: Any, size: int) -> CircuitProposal:
    """Top heads by PR-integral (report: recipe.ScreenReport); none, with the reason, when the model has no
    checkpoint trajectory (e.g. a released model with one checkpoint)."""
    if report.spectral is None:
        return CircuitProposal("spectral", HeadSet.of(()), f"no PR-integral: {report.spectral_note}")
    heads = top_heads(report.spectral.integral, size)
    return CircuitProposal("spectral", heads, f"top {size} heads by PR-integral ({report.spectral.definition} PR, "
                                       f"{report.spectral.rule} rule over {len(report.checkpoints)} checkpoints)")


def screen_proposal(report: Any) -> CircuitProposal:
    """The candidate induction circuit of the pattern screen at the final checkpoint."""
    threshold = report.final.induction_threshold
    heads = report.candidate_circuit
    why = f"induction selectivity >= {threshold:.3g}x (uniform baseline) at the final checkpoint"
    return CircuitProposal("pattern screen", heads, why if len(heads) else f"no head reaches {threshold:.3g}x: nothing to propose")


def gradient_proposal(grad: np.ndarray, size: int) -> CircuitProposal:
    return CircuitProposal("gradient", top_heads(grad, size),
                           f"top {size} heads by probe-loss gradient norm (W_V + W_O block / sqrt(count), [HHG] default)")


def coactivation_proposal(ref: Any, revision: str, spec: Any, device: str = "cpu",
                          dtype: str = DEFAULT_DTYPE) -> CircuitProposal:
    """The co-activation candidate community, or an empty proposal saying why there is none."""
    try:
        report = coactivation(ref, revision, spec, CoactivationSettings(run_closure=False), device=device, dtype=dtype)
    except HeadLabError as exc:
        return CircuitProposal("co-activation", HeadSet.of(()), f"no community: {exc}")
    summary = report.summary()
    why = (f"candidate Ising community (k = {summary['k']}, {summary['k_rule']}; purity {summary['purity']:.2f}, "
           f"isolation {summary['isolation']:.2f}), default co-activation settings")
    return CircuitProposal("co-activation", report.candidate, why)


# ---------------------------------------------------------------------------------------------
# The registry: the one list of proposers the command line, the page and the report read
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProposalInputs:
    """What every proposer may read, computed once per run: the screen report (recipe.ScreenReport), the
    probe-loss gradient per head ([layer, head] float), the proposal size and where the model runs."""

    ref: Any
    revision: str
    spec: Any
    size: int
    screen_report: Any
    gradient: np.ndarray
    device: str = "cpu"
    dtype: str = DEFAULT_DTYPE


@dataclass(frozen=True)
class Proposer:
    """One way to propose a circuit: its name (shown everywhere), one line on what it ranks, and the function."""

    name: str
    summary: str
    propose: Callable[[ProposalInputs], CircuitProposal]


PROPOSERS: tuple[Proposer, ...] = (
    Proposer("spectral", PROPOSER_SUMMARIES["spectral"],
             lambda x: spectral_proposal(x.screen_report, x.size)),
    Proposer("pattern screen", PROPOSER_SUMMARIES["pattern screen"],
             lambda x: screen_proposal(x.screen_report)),
    Proposer("co-activation", PROPOSER_SUMMARIES["co-activation"],
             lambda x: coactivation_proposal(x.ref, x.revision, x.spec, device=x.device, dtype=x.dtype)),
    Proposer("gradient", PROPOSER_SUMMARIES["gradient"],
             lambda x: gradient_proposal(x.gradient, x.size)),
)
PROPOSER_NAMES = tuple(proposer.name for proposer in PROPOSERS)


# ---------------------------------------------------------------------------------------------
# The disposer
# ---------------------------------------------------------------------------------------------


def dispose(model: Any, batch: Any, proposal: CircuitProposal, settings: AblationSettings = DISPOSER) -> Disposal:
    """Ablate one proposal against random controls (settings: DISPOSER, or a variant) and apply both closure rules."""
    if len(proposal.heads) == 0:
        return Disposal(proposal, {}, "not tested", "not tested", (proposal.rationale,))
    result = ablation_study(model, batch, proposal.heads, settings)
    metrics = {m: {k: s.get(k) for k in ("candidate_delta", "control_mean", "control_std", "rank", "p", "n_controls", "z")}
               for m, s in result.stats.items()}
    paper, reference = result.verdicts["closure_paper"], result.verdicts["closure_reference"]
    return Disposal(proposal, metrics, paper.label, reference.label, tuple(paper.reasons) + tuple(result.notes))


def proposers_vs_disposer(ref: Any, revision: Optional[str], spec: Any, size: Optional[int] = None,
                          disposer: AblationSettings = DISPOSER, device: str = "cpu",
                          progress: Optional[Callable[[str], None]] = None,
                          dtype: str = DEFAULT_DTYPE, executor: Optional[Executor] = None) -> ProposersReport:
    """Propose with all four methods on one checkpoint and dispose of each with the same closure test.

    disposer: that closure test's settings (DISPOSER, or e.g. `replace(DISPOSER, n_controls=5)`).
    device, dtype: where and in which precision the models run; executor: where the screen's passes over the
    checkpoints run (core/pipelines/sweep.py; the co-activation proposal then reads them from the cache).
    """
    say = progress or (lambda text: None)
    checkpoint = resolve_checkpoint(ref, revision)
    say("screening checkpoints (Steps 1-2)")
    report = screen(ref, spec, device=device, dtype=dtype, executor=executor)
    if report.checkpoints[-1].revision != checkpoint.revision:
        say(f"note: the spectral and screen proposals use the final checkpoint {report.checkpoints[-1].revision}")
    screen_prop = screen_proposal(report)
    if size is None:
        size = len(screen_prop.heads) or DEFAULT_SIZE_WHEN_SCREEN_EMPTY
    batch = spec.build()
    say("gradients of the probe loss")
    hf = load_hf_model(ref, checkpoint.revision, device=device, dtype=dtype)
    grad = probe_gradient_magnitudes(hf, batch.tokens, batch.query_pos, batch.target)
    del hf
    inputs = ProposalInputs(ref, checkpoint.revision, spec, int(size), report, grad, device, dtype)
    proposals = []
    for proposer in PROPOSERS:
        say(f"{proposer.name} proposal")
        proposals.append(proposer.propose(inputs))
    model = load_model(ref, checkpoint.revision, device=device, dtype=dtype)
    disposals = []
    for proposal in proposals:
        say(f"closure test of the {proposal.method} proposal")
        disposals.append(dispose(model, batch, proposal, disposer))
    provenance = {"model": ref.name, "revision": checkpoint.revision, "tokens": checkpoint.tokens,
                  "probe_spec": dict(batch.spec), "size": int(size), "n_controls": disposer.n_controls,
                  "controls": disposer.controls, "mode": disposer.mode, "control_seed": disposer.seed,
                  "dtype": dtype_name(dtype),
                  "closure_rules": "paper (z_logit < -1.8, all deltas damaging) and reference (outside the control range)",
                  "gradient": grad.tolist()}
    return ProposersReport(tuple(disposals), provenance)
