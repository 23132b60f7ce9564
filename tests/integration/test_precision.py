"""Half precision against float32 on the quick zoo's induction-neox (final checkpoint, probe N = 256, T = 64).

The same batch is run with the model loaded in float32, bfloat16 and float16; HeadStats must be
float32 whatever the model's dtype, and PR, selectivity and the ablation deltas must stay within
the bounds below. Measured on this machine (CPU, torch 2.13), float16 / bfloat16 against float32:

- entropy PR (the default), every head: max |dPR| 5.0e-4 / 8.6e-3 (PR spans 1.0 .. 7.3);
- classic PR, the 12 heads whose output varies (spread/|mean| >= 0.05): max |dPR| 8.0e-4 / 6.9e-3.
  The other 24 heads, which the training's L1 penalty switched off (spread/|mean| <= 0.03, most
  ~3e-4: below half precision's resolution), have a classic (centred) PR of rounding noise in half
  precision (up to 1.9 / 2.4 away), so they are not bounded; the entropy PR does not centre and is;
- selectivity (random baseline) and membership selectivity (uniform baseline), every pattern and
  head: max |dS| / max(S, 1) 4.7e-3 / 1.4e-2 (S up to 56x);
- zero ablation of the float32 circuit (L1H1,L1H2,L1H3,L1H6,L1H8), 5 matched-random controls and
  the upper bound, largest |d delta| over candidate, controls and upper bound: loss 2.4e-4 / 4.9e-3
  nats (delta +5.59), target logit 2.0e-3 / 4.1e-3 (delta -11.5), top-1 0 / 7.8e-3 and top-5
  0 / 3.9e-3 (2 and 1 of 256 examples flip in bfloat16); mean ablation of the circuit: loss delta
  2.3e-4 / 4.8e-3 (delta +5.53). On an AMD EPYC (AVX2, no bfloat16 instructions; its own zoo's circuit
  is the same five heads, loss delta +5.49, target logit -11.3) the target logit moved 3.3e-3 / 1.7e-2,
  every other figure within the bounds below.

Attribution patching runs its forward and backward in float32 whatever the model's dtype (the
weights cast up and back, bit-identical after): on the built-in counterfactual (N = 64, T = 64),
float16 / bfloat16 against float32, every head's score (clean 1, corrupted 0): max |d| 3.4e-5 /
7.4e-5; activation patching, which runs in the model's dtype, 1.9e-4 / 1.6e-3.
The pattern screen reads the float32 summaries whenever the stored rows are float16 (probes above
2^24 attention entries): its selectivity is then exactly the summaries' selectivity, and the null
(whose random single-key targets need the rows) is over the float32 denominator.

Bounds are those figures with a margin (float16 about 4x, bfloat16 about 3x, a few examples for the
top-k rates). z-scores are not bounded: the controls barely move this model, so their spread (and
so z) is itself at rounding level.
"""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import pytest
import torch

from core.ablation.engine import run_conditions
from core.ablation.patching import PatchSettings, activation_patching, attribution_patching
from core.ablation.spec import Ablation
from core.ablation.study import AblationSettings, ablation_study
from core.model.hooks import model_dtype
from core.model.loading import load_model
from core.model.refs import ModelRef, list_checkpoints, weights_fingerprint
from core.pipelines.recipe import screen_checkpoint
from core.probe import HEADSTATS_KIND, HEADSTATS_VERSION, HeadStats, collect_head_stats, head_stats, head_stats_key
from core.stats.inference import METRICS
from core.stats.spectral import pr_per_head
from core.store import cache_key, canonical_json
from core.tasks import InductionCounterfactualSpec, InductionProbeSpec

pytestmark = pytest.mark.zoo

MODEL = "induction-neox"
HALF = ("float16", "bfloat16")
# dtype -> bound; see the module docstring for what was measured
PR_ENTROPY = {"float16": 2e-3, "bfloat16": 3e-2}
PR_CLASSIC_LIVE = {"float16": 3e-3, "bfloat16": 2e-2}
LIVE_SPREAD = 0.05  # spread / |mean| of a head's output above which half precision resolves it
SELECTIVITY_REL = {"float16": 2e-2, "bfloat16": 5e-2}
DELTA = {  # metric -> dtype -> bound on |delta(half) - delta(float32)|
    "loss": {"float16": 1e-3, "bfloat16": 1.5e-2},
    "target_logit": {"float16": 8e-3, "bfloat16": 5e-2},
    "top1": {"float16": 4 / 256, "bfloat16": 8 / 256},
    "top5": {"float16": 4 / 256, "bfloat16": 8 / 256},
}
MEAN_LOSS_DELTA = {"float16": 1e-3, "bfloat16": 1.5e-2}
ATTRIBUTION = {"float16": 1.5e-4, "bfloat16": 3e-4}  # |d score|, clean 1 / corrupted 0 scale
ACTIVATION = {"float16": 1e-3, "bfloat16": 6e-3}
NULL_REL_FLOAT16_ROWS = 2e-3  # float16 rows: relative rounding 2^-11 per entry, means of many


