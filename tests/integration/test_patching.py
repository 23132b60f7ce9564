"""Patching on a hand-built attention-only model (tests/hand_model.py), where the answers are known exactly.

No norms and no MLPs: the residual at the query is its embedding plus every head's output there, so
denoising every head restores the clean run exactly, the logits are linear in the last layer's z
(attribution patching is exact there, and noising and denoising a last-layer head add up to 1),
and a route confined by hand to one subspace is the only way a sender's output can act.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from core.ablation.patching import PatchSettings, activation_patching, attribution_patching, group_patching, path_patching
from core.ablation.patching.activation import GroupPatching, measure_conditions
from core.ablation.patching.paths import PathPatching
import core.ablation.patching.runs as runs_module
from core.ablation.patching.runs import patched_run, run_chunks, z_patch_hooks
from core.errors import HeadLabError
from core.heads import HeadSet
from core.model.loading import load_model
from core.model.refs import ModelRef
from core.tasks import PatchPair, ProbeBatch
from core.tasks.counterfactual import InductionCounterfactualSpec
from core.tasks.specs import probe_spec
from tests.hand_model import HandModel, random_hand_model
from tests.tiny_models import save_tiny_model

N_LAYERS, N_HEADS, VOCAB, SEQ_LEN = 2, 2, 8, 10
EVERY_HEAD = HeadSet(tuple((l, h) for l in range(N_LAYERS) for h in range(N_HEADS)))
# allow_small_gap=True throughout: a random hand model's clean and corrupted runs differ by noise (the gap
# rule refuses that; test_the_gap_rule_refuses_a_noisy_pair checks it), and these tests check the mechanics.
LAST_LAYER = HeadSet(tuple((N_LAYERS - 1, h) for h in range(N_HEADS)))


def hand_pair(seed: int = 0, n: int = 6) -> PatchPair:
    """Random prompts whose corrupted twin differs at position 3; queries at 7..9, a distinct corrupted answer."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (n, SEQ_LEN), generator=gen)
    corrupted = tokens.clone()
    corrupted[:, 3] = (tokens[:, 3] + torch.randint(1, VOCAB, (n,), generator=gen)) % VOCAB
    target = torch.randint(0, VOCAB, (n,), generator=gen)
    batch = ProbeBatch(tokens=tokens, query_pos=torch.tensor([9, 8, 9, 7, 9, 8][:n]), target=target,
                       induction_pos=torch.full((n,), 4), duplicate_pos=torch.full((n,), 3), spec={"task": "hand"})
    return PatchPair(batch, corrupted, (target + 1) % VOCAB, {"task": "hand"})


@pytest.fixture(scope="module")
def model() -> HandModel:
    return random_hand_model(seed=1, n_layers=N_LAYERS, n_heads=N_HEADS, d_vocab=VOCAB, n_ctx=16)


def _scores(model, pair, heads_list, direction):
    measured = measure_conditions(model, pair, PatchSettings(allow_small_gap=True, direction=direction, batch_size=4),
                                  [(heads, None) for heads in heads_list])
    return measured.scores(measured.conditions)


def test_patching_a_run_into_itself_changes_nothing(model):
    pair = hand_pair()
    for direction in ("denoise", "noise"):
        settings = PatchSettings(allow_small_gap=True, direction=direction, batch_size=4, n_controls=1)
        assert activation_patching(model, pair, settings).identity_max_diff == 0.0
        assert path_patching(model, pair, HeadSet(((0, 0),)), HeadSet(((1, 1),)), "q,k,v", settings).identity_max_diff == 0.0
    same = PatchPair(pair.clean, pair.clean.tokens.clone(), pair.corrupted_target)
    with pytest.raises(HeadLabError, match="score the same"):
        activation_patching(model, same, PatchSettings(allow_small_gap=True, batch_size=4))


def test_denoising_every_head_recovers_fully_and_noising_it_breaks_fully(model):
    pair = hand_pair()
    every, last = _scores(model, pair, [EVERY_HEAD, LAST_LAYER], "denoise")
    assert every == pytest.approx(1.0, abs=1e-5)
    assert abs(last - 1.0) > 1e-3  # layer 0 also writes to the query directly
    assert _scores(model, pair, [EVERY_HEAD], "noise")[0] == pytest.approx(0.0, abs=1e-5)
    silent = random_hand_model(seed=1, n_layers=N_LAYERS, n_heads=N_HEADS, d_vocab=VOCAB, n_ctx=16)
    with torch.no_grad():
        silent.blocks[0].attn.W_O.zero_()  # layer 0 writes nothing: the last layer is all there is
    assert _scores(silent, pair, [LAST_LAYER], "denoise")[0] == pytest.approx(1.0, abs=1e-5)
    assert _scores(silent, pair, [LAST_LAYER], "noise")[0] == pytest.approx(0.0, abs=1e-5)


