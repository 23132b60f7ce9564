"""Ablation types on hand-made cases with known answers (core/ablation/replacements.py, compare.py).

A hand-built attention-only model (tests/hand_model.py) gives the clean z that each mode's replacement
is checked against, computed here by hand; reference-slice is checked against a hand overwrite of the
attention output after W_O on a tiny [HHG]-shaped GPT-NeoX; `ablate --mode all` runs once on a tiny
fake zoo model.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformer_lens.model_bridge import TransformerBridge

from core.__main__ import main
from core.ablation.compare import compare_modes, head_conclusion
from core.ablation.engine import ablated_logits_fn, run_conditions
from core.ablation.replacements import Replacements, ablation_hooks, compute_replacements, derangement
from core.ablation.spec import PROBE_MODES, Ablation
from core.ablation.study import AblationSettings
from core.errors import HeadLabError
from core.heads import HeadSet
from core.workspace import zoo_dir
from tests.hand_model import random_hand_model
from tests.tiny_models import make_fake_zoo, tiny_model

Z1 = "blocks.1.attn.hook_z"
# 3 examples x 4 positions; token 2 appears at (0,1), (1,0), (2,3); token 5 at (0,3), (2,0), (2,1)
TOKENS = torch.tensor([[1, 2, 3, 5], [2, 4, 0, 3], [5, 5, 1, 2]])


@pytest.fixture(scope="module")
def hand():
    model = random_hand_model(seed=3, n_layers=2, n_heads=2, d_model=8, d_head=4, d_vocab=6, n_ctx=8)
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
    return model, cache[Z1]  # clean z of layer 1: [example, pos, head, d_head]


def _ablated_z(model, ablations, rows, stats, tokens):
    """Layer 1's z as the ablation hooks leave it (a reading hook after them on the same point)."""
    seen = {}

    def read(z, hook=None):
        seen["z"] = z.detach().clone()
        return z

    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=ablation_hooks(model, ablations, rows, stats) + [(Z1, read)])
    return seen["z"]


def test_derangement_is_seeded_and_leaves_no_example_its_own():
    assert derangement(2, 0).tolist() == [1, 0]  # the only one
    for n in range(2, 12):
        perm = derangement(n, 7)
        assert sorted(perm.tolist()) == list(range(n)) and not np.any(perm == np.arange(n))
        assert derangement(n, 7).tolist() == perm.tolist()
    assert {tuple(derangement(6, seed)) for seed in range(10)} != {tuple(derangement(6, 0))}  # the seed matters
    with pytest.raises(HeadLabError, match="at least 2"):
        derangement(1, 0)