@pytest.fixture(scope="module")
def runs(quick_zoo):
    """dtype -> (HeadStats, screen, ablation study, mean-ablation loss delta), all on the same batch."""
    torch.set_num_threads(1)
    ref = ModelRef(MODEL, "zoo")
    revision = list_checkpoints(ref)[-1].revision
    batch = InductionProbeSpec(n_examples=256, seq_len=64, token_low=0, token_high=256, seed=42).build()
    out, circuit = {}, None
    for dtype in ("float32",) + HALF:
        model = load_model(ref, revision, dtype=dtype)
        assert model_dtype(model) == getattr(torch, dtype)
        stats = collect_head_stats(model, batch)
        screen = screen_checkpoint(stats, n_null_draws=0)
        if circuit is None:  # the float32 circuit, ablated in every dtype
            circuit = screen.induction_heads
            assert len(circuit) > 0
        study = ablation_study(model, batch, circuit, AblationSettings(n_controls=5, n_boot=100))
        clean, (mean,) = run_conditions(model, batch, [Ablation(circuit, mode="mean")])
        out[dtype] = {"stats": stats, "screen": screen, "study": study,
                      "mean_loss_delta": float(mean.delta(clean, "loss").mean())}
    return out


def test_head_stats_are_float32_whatever_the_model_dtype(runs):
    for dtype, run in runs.items():
        stats = run["stats"]
        assert stats.dtype == dtype
        for name, tensor in stats.to_tensors().items():
            if tensor.is_floating_point():
                assert tensor.dtype == torch.float32, (dtype, name)
        assert run["study"].provenance["dtype"] == dtype


@pytest.mark.parametrize("dtype", HALF)
def test_pr_within_bounds(runs, dtype):
    z32, z = runs["float32"]["stats"].z_query, runs[dtype]["stats"].z_query  # [example, layer, head, d_head]
    entropy = np.abs(pr_per_head(z, "entropy") - pr_per_head(z32, "entropy"))  # [layer, head]
    assert entropy.max() <= PR_ENTROPY[dtype]
    z64 = z32.double()
    spread = z64.std(0).norm(dim=-1) / z64.mean(0).norm(dim=-1)  # [layer, head]
    live = (spread >= LIVE_SPREAD).numpy()
    assert 10 <= live.sum() < live.size  # the bound covers the live heads, and some heads are off
    classic = np.abs(pr_per_head(z, "classic") - pr_per_head(z32, "classic"))
    assert classic[live].max() <= PR_CLASSIC_LIVE[dtype]


@pytest.mark.parametrize("dtype", HALF)
def test_selectivity_within_bounds(runs, dtype):
    ref, got = runs["float32"]["screen"], runs[dtype]["screen"]
    for name in ("selectivity", "membership_selectivity"):
        expected, actual = np.asarray(getattr(ref, name)), np.asarray(getattr(got, name))  # [pattern, layer, head]
        rel = np.abs(actual - expected) / np.maximum(np.abs(expected), 1.0)
        assert rel.max() <= SELECTIVITY_REL[dtype], name
    assert got.induction_heads == ref.induction_heads


@pytest.mark.parametrize("dtype", HALF)
def test_ablation_deltas_within_bounds(runs, dtype):
    ref, got = runs["float32"]["study"].stats, runs[dtype]["study"].stats
    for metric in METRICS:
        bound = DELTA[metric][dtype]
        assert abs(got[metric]["candidate_delta"] - ref[metric]["candidate_delta"]) <= bound, metric
        assert abs(got[metric]["upper_bound_delta"] - ref[metric]["upper_bound_delta"]) <= bound, metric
        controls = np.abs(np.subtract(got[metric]["control_deltas"], ref[metric]["control_deltas"]))
        assert controls.max() <= bound, metric
    assert runs[dtype]["study"].verdicts["recipe"].label == runs["float32"]["study"].verdicts["recipe"].label
    assert abs(runs[dtype]["mean_loss_delta"] - runs["float32"]["mean_loss_delta"]) <= MEAN_LOSS_DELTA[dtype]