def test_noising_mirrors_denoising_for_last_layer_heads(model):
    """Linear readout: denoising head h adds c_h / gap to 0, noising it takes c_h / gap from 1."""
    pair = hand_pair()
    denoise = activation_patching(model, pair, PatchSettings(allow_small_gap=True, direction="denoise", batch_size=4)).scores
    noise = activation_patching(model, pair, PatchSettings(allow_small_gap=True, direction="noise", batch_size=4)).scores
    assert np.allclose(denoise[-1] + noise[-1], 1.0, atol=1e-5)
    assert np.all(np.sign(denoise[-1]) == -np.sign(noise[-1] - 1.0)) and np.all(np.abs(denoise[-1]) > 1e-3)


@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_attribution_patching_is_exact_where_the_metric_is_linear(model, direction):
    pair = hand_pair()
    settings = PatchSettings(allow_small_gap=True, direction=direction, per_position=True, batch_size=4)
    act = activation_patching(model, pair, settings)
    att = attribution_patching(model, pair, settings)
    assert att.clean_value == pytest.approx(act.clean_value, rel=1e-6)
    assert att.corrupted_value == pytest.approx(act.corrupted_value, rel=1e-6)
    assert np.allclose(att.scores[-1], act.scores[-1], atol=1e-5)
    assert np.allclose(att.position_scores[-1], act.position_scores[-1], atol=1e-5)
    assert np.allclose(att.position_scores.sum(axis=2) - (SEQ_LEN - 1) * (0.0 if direction == "denoise" else 1.0),
                       att.scores, atol=1e-5)  # each position's own step; they add up to the head's
    assert not np.allclose(att.scores[0], act.scores[0], atol=1e-4)  # through a softmax it is only first order
    with pytest.raises(HeadLabError, match="gradient"):
        attribution_patching(model, pair, PatchSettings(allow_small_gap=True, metric="top1"))


def route_model(seed: int = 0) -> HandModel:
    """Sender L0H0 writes only into dims 8..11, which only receiver L1H0's key reads; L0H1 writes into
    dims 12..15, which nothing reads. Tokens, positions, every other input and the unembedding use dims 0..7."""
    model = HandModel(n_layers=2, n_heads=2, d_model=16, d_head=4, d_vocab=VOCAB, n_ctx=16)
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen)

    with torch.no_grad():
        model.W_E[:, :8] = rand(VOCAB, 8)
        model.W_pos[:, :8] = rand(16, 8) * 0.5
        model.W_U[:8] = rand(8, VOCAB)
        for layer in range(2):
            attn = model.blocks[layer].attn
            for head in range(2):
                attn.W_Q[head, :8], attn.W_V[head, :8] = rand(8, 4), rand(8, 4)
                if (layer, head) != (1, 0):
                    attn.W_K[head, :8] = rand(8, 4)
        model.blocks[1].attn.W_K[0, 8:12] = rand(4, 4)  # the receiver's key reads the sender's subspace only
        model.blocks[0].attn.W_O[0, :, 8:12] = rand(4, 4)  # sender
        model.blocks[0].attn.W_O[1, :, 12:16] = rand(4, 4)  # a head nobody listens to
        model.blocks[1].attn.W_O[:, :, :8] = rand(2, 4, 8)
    return model.eval()


@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_path_patching_isolates_a_hand_built_route(direction):
    model, pair = route_model(), hand_pair(seed=2)
    settings = PatchSettings(allow_small_gap=True, direction=direction, batch_size=4, n_controls=1)
    sender, receiver, silent = HeadSet(((0, 0),)), HeadSet(((1, 0),)), HeadSet(((0, 1),))
    whole, unheard = _scores(model, pair, [sender, silent], direction)
    base = 0.0 if direction == "denoise" else 1.0
    assert abs(whole - base) > 1e-2 and unheard == pytest.approx(base, abs=1e-6)
    keys = path_patching(model, pair, sender, receiver, "k", settings)
    assert isinstance(keys, PathPatching)
    assert keys.score == pytest.approx(whole, abs=1e-5)  # the sender acts only through the receiver's key
    assert keys.control_sets.sets == (silent,) and keys.control_scores == pytest.approx((base,), abs=1e-6)
    for other in ("q", "v"):
        assert path_patching(model, pair, sender, receiver, other, settings).score == pytest.approx(base, abs=1e-6)
    assert PathPatching.from_json(keys.to_json()).score == keys.score


def test_group_patching_against_controls_and_bad_routes(model):
    pair = hand_pair()
    settings = PatchSettings(allow_small_gap=True, batch_size=4, n_controls=1)
    group = group_patching(model, pair, HeadSet(((1, 0),)), settings)
    single = activation_patching(model, pair, settings).scores
    assert group.score == pytest.approx(single[1, 0], abs=1e-6)
    assert group.control_sets.sets == (HeadSet(((1, 1),)),) and group.control_scores[0] == pytest.approx(single[1, 1], abs=1e-6)
    assert group.upper_bound_score == pytest.approx(_scores(model, pair, [LAST_LAYER], "denoise")[0], abs=1e-6)
    again = GroupPatching.from_json(group.to_json())
    assert again.selection == group.selection and again.stats == group.stats
    with pytest.raises(HeadLabError, match="before every receiver"):
        path_patching(model, pair, HeadSet(((1, 0),)), HeadSet(((1, 1),)), "k", settings)
    with pytest.raises(HeadLabError, match="q, k, v"):
        path_patching(model, pair, HeadSet(((0, 0),)), HeadSet(((1, 1),)), "x", settings)


