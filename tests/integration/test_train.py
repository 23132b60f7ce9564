"""Zoo training: data stream structure, training-time measurements, determinism, resume, manifests."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from core.errors import HeadLabError
from core.tasks import mixture
from core.tasks.vocab import BOS, BYTE_VOCAB_SIZE
from core.zoo.config import ModelConfig, TrainConfig
from core.zoo.evaluate import induction_head_summary
from core.zoo.presets import ZOO_PRESETS, preset_entries, train_zoo, zoo_record
from core.zoo.train import (head_lasso_weight, load_checkpoint_model, log_checkpoint_steps, pythia_checkpoint_steps,
                             train_model)

TINY = ModelConfig(family="gpt_neox", n_layers=2, n_heads=4, d_model=32, d_ff=64, max_seq_len=32)
TINY_TRAIN = TrainConfig(
    task="induction", steps=20, batch_size=4, seq_len=32, repeat_warmup_steps=8, eval_every=10,
    eval_examples=8, final_examples=8, state_every=5, n_log_checkpoints=8,
)


def _period(row: torch.Tensor, chunk_max: int = mixture.CHUNK_MAX) -> int | None:
    """The chunk length L in 8..chunk_max for which the row's tail is a chunk repeated to the end, else None."""
    n = row.numel()
    for length in range(mixture.CHUNK_MIN, chunk_max + 1):
        start = n - 2 * length if 2 * length <= n - 1 else 1  # where the first full copy starts
        if torch.equal(row[start + length :], row[start : n - length]):
            return length
    return None


# ------------------------------------------------------------------------------ data stream


def test_repeat_batch_structure_and_determinism():
    batch = mixture.training_batch("repeat", step=3, batch_size=16, seq_len=64, seed=7)
    assert batch.shape == (16, 64) and batch.dtype == torch.long
    assert (batch[:, 0] == BOS).all() and (batch[:, 1:] < 256).all()
    assert all(_period(row) is not None for row in batch)
    assert torch.equal(batch, mixture.training_batch("repeat", 3, 16, 64, 7))
    assert not torch.equal(batch, mixture.training_batch("repeat", 4, 16, 64, 7))
    assert not torch.equal(batch, mixture.training_batch("repeat", 3, 16, 64, 8))


def test_longer_repeats_only_after_the_warm_up():
    from core.zoo.train import batch_at

    cfg = replace(TINY_TRAIN, seq_len=64, batch_size=256, repeat_warmup_steps=8, repeat_fraction=1.0, mixture_chunk_max=40)
    warm = {_period(row, 40) for row in batch_at(cfg, 7)[0]}
    after = {_period(row, 40) for row in batch_at(cfg, 8)[0]}
    assert None not in warm and max(warm) <= 32  # the warm-up keeps 8-32
    assert None not in after and max(after) > 32 and max(after) <= 40
    assert torch.equal(batch_at(replace(cfg, mixture_chunk_max=32), 7)[0], batch_at(cfg, 7)[0])
    with pytest.raises(HeadLabError, match="longest repeated chunk"):
        mixture.training_batch("repeat", step=0, batch_size=2, seq_len=64, seed=0, chunk_max=7)


def test_text_rows_are_windows_of_the_train_split():
    from core.tasks.text import load_text_bytes

    corpus = bytes(load_text_bytes("train").tolist())
    batch = mixture.training_batch("text", step=0, batch_size=8, seq_len=48, seed=0)
    assert (batch[:, 0] == BOS).all()
    for row in batch:
        assert corpus.find(bytes(row[1:].tolist())) >= 0


def test_mixture_mixes_both_kinds_and_shifted_uses_code():
    from core.tasks.text import load_text_bytes

    batch = mixture.training_batch("mixture", step=1, batch_size=64, seq_len=64, seed=0)
    periodic = sum(_period(row) is not None for row in batch)
    assert 16 < periodic < 48  # 50/50 per row; text windows are essentially never periodic
    corpus = bytes(load_text_bytes("train").tolist())
    code = bytes(mixture._code_corpus("train").tolist())
    shifted = mixture.training_batch("shifted", step=1, batch_size=64, seq_len=64, seed=0)
    text_rows = [row for row in shifted if _period(row) is None]
    assert text_rows and all(code.find(bytes(r[1:].tolist())) >= 0 for r in text_rows)
    assert not any(corpus.find(bytes(r[1:].tolist())) >= 0 for r in text_rows)


def test_schedule_and_unknown_kind():
    assert mixture.schedule(0, 5) == "repeat" and mixture.schedule(4, 5) == "repeat"
    assert mixture.schedule(5, 5) == "mixture" and mixture.schedule(5, 5, "shifted") == "shifted"
    with pytest.raises(HeadLabError):
        mixture.training_batch("nope", 0, 2, 64, 0)


# ------------------------------------------------------------------------------ measurements