def test_cache_key_names_the_dtype_only_when_not_float32(quick_zoo):
    ref = ModelRef(MODEL, "zoo")
    checkpoint = list_checkpoints(ref)[-1]
    spec = InductionProbeSpec(n_examples=16, seq_len=32, token_low=0, token_high=256, seed=1517)
    batch = spec.build()
    # float32: the key entries were stored under before the dtype existed
    before = cache_key(HEADSTATS_KIND, canonical_json(ref.to_json()), checkpoint.revision, dict(batch.spec),
                       HEADSTATS_VERSION, {"weights": weights_fingerprint(ref, checkpoint.revision)})
    assert head_stats_key(ref, checkpoint.revision, dict(batch.spec)) == before
    assert head_stats_key(ref, checkpoint.revision, dict(batch.spec), torch.float32) == before
    keys = {d: head_stats_key(ref, checkpoint.revision, dict(batch.spec), d) for d in ("float32",) + HALF}
    assert len(set(keys.values())) == 3
    # a float16 pass is cached under its own key and read back as float16 statistics
    computed = head_stats(ref, checkpoint, batch, dtype="float16")
    statuses: list[str] = []
    again = head_stats(ref, checkpoint, batch, dtype="float16", on_status=statuses.append)
    assert statuses == ["cached"] and again.dtype == computed.dtype == "float16"
    assert torch.equal(again.z_query, computed.z_query) and again.z_query.dtype == torch.float32
    assert head_stats(ref, checkpoint, batch).dtype == "float32"  # float32 is not the float16 entry
    # an entry written before the dtype field reads back as float32
    meta = {k: v for k, v in again.to_json().items() if k != "dtype"}
    assert HeadStats.from_tensors(again.to_tensors(), meta).dtype == "float32"
    assert "dtype" in {f.name for f in fields(HeadStats)}


@pytest.fixture(scope="module")
def patching_runs(quick_zoo):
    """dtype -> (attribution, activation patching) on one counterfactual; weights checked unchanged after."""
    torch.set_num_threads(1)
    ref = ModelRef(MODEL, "zoo")
    revision = list_checkpoints(ref)[-1].revision
    pair = InductionCounterfactualSpec(InductionProbeSpec(n_examples=64, seq_len=64, token_low=0, token_high=256,
                                                          seed=42)).build()
    out = {}
    for dtype in ("float32",) + HALF:
        model = load_model(ref, revision, dtype=dtype)
        before = [p.detach().clone() for p in model.parameters()]
        attribution = attribution_patching(model, pair, PatchSettings())
        after = list(model.parameters())
        assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(after, before))  # restored exactly
        out[dtype] = (attribution, activation_patching(model, pair, PatchSettings()))
    return out


@pytest.mark.parametrize("dtype", HALF)
def test_patching_in_half_precision_within_bounds(patching_runs, dtype):
    (attr32, act32), (attr, act) = patching_runs["float32"], patching_runs[dtype]
    assert attr.provenance["gradient_dtype"] == "float32" and attr.provenance["dtype"] == dtype
    assert np.abs(attr.scores - attr32.scores).max() <= ATTRIBUTION[dtype]
    assert np.abs(act.scores - act32.scores).max() <= ACTIVATION[dtype]
    assert attr.gap["gap_ok"] and act.gap["gap_ok"]  # a trained model's counterfactual passes the gap rule


def test_screen_on_float16_rows_reads_the_float32_summaries(runs):
    """Rows stored in float16 (as above 2^24 entries): selectivity from the float32 summaries, null within bounds."""
    stats = runs["float32"]["stats"]
    assert stats.attn_query is not None and stats.attn_query.dtype == torch.float32
    rows32 = screen_checkpoint(stats, n_null_draws=100)
    half = screen_checkpoint(replace(stats, attn_query=stats.attn_query.half()), n_null_draws=100)
    summaries = screen_checkpoint(replace(stats, attn_query=None), n_null_draws=0)
    np.testing.assert_array_equal(half.selectivity, summaries.selectivity)
    np.testing.assert_array_equal(half.membership_selectivity, summaries.membership_selectivity)
    np.testing.assert_allclose(half.selectivity, rows32.selectivity, rtol=1e-5)  # summaries = float32 rows' sums
    rel = np.abs(half.null - rows32.null) / np.maximum(np.abs(rows32.null), 1.0)
    assert rel.max() <= NULL_REL_FLOAT16_ROWS
    assert half.induction_heads == rows32.induction_heads