def test_positions_that_cannot_reach_a_query_score_what_running_them_gives(model):
    """measure_conditions skips a position after every query and the last layer away from the queries;
    running those patches anyway leaves every query's metric where the base run has it."""
    pair = hand_pair()
    pair = PatchPair(replace(pair.clean, query_pos=torch.tensor([7, 8, 7, 6, 7, 8])), pair.corrupted_tokens,
                     pair.corrupted_target)
    settings = PatchSettings(allow_small_gap=True, batch_size=6)
    skipped = [(HeadSet(((0, 1),)), 9), (HeadSet(((1, 0),)), 5), (HeadSet(((1, 1),)), 9)]
    measured = measure_conditions(model, pair, settings, skipped)
    runs = next(run_chunks(model, pair, settings))
    for (heads, position), mean in zip(skipped, measured.conditions):
        values, _ = patched_run(model, runs, z_patch_hooks(runs.source_z, heads, position), settings.metric)
        assert float(values.double().mean()) == pytest.approx(mean, abs=1e-5)
        assert mean == pytest.approx(float(runs.base_values.double().mean()), abs=1e-6)
    reached = measure_conditions(model, pair, settings, [(HeadSet(((0, 1),)), 3), (HeadSet(((1, 1),)), 8)])
    assert np.all(np.abs(reached.conditions - float(runs.base_values.double().mean())) > 1e-4)  # these do act


def test_the_gap_rule_refuses_a_noisy_pair(model):
    """On a random hand model the clean-corrupted gap is noise: refused, with the spread; kept and flagged when forced."""
    pair = hand_pair()
    with pytest.raises(HeadLabError, match="more pairs, another metric"):
        activation_patching(model, pair, PatchSettings(batch_size=4))
    forced = activation_patching(model, pair, PatchSettings(batch_size=4, allow_small_gap=True))
    assert forced.gap["n_examples"] == 6 and forced.gap["gap_ok"] is False and forced.gap["gap_sd"] > 0
    assert forced.gap["gap_mean"] == pytest.approx(forced.clean_value - forced.corrupted_value)
    attr = attribution_patching(model, pair, PatchSettings(batch_size=4, allow_small_gap=True))
    assert attr.gap["gap_mean"] == pytest.approx(forced.gap["gap_mean"], abs=1e-5)


# ------------------------------------------------------------------ prefix reuse on Hugging Face models


@pytest.mark.parametrize("family", ["gpt_neox", "llama_gqa", "gemma3"])
def test_patched_runs_replayed_from_the_lowest_patched_layer_equal_full_forwards(family, tmp_path, monkeypatch):
    """Activation, group and path patching with the base run's blocks replayed from the lowest patched layer give
    the full forwards' scores (parallel residual, grouped-query attention, Gemma-3's sliding window and norms)."""
    model = load_model(ModelRef.parse(str(save_tiny_model(family, tmp_path, seed=3))))
    pair = InductionCounterfactualSpec(probe_spec("induction", n_examples=6, seq_len=10), seed=0).build()
    settings = PatchSettings(n_controls=2, allow_small_gap=True)  # random weights: no real answer to lose
    assert next(run_chunks(model, pair, settings)).replay is not None  # the replay is what runs below

    def every_method():
        return (activation_patching(model, pair, settings),
                group_patching(model, pair, HeadSet(((1, 0), (1, 3))), settings),
                path_patching(model, pair, HeadSet(((0, 1),)), HeadSet(((1, 2),)), "q,k,v", settings))

    replayed = every_method()
    monkeypatch.setattr(runs_module, "can_replay", lambda model: False)
    assert next(run_chunks(model, pair, settings)).replay is None
    full = every_method()
    np.testing.assert_allclose(replayed[0].scores, full[0].scores, rtol=1e-4, atol=1e-5)
    for a, b in zip(replayed[1:], full[1:]):
        np.testing.assert_allclose([a.score, *a.control_scores], [b.score, *b.control_scores], rtol=1e-4, atol=1e-5)
    assert replayed[0].identity_max_diff < 1e-4


def test_a_replay_that_does_not_give_the_base_run_back_is_not_used(tmp_path, monkeypatch):
    model = load_model(ModelRef.parse(str(save_tiny_model("llama", tmp_path))))
    pair = InductionCounterfactualSpec(probe_spec("induction", n_examples=4, seq_len=10), seed=0).build()
    monkeypatch.setattr(runs_module, "logits_differ", lambda got, want, model: True)
    assert [runs.replay for runs in run_chunks(model, pair, PatchSettings(batch_size=2))] == [None, None]