def _oracle_logits(half_len: int):
    """Logits that put all mass on the right next token wherever it is predictable by copying."""

    def run(tokens: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(tokens.shape[0], tokens.shape[1], BYTE_VOCAB_SIZE)
        for t in range(half_len + 1, 2 * half_len):  # predicts t+1, a copy of t+1-half_len
            logits[torch.arange(tokens.shape[0]), t, tokens[:, t + 1 - half_len]] = 100.0
        return logits

    return run


def test_induction_test_loss_known_answers():
    uniform = lambda tokens: torch.zeros(tokens.shape[0], tokens.shape[1], BYTE_VOCAB_SIZE)
    assert mixture.induction_test_loss(uniform, n_examples=4, half_len=10) == pytest.approx(math.log(260), abs=1e-5)
    # the oracle is right everywhere the loss looks (the second copy's first token is left out)
    assert mixture.induction_test_loss(_oracle_logits(10), n_examples=4, half_len=10) < 1e-6
    tokens = mixture.repeated_random_tokens(3, 10, seed=0)
    assert tokens.shape == (3, 21) and torch.equal(tokens[:, 1:11], tokens[:, 11:])


def test_prefix_matching_and_previous_token_on_hand_made_patterns():
    half = 6
    seq = 2 * half + 1

    def patterns(tokens):  # [layer, example, head, q, k]
        n = tokens.shape[0]
        out = torch.zeros(2, n, 3, seq, seq)
        q = torch.arange(seq)
        out[:, :, 0, q, 0] = 1.0  # head 0: always BOS
        out[:, :, 1, q[1:], q[1:] - 1] = 1.0  # head 1: previous token
        out[:, :, 1, 0, 0] = 1.0
        out[:, :, 2] = out[:, :, 0]
        second = torch.arange(half + 1, seq)
        out[1, :, 2, second] = 0.0
        out[1, :, 2, second, second - half + 1] = 1.0  # layer 1 head 2: perfect induction
        return out

    prefix = mixture.prefix_matching_scores(patterns, n_examples=2, half_len=half)
    expected = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    assert torch.allclose(prefix, expected)
    prev = mixture.previous_token_scores(patterns, n_examples=2, half_len=half)
    assert torch.allclose(prev[:, 1], torch.ones(2))
    duplicate = mixture.duplicate_token_scores(patterns, n_examples=2, half_len=half)
    assert torch.allclose(duplicate, torch.zeros(2, 3))  # induction looks one past the earlier copy

    def duplicate_head(tokens):  # head 0 of layer 0 attends from each second-copy token to its first copy
        out = patterns(tokens)
        second = torch.arange(half + 1, seq)
        out[0, :, 0, second] = 0.0
        out[0, :, 0, second, second - half] = 1.0
        return out

    duplicate = mixture.duplicate_token_scores(duplicate_head, n_examples=2, half_len=half)
    assert torch.allclose(duplicate, torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    # the BOS head matches the previous token only at q = 1: 1 of the 12 scored positions
    assert torch.allclose(prev[:, 0], torch.full((2,), 1 / 12))
    # distinct tokens within a copy: every second-copy token has exactly one earlier occurrence
    tokens = mixture.repeated_random_tokens(5, 30, seed=1, distinct=True)
    assert all(len(set(row[1:31].tolist())) == 30 for row in tokens)


def test_duplicate_rows_mark_exactly_the_repeats():
    from core.tasks import duplicate
    from core.tasks.vocab import SEP

    batch = duplicate.training_batch(step=2, batch_size=32, seq_len=64, seed=5)
    assert batch.shape == (32, 64) and (batch[:, 0] == BOS).all()
    assert torch.equal(batch, duplicate.training_batch(2, 32, 64, 5))
    for row in batch.tolist():
        seen = set()
        for t, token in enumerate(row[1:-1], start=1):
            if token == SEP:
                continue
            assert (row[t + 1] == SEP) == (token in seen)  # SEP follows a byte exactly when it is a repeat
            seen.add(token)
        bytes_used = {tok for tok in row[1:] if tok != SEP}
        assert len(bytes_used) <= duplicate.ALPHABET_MAX  # one small alphabet per row


def test_marker_accuracy_known_answers():
    from core.tasks import duplicate
    from core.tasks.vocab import SEP

    def oracle(tokens):  # puts SEP on top exactly after a byte that occurred before
        logits = torch.zeros(*tokens.shape, BYTE_VOCAB_SIZE)
        for i, row in enumerate(tokens.tolist()):
            seen = set()
            for t, token in enumerate(row):
                if token < 256:
                    logits[i, t, SEP if token in seen else 0] = 1.0
                    seen.add(token)
        return logits

    def never_sep(tokens):
        return torch.zeros(*tokens.shape, BYTE_VOCAB_SIZE) + torch.nn.functional.one_hot(torch.tensor(0), BYTE_VOCAB_SIZE)

    assert duplicate.marker_accuracy(oracle, 16, 64, seed=0) == 1.0
    tokens = duplicate.training_batch(step=0, batch_size=16, seq_len=64, seed=10_000)
    bytes_with_next = tokens[:, :-1] < 256
    first_share = float(((tokens[:, 1:] != SEP) & bytes_with_next).sum() / bytes_with_next.sum())
    assert duplicate.marker_accuracy(never_sep, 16, 64, seed=0) == pytest.approx(first_share)
    assert 0.2 < first_share < 0.8


def test_induction_head_summary_counts_controls():
    prefix = torch.zeros(2, 8)
    prefix[1, [0, 2, 5]] = 0.9  # three strong heads in layer 1 of 8
    prefix[1, 7] = 0.5  # induction, not strong
    summary = induction_head_summary(prefix)
    assert summary["strong_induction_heads"] == ["L1H0", "L1H2", "L1H5"]
    assert summary["induction_heads"] == ["L1H0", "L1H2", "L1H5", "L1H7"]
    assert summary["strong_per_layer"] == [0, 3]
    assert summary["matched_control_sets"] == math.comb(5, 3) == 10
    assert summary["strong_at_most_half"]
    prefix[1, :6] = 0.95
    assert not induction_head_summary(prefix)["strong_at_most_half"]


def test_prefix_matching_on_a_real_model_hf_and_pattern_fn_agree():
    from core.zoo.train import build_model

    model = build_model(TINY, seed=0).eval()
    hf = mixture.prefix_matching_scores(model, n_examples=4, half_len=8)
    assert hf.shape == (2, 4) and ((hf >= 0) & (hf <= 1)).all()
    # a pattern function returning the same attentions gives the same scores
    fn = lambda tokens: torch.stack(list(model(tokens, output_attentions=True).attentions))
    assert torch.allclose(mixture.prefix_matching_scores(fn, n_examples=4, half_len=8), hf)


def test_log_checkpoint_steps_start_early():
    steps = log_checkpoint_steps(2000, 20)
    assert steps[0] == 0 and steps[-1] == 2000 and steps == sorted(set(steps))
    assert steps[1] <= 0.003 * 2000
    assert sum(1 for s in steps if 0.003 * 2000 <= s <= 0.02 * 2000) >= 3  # the 0.3-2% window


def test_pythia_checkpoint_steps_are_pythias_revisions():
    assert pythia_checkpoint_steps(2500) == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 2000, 2500]
    assert pythia_checkpoint_steps(3) == [0, 1, 2, 3]
    with pytest.raises(HeadLabError, match="checkpoint_schedule"):
        TrainConfig(checkpoint_schedule="linear")


# ------------------------------------------------------------------------------ training


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _final_dir(out: Path, manifest: dict) -> Path:
    return out / "checkpoints" / manifest["checkpoints"][-1]["revision"]


def test_same_seed_same_weights_and_manifest(tmp_path):
    a = train_model("a", TINY, TINY_TRAIN, tmp_path / "a")
    b = train_model("b", TINY, TINY_TRAIN, tmp_path / "b")
    assert [c["revision"] for c in a["checkpoints"]] == [c["revision"] for c in b["checkpoints"]]
    for entry in a["checkpoints"]:
        assert _same(_weights(tmp_path / "a" / "checkpoints" / entry["revision"]),
                     _weights(tmp_path / "b" / "checkpoints" / entry["revision"]))
    c = train_model("c", TINY, replace(TINY_TRAIN, seed=1), tmp_path / "c")
    assert not _same(_weights(_final_dir(tmp_path / "a", a)), _weights(_final_dir(tmp_path / "c", c)))

    # manifest content
    on_disk = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert on_disk == json.loads(json.dumps(a)) and on_disk["complete"]
    assert on_disk["name"] == "a" and on_disk["family"] == "gpt_neox" and on_disk["task"] == "induction"
    assert ModelConfig.from_json(on_disk["config"]["model"]) == TINY
    assert TrainConfig.from_json(on_disk["config"]["train"]) == TINY_TRAIN
    checkpoints = on_disk["checkpoints"]
    tokens = [c["tokens"] for c in checkpoints]
    assert tokens == sorted(set(tokens)) and tokens[0] == 0
    assert checkpoints[-1]["step"] == TINY_TRAIN.steps
    assert tokens[-1] == TINY_TRAIN.steps * TINY_TRAIN.batch_size * TINY_TRAIN.seq_len
    assert tokens[1] <= 0.003 * tokens[-1] or checkpoints[1]["step"] == 1  # earliest possible non-zero
    assert all(c["revision"] == f"step{c['step']:07d}" for c in checkpoints)
    assert all((tmp_path / "a" / "checkpoints" / c["revision"] / "model.safetensors").is_file() for c in checkpoints)
    assert len(on_disk["curves"]["step"]) == len(on_disk["curves"]["loss"]) == TINY_TRAIN.steps // TINY_TRAIN.log_every
    assert on_disk["curves"]["eval"]["step"] == [10, 20]
    final = on_disk["final"]
    assert len(final["prefix_matching"]) == 2 and len(final["prefix_matching"][0]) == 4
    record = zoo_record(on_disk)
    assert record["checkpoints"] == len(checkpoints) and record["n_layers"] == 2 and record["n_heads"] == 4
    assert "induction_loss" in record and record["train_seconds"] >= 0


def test_resume_after_interruption_is_bit_identical(tmp_path):
    # dense loss-drop checkpoints, so the smoothed-loss bookkeeping must also resume exactly
    cfg = replace(TINY_TRAIN, loss_drop_checkpoint=0.002, min_checkpoint_gap=1)
    full = train_model("full", TINY, cfg, tmp_path / "full")
    assert len(full["checkpoints"]) > len(log_checkpoint_steps(cfg.steps, cfg.n_log_checkpoints))

    class Interrupt(Exception):
        pass

    def crash_at_13(step, total, loss):
        if step == 13:  # between state saves (every 5 steps and at checkpoints)
            raise Interrupt

    with pytest.raises(Interrupt):
        train_model("part", TINY, cfg, tmp_path / "part", progress=crash_at_13)
    assert not json.loads((tmp_path / "part" / "manifest.json").read_text())["complete"]
    resumed = train_model("part", TINY, cfg, tmp_path / "part")
    assert resumed["complete"]
    assert [c["revision"] for c in resumed["checkpoints"]] == [c["revision"] for c in full["checkpoints"]]
    assert [c["loss"] for c in resumed["checkpoints"]] == [c["loss"] for c in full["checkpoints"]]
    assert resumed["curves"] == full["curves"]
    state = lambda name: {k: v for k, v in json.loads((tmp_path / name / "state" / "state.json").read_text()).items()
                          if k != "train_seconds"}
    assert state("part") == state("full")  # smoothed loss and all bookkeeping included
    for entry in full["checkpoints"]:
        assert _same(_weights(tmp_path / "full" / "checkpoints" / entry["revision"]),
                     _weights(tmp_path / "part" / "checkpoints" / entry["revision"]))

    # a clean stop (stop_after_steps) resumes the same way
    stopped = train_model("stop", TINY, cfg, tmp_path / "stop", stop_after_steps=7)
    assert not stopped["complete"]
    again = train_model("stop", TINY, cfg, tmp_path / "stop")
    assert again["checkpoints"] == full["checkpoints"] and again["curves"] == full["curves"]
    assert _same(_weights(_final_dir(tmp_path / "stop", again)), _weights(_final_dir(tmp_path / "full", full)))

    # a different config in the same folder is refused rather than mixed in
    train_model("other", TINY, replace(TINY_TRAIN, lr=1e-3), tmp_path / "other", stop_after_steps=3)
    with pytest.raises(HeadLabError):
        train_model("other", TINY, replace(TINY_TRAIN, lr=2e-3), tmp_path / "other")
    # ... and so is a finished one (two presets may not share a folder with different recipes)
    with pytest.raises(HeadLabError, match="different config"):
        train_model("full", TINY, replace(cfg, lr=2e-3), tmp_path / "full")
    assert train_model("full", TINY, cfg, tmp_path / "full")["checkpoints"] == full["checkpoints"]
    # a record written before a config field existed matches when the field is at its (old-behaviour) default
    manifest_path = tmp_path / "full" / "manifest.json"
    record = json.loads(manifest_path.read_text())
    del record["config"]["train"]["mixture_chunk_max"]
    manifest_path.write_text(json.dumps(record))
    assert train_model("full", TINY, cfg, tmp_path / "full")["checkpoints"] == full["checkpoints"]
    with pytest.raises(HeadLabError, match="different config"):
        train_model("full", TINY, replace(cfg, mixture_chunk_max=24), tmp_path / "full")


def test_an_extended_warm_up_keeps_repeats_until_the_repeated_half_loss_falls(tmp_path):
    """warmup_extend_to: a seed below the bar when the fixed warm-up ends trains exactly as with the
    fixed warm-up; one that never gets there keeps pure repeats to the cap while the head lasso
    starts at the fixed end; an interrupted extended run resumes to the same weights."""
    base = replace(TINY_TRAIN, steps=30, repeat_warmup_steps=10, head_l1=0.01)
    fixed = train_model("fixed", TINY, base, tmp_path / "fixed")
    met = train_model("met", TINY, replace(base, warmup_extend_to=25, warmup_loss_below=100.0), tmp_path / "met")
    assert met["final"]["warmup_end"] == 10 and "warmup_end" not in fixed["final"]
    assert met["curves"] == fixed["curves"] and met["checkpoints"] == fixed["checkpoints"]
    for entry in fixed["checkpoints"]:
        assert _same(_weights(tmp_path / "fixed" / "checkpoints" / entry["revision"]),
                     _weights(tmp_path / "met" / "checkpoints" / entry["revision"]))

    def final(name: str, cfg: TrainConfig) -> dict:
        manifest = train_model(name, TINY, cfg, tmp_path / name)
        return _weights(_final_dir(tmp_path / name, manifest))

    never = replace(base, warmup_extend_to=25, warmup_loss_below=0.0)
    capped = train_model("capped", TINY, never, tmp_path / "capped")
    assert capped["final"]["warmup_end"] == 25
    capped_weights = _weights(_final_dir(tmp_path / "capped", capped))
    # the data: without the lasso, the capped run is the fixed 25-step warm-up to the bit
    assert _same(final("capped-no-lasso", replace(never, head_l1=0.0)),
                 final("fixed-25-no-lasso", replace(base, repeat_warmup_steps=25, head_l1=0.0)))
    # the lasso: from step 10 in the capped run, so not the fixed 25-step warm-up's (lasso from 25)
    assert not _same(capped_weights, final("fixed-25", replace(base, repeat_warmup_steps=25)))
    assert not _same(capped_weights, _weights(_final_dir(tmp_path / "fixed", fixed)))

    train_model("resumed", TINY, never, tmp_path / "resumed", stop_after_steps=17)  # inside the extension
    resumed = train_model("resumed", TINY, never, tmp_path / "resumed")
    assert resumed["final"]["warmup_end"] == 25 and resumed["curves"] == capped["curves"]
    assert _same(_weights(_final_dir(tmp_path / "resumed", resumed)), capped_weights)

    with pytest.raises(HeadLabError, match="warmup_extend_to"):
        TrainConfig(task="induction", repeat_warmup_steps=500, warmup_extend_to=500)
    with pytest.raises(HeadLabError, match="warmup_extend_to"):
        TrainConfig(task="duplicate", warmup_extend_to=900)


def test_head_lasso_weight_pauses_and_boosts_on_hand_made_bookkeeping():
    """head_lasso_weight on hand-made training states: off before the fixed warm-up ends; paused from
    lasso_pause_from while an extended warm-up runs; boosted from the first evaluation with more
    strong heads than lasso_boost_above, and for good (a later smaller count keeps it)."""
    cfg = TrainConfig(task="induction", repeat_warmup_steps=500, head_l1=0.005, warmup_extend_to=2000,
                      lasso_pause_from=600, lasso_boost_above=5, lasso_boost=2.0)

    def meta(warmup_end=None, strong=()):
        return {"warmup_end": warmup_end, "curves": {"eval": {"strong_induction_count": list(strong)}}}

    assert head_lasso_weight(cfg, meta(), 499) == 0.0  # the fixed warm-up
    assert head_lasso_weight(cfg, meta(), 500) == 0.005  # extended, but before the pause begins
    assert head_lasso_weight(cfg, meta(), 600) == 0.0  # still on the plateau at step 600: paused
    assert head_lasso_weight(cfg, meta(warmup_end=1000), 1000) == 0.005  # the warm-up ended: back on
    state = meta(warmup_end=600, strong=[3, 5])
    assert head_lasso_weight(cfg, state, 700) == 0.005 and state.get("lasso_boost_from") is None  # 5 is not above 5
    state["curves"]["eval"]["strong_induction_count"].append(6)
    assert head_lasso_weight(cfg, state, 800) == 0.01 and state["lasso_boost_from"] == 800
    state["curves"]["eval"]["strong_induction_count"].append(4)
    assert head_lasso_weight(cfg, state, 900) == 0.01 and state["lasso_boost_from"] == 800  # latched
    plain = TrainConfig(task="induction", repeat_warmup_steps=500, head_l1=0.005)
    assert head_lasso_weight(plain, meta(strong=[12]), 900) == 0.005  # neither rule asked for
    with pytest.raises(HeadLabError, match="warmup_extend_to"):
        TrainConfig(task="induction", head_l1=0.005, lasso_pause_from=600)
    with pytest.raises(HeadLabError, match="head_l1"):
        TrainConfig(task="induction", lasso_boost_above=5)


def test_lasso_rules_that_never_fire_train_the_same_weights(tmp_path):
    """A seed whose warm-up ends before lasso_pause_from and whose circuit never exceeds
    lasso_boost_above trains bit-identically with and without the rules (the paper seeds that formed on
    time keep their weights); a boost that fires from the start changes them."""
    base = replace(TINY_TRAIN, steps=30, repeat_warmup_steps=10, head_l1=0.01, warmup_extend_to=25, warmup_loss_below=100.0)
    plain = train_model("plain", TINY, base, tmp_path / "plain")
    ruled = train_model("ruled", TINY, replace(base, lasso_pause_from=11, lasso_boost_above=99), tmp_path / "ruled")
    assert ruled["final"]["warmup_end"] == 10 and ruled["final"]["lasso_boost_from"] is None
    assert _same(_weights(_final_dir(tmp_path / "plain", plain)), _weights(_final_dir(tmp_path / "ruled", ruled)))
    boosted = train_model("boosted", TINY, replace(base, lasso_boost_above=-1, lasso_boost=50.0), tmp_path / "boosted")
    assert boosted["final"]["lasso_boost_from"] is not None
    assert not _same(_weights(_final_dir(tmp_path / "plain", plain)), _weights(_final_dir(tmp_path / "boosted", boosted)))


@pytest.mark.parametrize("family", ["gpt_neox", "llama", "olmoe"])
def test_each_family_trains_and_saves_loadable_checkpoints(tmp_path, family):
    from transformers import AutoTokenizer

    cfg = replace(TINY, family=family)
    train = replace(TINY_TRAIN, steps=6, eval_every=6, n_log_checkpoints=3)
    manifest = train_model(family, cfg, train, tmp_path / family)
    folder = _final_dir(tmp_path / family, manifest)
    model = load_checkpoint_model(folder).eval()
    state = load_file(str(tmp_path / family / "state" / "model.safetensors"))
    assert _same({k: v for k, v in model.state_dict().items() if k in state}, state)
    assert model.config.num_hidden_layers == 2 and model.config.num_attention_heads == 4
    assert model.config.model_type == {"gpt_neox": "gpt_neox", "llama": "llama", "olmoe": "olmoe"}[family]
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert tokenizer("ab")["input_ids"] == [BOS, 97, 98]  # BOS then UTF-8 bytes
    assert tokenizer.decode([104, 105]) == "hi"
    logits = model(torch.tensor([[BOS, 97, 98]])).logits
    assert logits.shape == (1, 3, BYTE_VOCAB_SIZE) and torch.isfinite(logits).all()


def test_duplicate_task_trains_with_marker_figures(tmp_path):
    train = replace(TINY_TRAIN, task="duplicate", steps=6, eval_every=3, repeat_warmup_steps=0, n_log_checkpoints=3)
    manifest = train_model("dup", TINY, train, tmp_path / "dup")
    final = manifest["final"]
    assert 0.0 <= final["marker_accuracy"] <= 1.0
    assert len(final["duplicate_token"]) == 2 and len(final["duplicate_token"][0]) == 4
    assert manifest["curves"]["eval"]["marker_accuracy"] and "induction_loss" not in final
    assert zoo_record(manifest)["marker_accuracy"] == final["marker_accuracy"]


def test_reverse_task_trains_with_sequence_figures(tmp_path):
    from core.tasks.sequences import OOD_LENGTHS, SEQ_VOCAB_SIZE

    cfg = ModelConfig(family="gpt_neox", n_layers=2, n_heads=2, d_model=16, d_ff=32, vocab_size=SEQ_VOCAB_SIZE,
                      rotary_pct=0.0, use_parallel_residual=False)
    train = TrainConfig(task="reverse", steps=4, batch_size=4, lr=1e-3, warmup_steps=0, weight_decay=0.0,
                        repeat_warmup_steps=0, eval_every=2, eval_examples=4, final_examples=4, n_log_checkpoints=2)
    manifest = train_model("rev", cfg, train, tmp_path / "rev")
    record = zoo_record(manifest)
    assert 0.0 <= record["train_accuracy"] <= 1.0
    assert list(record["ood_accuracy"]) == [str(n) for n in OOD_LENGTHS]
    assert manifest["curves"]["eval"]["train_accuracy"]


def test_early_stop_rule_stops_reverse_training(tmp_path, monkeypatch):
    import core.zoo.evaluate as evaluate_module

    # pretend the model is already 95% right: training must stop at the first evaluation
    monkeypatch.setattr(evaluate_module, "evaluate_sequences", lambda model, task, lengths, n, seed: {int(k): 0.95 for k in lengths})
    cfg = ModelConfig(family="gpt_neox", n_layers=1, n_heads=2, d_model=16, d_ff=32, vocab_size=104, rotary_pct=0.0)
    train = TrainConfig(task="reverse", steps=50, batch_size=4, eval_every=3, n_log_checkpoints=4)
    manifest = train_model("stop", cfg, train, tmp_path / "stop")
    assert manifest["final"]["steps"] == 3 and manifest["final"]["stopped_early"]
    assert manifest["checkpoints"][-1]["step"] == 3


def test_continued_training_starts_from_parent_final_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path))
    from core.workspace import zoo_dir

    parent = train_model("parent", TINY, replace(TINY_TRAIN, steps=6, eval_every=6), zoo_dir() / "parent")
    child_cfg = replace(TINY_TRAIN, task="shifted", steps=4, eval_every=4, repeat_warmup_steps=0, init_from="parent")
    child = train_model("child", TINY, child_cfg, zoo_dir() / "child")
    assert child["checkpoints"][0]["step"] == 0
    assert _same(_weights(zoo_dir() / "child" / "checkpoints" / "step0000000"), _weights(_final_dir(zoo_dir() / "parent", parent)))
    assert "code_loss" in child["final"]
    with pytest.raises(HeadLabError):
        train_model("orphan", TINY, replace(child_cfg, init_from="missing"), zoo_dir() / "orphan")