def test_mean_is_one_mean_over_examples_and_positions(hand):
    model, z = hand
    ablation = Ablation(HeadSet(((1, 0),)), mode="mean")
    stats = compute_replacements(model, TOKENS, ablation, batch_size=2)  # two example chunks summed
    want = z.mean(dim=(0, 1))  # [head, d_head]
    torch.testing.assert_close(stats.values[("mean", Z1)], want, atol=1e-5, rtol=1e-5)
    got = _ablated_z(model, [ablation], (0, 3), stats, TOKENS)
    torch.testing.assert_close(got[:, :, 0], want[0].expand(3, 4, -1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[:, :, 1], z[:, :, 1], atol=1e-5, rtol=1e-5)  # the other head untouched


def test_mean_per_position_is_the_mean_over_examples_at_each_position(hand):
    model, z = hand
    ablation = Ablation(HeadSet(((1, 1),)), mode="mean-per-position")
    stats = compute_replacements(model, TOKENS, ablation, batch_size=3)
    got = _ablated_z(model, [ablation], (0, 3), stats, TOKENS)
    torch.testing.assert_close(got[:, :, 1], z[:, :, 1].mean(dim=0).expand(3, -1, -1), atol=1e-5, rtol=1e-5)


def test_resample_takes_the_donors_z_and_follows_the_example_rows(hand):
    model, z = hand
    ablation = Ablation(HeadSet(((1, 0),)), mode="resample", seed=4)
    stats = compute_replacements(model, TOKENS, ablation, batch_size=2)
    donor = derangement(3, 4)
    got = _ablated_z(model, [ablation], (0, 3), stats, TOKENS)
    for i in range(3):
        torch.testing.assert_close(got[i, :, 0], z[donor[i], :, 0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[:, :, 1], z[:, :, 1], atol=1e-5, rtol=1e-5)
    # examples 1..2 alone, two conditions stacked condition-major: the donors are still those of examples 1 and 2
    other = Ablation(HeadSet(((1, 1),)), mode="resample", seed=4)
    stacked = _ablated_z(model, [ablation, other], (1, 3), stats, TOKENS[1:].repeat(2, 1))
    for j, i in enumerate((1, 2)):
        torch.testing.assert_close(stacked[j, :, 0], z[donor[i], :, 0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(stacked[2 + j, :, 1], z[donor[i], :, 1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(stacked[2 + j, :, 0], z[i, :, 0], atol=1e-5, rtol=1e-5)


def test_token_wise_mean_averages_every_position_holding_the_same_token(hand):
    model, z = hand
    ablation = Ablation(HeadSet(((1, 1),)), mode="token-wise-mean")
    stats = compute_replacements(model, TOKENS, ablation, batch_size=2)
    got = _ablated_z(model, [ablation], (0, 3), stats, TOKENS)
    for i in range(3):
        for p in range(4):
            same = [(a, b) for a in range(3) for b in range(4) if TOKENS[a, b] == TOKENS[i, p]]
            want = sum(z[a, b, 1] for a, b in same) / len(same)
            torch.testing.assert_close(got[i, p, 1], want, atol=1e-5, rtol=1e-5)
    # token 4 occurs once: its own z comes back; token 2 three times: the three averaged
    torch.testing.assert_close(got[1, 1, 1], z[1, 1, 1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[0, 1, 1], (z[0, 1, 1] + z[1, 0, 1] + z[2, 3, 1]) / 3, atol=1e-5, rtol=1e-5)


def test_reference_slice_overwrites_the_heads_columns_after_w_o(hand):
    """The hook at the attention output: columns h*d_head..(h+1)*d_head := head h's mean z, by hand."""
    model, _ = hand
    mean_z = torch.arange(8.0).view(2, 4)  # [head, d_head]
    stats = Replacements({("mean", "blocks.0.attn.hook_z"): mean_z})
    ((name, hook),) = ablation_hooks(model, [Ablation(HeadSet(((0, 1),)), mode="reference-slice")], (0, 2), stats)
    assert name == "blocks.0.attn.hook_out"
    out = torch.full((2, 3, 8), -1.0)  # [row, pos, d_model]
    got = hook(out)
    assert torch.equal(got[..., :4], out[..., :4]) and torch.equal(got[..., 4:], torch.tensor([4.0, 5, 6, 7]).expand(2, 3, 4))
    with pytest.raises(HeadLabError, match="d_model"):
        hook(torch.zeros(2, 3, 9))


def test_reference_slice_on_a_model_equals_the_reference_overwrite(tmp_path):
    """On an [HHG]-shaped GPT-NeoX (sequential, dense bias): the attention module's output, after the
    dense layer and its bias, viewed [B, T, H, d_head], chunk h set to head h's mean pre-W_O output over
    every example and position; an ablated MLP's output set to its all-position mean (the reference code)."""
    hf = tiny_model("hhg", seed=2)
    hf.save_pretrained(str(tmp_path))
    bridge = TransformerBridge.boot_transformers(str(tmp_path), hf_model=hf, device="cpu").eval()
    tokens = torch.randint(0, 256, (5, 9), generator=torch.Generator().manual_seed(0))
    layer, head, mlp, d_head = 1, 2, 2, 32
    seen = {}
    dense = hf.gpt_neox.layers[layer].attention.dense
    handles = [dense.register_forward_pre_hook(lambda m, a: seen.__setitem__("z", a[0].detach())),
               hf.gpt_neox.layers[mlp].mlp.register_forward_hook(lambda m, a, o: seen.__setitem__("mlp", o.detach()))]
    with torch.no_grad():
        hf(tokens)
    for handle in handles:
        handle.remove()
    mean_z = seen["z"].mean(dim=(0, 1))[head * d_head : (head + 1) * d_head]  # [d_head]
    mean_mlp = seen["mlp"].mean(dim=(0, 1))  # [d_model]

    def overwrite(module, args, out):
        attn = out[0].clone()  # [B, T, d_model], dense bias included
        view = attn.view(attn.shape[0], attn.shape[1], 4, d_head)
        view[:, :, head, :] = mean_z
        return (attn,) + tuple(out[1:])

    handles = [hf.gpt_neox.layers[layer].attention.register_forward_hook(overwrite),
               hf.gpt_neox.layers[mlp].mlp.register_forward_hook(lambda m, a, o: mean_mlp.expand_as(o).clone())]
    with torch.no_grad():
        want = hf(tokens).logits
    for handle in handles:
        handle.remove()
    ablation = Ablation(HeadSet(((layer, head),)), mlp_layers=(mlp,), mode="reference-slice")
    got = ablated_logits_fn(bridge, ablation, compute_replacements(bridge, tokens, ablation, batch_size=5))(tokens)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    assert (got - bridge(tokens)).abs().max() > 1e-3  # it changed something
    # probe studies refuse it; sequence tasks refuse the modes that need fixed probe examples
    with pytest.raises(HeadLabError, match="sequence tasks only"):
        run_conditions(bridge, _StandIn(tokens), [ablation])
    with pytest.raises(HeadLabError, match="probe"):
        AblationSettings(mode="reference-slice")
    with pytest.raises(HeadLabError, match="fixed probe examples"):
        ablated_logits_fn(bridge, Ablation(HeadSet(((0, 0),)), mode="resample"))


class _StandIn:
    def __init__(self, tokens):
        self.tokens, self.query_pos, self.target = tokens, torch.full((tokens.shape[0],), tokens.shape[1] - 1), tokens[:, 0]


def test_compare_modes_flags_verdict_and_head_flips():
    group = {"zero": {"recipe": "causal", "closure_paper": "closed"},
             "mean": {"recipe": "causal", "closure_paper": "not closed"}}
    heads = {"L1H0": {"zero": 2.5, "mean": 0.3},  # damaging -> no effect: flips
             "L1H1": {"zero": -3.0, "mean": -1.9},  # helping under both
             "L0H0": {"zero": 1.0, "mean": None}}  # one judgement only: no flip
    out = compare_modes(group, heads, 1.8)
    assert out["same_verdict"] is False and out["verdict_flips"] == ["closure_paper"]
    assert out["flipped_heads"] == ["L1H0"]
    assert out["heads"]["L1H1"]["mean"] == {"damage_z": -1.9, "conclusion": "helping"}
    assert head_conclusion(1.8, 1.8) == "no effect" and head_conclusion(float("nan"), 1.8) == "n/a"
    assert compare_modes({"zero": {"recipe": "causal"}, "mean": {"recipe": "causal"}}, {}, 1.8)["same_verdict"] is True


def test_ablate_mode_all_on_a_tiny_model(tmp_path, capsys):
    make_fake_zoo(zoo_dir(), "tiny-modes-neox", "gpt_neox", steps=(0,))
    out = tmp_path / "all.json"
    assert main(["ablate", "tiny-modes-neox", "--heads", "L1H0", "--mode", "all", "--n", "6", "--seq-len", "12",
                 "--controls", "2", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["modes"] == list(PROBE_MODES) and set(data["verdicts"]) == set(PROBE_MODES)
    assert set(data["heads"]["L1H0"]) == set(PROBE_MODES) and isinstance(data["same_verdict"], bool)
    assert data["summaries"]["resample"]["selection"] == ["L1H0"]
    assert "verdict the same under every type" in capsys.readouterr().out