def test_second_zoo_call_is_a_no_op(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path))
    monkeypatch.setitem(ZOO_PRESETS, "tiny", [("tiny-a", TINY, replace(TINY_TRAIN, steps=4, eval_every=4))])
    first = train_zoo("tiny", progress=False)
    manifest = tmp_path / "zoo" / "tiny-a" / "manifest.json"
    stamp = manifest.stat().st_mtime_ns
    second = train_zoo("tiny", progress=False)
    assert first == second and manifest.stat().st_mtime_ns == stamp
    assert first[0]["name"] == "tiny-a" and first[0]["checkpoints"] >= 2
    with pytest.raises(HeadLabError):
        train_zoo("no-such-preset", progress=False)
    with pytest.raises(HeadLabError):
        train_zoo("tiny", progress=False, only="missing")


def test_presets_have_the_promised_models():
    quick = {name: (m, t) for name, m, t in ZOO_PRESETS["quick"]}
    assert set(quick) == {"induction-neox", "reverse-hhg", "induction-olmoe", "duplicate-neox"}
    assert quick["duplicate-neox"][1].task == "duplicate" and quick["duplicate-neox"][1].head_l1 == 0.0
    neox, _ = quick["induction-neox"]
    assert neox.family == "gpt_neox" and neox.n_layers >= 3 and neox.n_heads >= 8 and neox.rotary_pct == 1.0
    hhg, hhg_train = quick["reverse-hhg"]
    assert (hhg.n_layers, hhg.n_heads, hhg.d_model, hhg.d_ff) == (4, 4, 128, 512)
    assert hhg.rotary_pct == 0.0 and not hhg.use_parallel_residual and hhg_train.stop_accuracy == 0.9
    assert quick["induction-olmoe"][0].family == "olmoe"
    paper = [name for name, _, _ in ZOO_PRESETS["paper"]]
    seeds = lambda prefix: sum(bool(re.fullmatch(prefix + r"-s\d+", n)) for n in paper)
    assert seeds("induction-neox") == 6 and seeds("reverse-hhg") == 10 and seeds("sort-hhg") == 10
    assert "induction-olmoe" in paper
    shifted = [t for n, _, t in ZOO_PRESETS["paper"] if n == "induction-neox-shifted"][0]
    assert shifted.init_from == "induction-neox-s0" and shifted.task == "shifted"
    assert paper.index("induction-neox-s0") < paper.index("induction-neox-shifted")
    trains = {n: t for n, _, t in ZOO_PRESETS["paper"]}
    assert {trains[f"induction-neox-s{s}"].warmup_extend_to for s in range(6)} == {2000}  # seed 3 needs it
    # the lasso pauses on a long plateau (seed 3) and doubles past 5 strong heads (seeds 1 and 5)
    assert {(trains[f"induction-neox-s{s}"].lasso_pause_from, trains[f"induction-neox-s{s}"].lasso_boost_above)
            for s in range(6)} == {(600, 5)}
    long = trains["induction-neox-long"]  # [SPC] identifiability: induction forms in the first few percent
    assert long == replace(trains["induction-neox-s0"], steps=long.steps) and long.steps >= 8 * trains["induction-neox-s0"].steps


def test_reference_format_preset_is_the_sequence_models_in_their_own_folders():
    entries = preset_entries("paper", hhg_format="reference")
    assert [n for n, _, _ in entries] == [n + "-ref" for n, _, t in ZOO_PRESETS["paper"] if t.task in ("reverse", "sort")]
    assert {t.hhg_format for _, _, t in entries} == {"reference"}
    assert [n for n, _, _ in preset_entries("paper", "sort-hhg-s3-ref", "reference")] == ["sort-hhg-s3-ref"]
    with pytest.raises(HeadLabError, match="reverse and sort tasks only"):
        TrainConfig(task="induction", hhg_format="reference")
    with pytest.raises(HeadLabError, match="no reverse or sort model"):
        preset_entries("scale", hhg_format="reference")


def test_bad_configs_raise_headlab_errors():
    with pytest.raises(HeadLabError):
        ModelConfig(family="gpt2")
    with pytest.raises(HeadLabError):
        ModelConfig(d_model=30, n_heads=4)
    with pytest.raises(HeadLabError):
        TrainConfig(task="translate")


def test_command_line_train_and_zoo(tmp_path, monkeypatch):
    import argparse

    import core.cli.zoo
    from core.cli.zoo import add_train_arguments, add_zoo_arguments, cli_train, cli_zoo

    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path))
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    args = parser.parse_args(["--name", "cli", "--layers", "1", "--heads", "2", "--d-model", "16",
                              "--steps", "3", "--seed", "4", "--no-progress"])
    record = cli_train(args)
    assert record["name"] == "cli" and record["n_layers"] == 1 and record["n_heads"] == 2
    manifest = json.loads((tmp_path / "zoo" / "cli" / "manifest.json").read_text())
    assert manifest["config"]["train"]["seed"] == 4 and manifest["config"]["model"]["d_ff"] == 64

    monkeypatch.setitem(ZOO_PRESETS, "tiny", [("tiny-b", TINY, replace(TINY_TRAIN, steps=3, eval_every=3))])
    monkeypatch.setattr(core.cli.zoo, "ZOO_PRESET_NAMES", (*core.cli.zoo.ZOO_PRESET_NAMES, "tiny"))  # --preset's choices
    parser = argparse.ArgumentParser()
    add_zoo_arguments(parser)
    records = cli_zoo(parser.parse_args(["--preset", "tiny", "--no-progress"]))
    assert [r["name"] for r in records] == ["tiny-b"] and records[0]["complete"]


def test_head_group_norms_pick_each_heads_own_weights():
    from core.zoo.train import build_model, head_group_norms

    model = build_model(TINY, seed=0)
    d = TINY.d_head  # 8
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        layer = model.gpt_neox.layers[1].attention
        # head 2's query/key/value rows are rows 2*3d .. 3*3d of the fused projection
        layer.query_key_value.weight[2 * 3 * d : 3 * 3 * d].fill_(1.0)
        # head 3's W_O slice: columns 3d .. 4d of the output projection
        layer.dense.weight[:, 3 * d : 4 * d].fill_(2.0)
    norms = head_group_norms(model, TINY)
    expected = torch.zeros(2, 4)
    expected[1, 2] = math.sqrt(3 * d * TINY.d_model)
    expected[1, 3] = math.sqrt(4.0 * d * TINY.d_model)
    assert torch.allclose(norms, expected, atol=1e-5)
    with pytest.raises(HeadLabError):
        head_group_norms(model, replace(TINY, family="llama"))


def test_fused_qkv_rows_are_head_major():
    """Rows h*3d .. (h+1)*3d of GPT-NeoX's fused projection drive head h only (what head_group_norms assumes)."""
    from core.zoo.train import build_model

    model = build_model(TINY, seed=0).eval()
    d = TINY.d_head
    with torch.no_grad():
        qkv = model.gpt_neox.layers[1].attention.query_key_value
        qkv.weight.zero_()
        qkv.bias.zero_()
        qkv.weight[2 * 3 * d : 3 * 3 * d] = torch.randn(3 * d, TINY.d_model, generator=torch.Generator().manual_seed(0))
        attn = model(torch.randint(0, 256, (1, 10)), output_attentions=True).attentions[1][0]  # [head, q, k]
    uniform = torch.tril(torch.ones(10, 10)) / torch.arange(1, 11)[:, None]
    for head in range(TINY.n_heads):
        assert torch.allclose(attn[head], uniform, atol=1e-6) == (head != 2)


def test_learning_rate_schedule():
    from core.zoo.train import _lr_at

    cfg = TrainConfig(steps=100, lr=1.0, warmup_steps=10, decay_fraction=0.5)
    assert _lr_at(0, cfg) == pytest.approx(0.1) and _lr_at(9, cfg) == pytest.approx(1.0)
    assert _lr_at(49, cfg) == pytest.approx(1.0) and _lr_at(50, cfg) == pytest.approx(1.0)
    assert _lr_at(75, cfg) == pytest.approx(1.0 - 0.9 * 0.5)
    assert _lr_at(99, cfg) == pytest.approx(1.0 - 0.9 * 49 / 50)
    assert _lr_at(99, replace(cfg, decay_fraction=0.0)) == 1.0


def test_hhg_shaped_checkpoint_boots_through_transformer_bridge(tmp_path):
    from transformer_lens.model_bridge import TransformerBridge

    from core.tasks.sequences import END, SEP, START
    from core.zoo.presets import _HHG

    train = TrainConfig(task="reverse", steps=2, batch_size=4, lr=1e-3, warmup_steps=0, weight_decay=0.0,
                        repeat_warmup_steps=0, eval_every=2, eval_examples=2, final_examples=2, n_log_checkpoints=2)
    manifest = train_model("hhg", _HHG, train, tmp_path / "hhg")
    folder = _final_dir(tmp_path / "hhg", manifest)
    hf = load_checkpoint_model(folder).eval()
    assert hf.config.rope_parameters["partial_rotary_factor"] == 0.0 and not hf.config.use_parallel_residual
    bridge = TransformerBridge.boot_transformers(str(folder), device="cpu")
    assert (bridge.cfg.n_layers, bridge.cfg.n_heads, bridge.cfg.d_model) == (4, 4, 128)
    tokens = torch.tensor([[START, 5, 17, 42, SEP, 42, 17, 5, END]])
    with torch.no_grad():
        assert torch.allclose(bridge(tokens), hf(tokens).logits, atol=1e-5)
    assert bridge.tokenizer("5 17")["input_ids"] == [START, 5, 17]
