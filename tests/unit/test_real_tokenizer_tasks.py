"""Probes for models with their own tokenizer (core/tasks/tokens.py, repeat.py, ioi.py, probe_file.py's spacing
notes), on a tiny word-level tokenizer made here with the `tokenizers` library: known answers, no real model."""

import json

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from core.errors import HeadLabError
from core.model.loading import byte_tokenizer
from core.tasks.counterfactual import InductionCounterfactualSpec
from core.tasks.induction import InductionProbeSpec, token_source
from core.tasks.ioi import IoiCounterfactualSpec, IoiSpec, ioi_spec
from core.tasks.probe_file import read_probe_file
from core.tasks.repeat import RepeatInductionSpec
from core.tasks.specs import built_in_counterfactual, probe_spec, spec_from_json
from core.tasks.tokens import check_tokenizer_files, id_runs, ordinary_token_ids, runs_ids, special_prefix

WORDS = ("When Then After and went to the store park , . gave a drink ring to Mary John Anna Paul Kate Mark "
         "Lisa Sara").split()


def _tiny_tokenizer() -> PreTrainedTokenizerFast:
    """GPT-2 style: a word after a space is one token 'Ġword'; ids 0-1 special, 2 a byte-fallback token,
    then the words bare (ids 3..) and with their space ('Ġ' + word)."""
    vocab = {"<|endoftext|>": 0, "<unk>": 1, "<0x41>": 2}
    for word in WORDS:
        vocab.setdefault(word, len(vocab))
    for word in WORDS:
        vocab.setdefault("Ġ" + word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", unk_token="<unk>",
                                   pad_token="<|endoftext|>", name_or_path="tiny-word-level")


TOK = _tiny_tokenizer()
N_VOCAB = 3 + 2 * len(set(WORDS))


def test_ordinary_tokens_leave_out_special_and_byte_fallback_ids():
    assert ordinary_token_ids(TOK).tolist() == list(range(3, N_VOCAB))
    assert id_runs(np.array([9, 3, 4, 5])) == ((3, 6), (9, 10))
    assert runs_ids(((3, 6), (9, 10))).tolist() == [3, 4, 5, 9]
    assert special_prefix(TOK) == () and special_prefix(None) == ()


def test_zoo_specs_keep_their_bytes_and_json():
    """No tokenizer, or the byte tokenizer: bytes [0, 256) and the same to_json (so the same cache keys) as before."""
    assert token_source(None, None, None) == token_source(byte_tokenizer(True), None, None) == {"token_low": 0,
                                                                                                "token_high": 256}
    spec = probe_spec("induction", 8, 16, 1, None, None, byte_tokenizer(True))
    assert spec == probe_spec("induction", 8, 16, 1)
    saved = Tokenizer(models.WordLevel(vocab={**{f"b{i}": i for i in range(256)}, "<s>": 256, "<x>": 257},
                                       unk_token="<s>"))  # a byte vocabulary saved with two more specials
    saved_bytes = PreTrainedTokenizerFast(tokenizer_object=saved, bos_token="<s>", eos_token="<x>")
    assert probe_spec("induction", 8, 16, 1, None, None, saved_bytes) == spec
    assert spec.to_json() == {"task": "induction", "n_examples": 8, "seq_len": 16, "token_low": 0, "token_high": 256,
                              "seed": 1}


def test_induction_on_a_real_tokenizer_draws_its_ordinary_tokens_by_index():
    """The vocab spec's batch is the plain index-range batch mapped through the allowed ids."""
    spec = probe_spec("induction", 6, 16, 3, None, None, TOK)
    assert spec.vocab == ((3, N_VOCAB),) and spec.tokenizer and spec.to_json()["vocab"] == [[3, N_VOCAB]]
    runs = ((10, 13), (20, 25))
    mapped = InductionProbeSpec(6, 16, 10, 25, 3, vocab=runs, tokenizer="x").build()
    plain = InductionProbeSpec(6, 16, 0, 8, 3).build()
    ids = np.array([10, 11, 12, 20, 21, 22, 23, 24])
    assert mapped.tokens.tolist() == ids[plain.tokens.numpy()].tolist()
    assert mapped.target.tolist() == ids[plain.target.numpy()].tolist()
    assert spec_from_json(json.dumps(mapped.spec)) == InductionProbeSpec(6, 16, 10, 25, 3, vocab=runs, tokenizer="x")
    pair = InductionCounterfactualSpec(InductionProbeSpec(40, 16, 10, 25, 3, vocab=runs, tokenizer="x")).build()
    rows = torch.arange(40)
    fresh = pair.corrupted_tokens[rows, pair.clean.duplicate_pos]
    assert set(fresh.tolist()) <= set(ids.tolist())
    assert not bool((fresh == pair.clean.target).any() | (fresh == pair.clean.tokens[rows, pair.clean.query_pos]).any())
    with pytest.raises(HeadLabError, match="bounds of its token runs"):
        InductionProbeSpec(6, 16, 0, 25, 3, vocab=runs, tokenizer="x")


def test_repeat_probe_layout_and_keys():
    """BOS prefix, one filler (T - 1 = 12 is even: none; T = 14: one), copies equal and distinct, keys at q - L (+1)."""
    spec = RepeatInductionSpec(n_examples=5, seq_len=14, token_low=0, token_high=20, seed=0, prefix=(99,))
    assert spec.layout() == (2, 6)  # prefix 1, filler 1, L = 6
    batch = spec.build()
    t = batch.tokens
    assert bool((t[:, 0] == 99).all()) and bool((t[:, 2:8] == t[:, 8:14]).all())
    for row in t[:, 1:8].tolist():
        assert len(set(row)) == 7  # filler and R distinct
    q = batch.query_pos
    assert bool(((q >= 8) & (q <= 12)).all())
    rows = torch.arange(5)
    assert torch.equal(batch.target, t[rows, q + 1]) and torch.equal(batch.duplicate_pos, q - 6)
    assert torch.equal(t[rows, batch.duplicate_pos], t[rows, q]) and torch.equal(t[rows, batch.induction_pos], batch.target)
    assert spec_from_json(batch.spec) == spec
    real = probe_spec("induction-repeat", 4, 12, 0, None, None, TOK)
    assert real.vocab == ((3, N_VOCAB),) and set(real.build().tokens.flatten().tolist()) <= set(range(3, N_VOCAB))
    with pytest.raises(HeadLabError, match="distinct tokens"):
        RepeatInductionSpec(n_examples=1, seq_len=64, token_low=0, token_high=20, seed=0)


def test_ioi_prompts_targets_and_counterfactuals():
    spec = ioi_spec(TOK, n_examples=120, seed=1, templates=(
        "When {A} and {B} went to the {PLACE}, {S} gave a {OBJECT} to",
        "Then, {A} and {B} went to the {PLACE}. {S} gave a {OBJECT} to",
        "After {A} and {B} went to the {PLACE}, {S} gave a {OBJECT} to"),
        names=("Mary", "John", "Anna", "Paul", "Kate", "Mark", "Lisa", "Sara", "Zebedee"))
    assert "Zebedee" not in spec.names and len(spec.names) == 8  # unknown: <unk>, not a one-token name
    assert spec.places == ("store", "park") and spec.objects == ("ring", "drink")
    assert IoiSpec.from_json(spec.to_json()) == spec and spec_from_json(spec.to_json()) == spec
    abc = IoiCounterfactualSpec(spec, "abc", 0).build()
    swap = IoiCounterfactualSpec(spec, "swap", 0).build()
    clean = abc.clean
    assert clean.n_examples == 120 and torch.equal(clean.tokens, swap.clean.tokens)
    name_of = {TOK.convert_tokens_to_ids("Ġ" + n): n for n in spec.names}
    for i in range(120):
        n = int(clean.attention_mask[i].sum()) if clean.attention_mask is not None else clean.seq_len
        text = TOK.decode(clean.tokens[i, :n])
        io, s = name_of[int(clean.target[i])], name_of[int(abc.corrupted_target[i])]
        assert text.endswith(" to") and int(clean.query_pos[i]) == n - 1
        assert text.count(" " + io) == 1 and text.count(" " + s) == 2  # IO once, S twice
        assert text.split(",")[-1].split(".")[-1].strip().startswith(s)  # S2 gives
        assert clean.tokens[i, clean.duplicate_pos[i]] == abc.corrupted_target[i]  # S1
        assert TOK.decode(swap.corrupted_tokens[i, :n]) == text[: text.rindex(" " + s)] + " " + io + text[
            text.rindex(" " + s) + len(s) + 1:]
        corrupted_names = [int(x) for x in abc.corrupted_tokens[i, :n] if int(x) in name_of]
        assert len(set(corrupted_names)) == 3 and not {int(clean.target[i]), int(abc.corrupted_target[i])} & set(
            corrupted_names)
    assert clean.spec["task"] == "ioi"
    assert ioi_spec(TOK, 4).templates == spec.templates  # the other three hold words the vocabulary lacks (<unk>)
    with pytest.raises(HeadLabError, match="word-level tokenizer"):
        ioi_spec(byte_tokenizer(True))
    with pytest.raises(HeadLabError, match="tokenizer"):
        probe_spec("ioi", 10)



def test_built_in_counterfactual_follows_the_probes_task():
    """The one rule the patch/edges commands and the Patching and Circuit graph pages use for their built-in pairs:
    the sidebar's ioi probe gives its ABC or swapped-subject twins, induction its earlier-A corruption, other
    tasks none (what to pick instead is said)."""
    ioi = ioi_spec(TOK, n_examples=6, seed=3)
    abc, swap = built_in_counterfactual(ioi, seed=5), built_in_counterfactual(ioi, 5, "swap")
    assert abc == IoiCounterfactualSpec(ioi, "abc", 5) and swap == IoiCounterfactualSpec(ioi, "swap", 5)
    pair = swap.build()
    assert torch.equal(pair.clean.tokens, ioi.build().tokens)  # the clean side is the sidebar's own prompts
    assert torch.equal(pair.corrupted_target, abc.build().corrupted_target)  # S is scored against IO on both
    induction = probe_spec("induction", 8, 16, 1, tokenizer=TOK)
    assert built_in_counterfactual(induction, seed=2) == InductionCounterfactualSpec(induction, seed=2)
    with pytest.raises(HeadLabError, match="ioi task"):
        built_in_counterfactual(induction, 2, "swap")
    for task in ("induction-repeat", "text"):
        with pytest.raises(HeadLabError, match=f"the {task} task has no built-in counterfactual; pick the induction "
                                               "or ioi task"):
            built_in_counterfactual(probe_spec(task, 8, 32, 1, tokenizer=TOK))

def test_bpe_probe_file_notes_name_spacing(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "When Mary and John went to the store, John gave a drink to ",
                                "target": "Mary"}) + "\n" + json.dumps(
        {"prompt": "When Mary and John went to the store, John gave a drink to", "target": "Mary"}) + "\n")
    notes = read_probe_file(path).build_batch(TOK).spec["notes"]
    assert any("1 of 2 prompts end with a space (line 1 first)" in n for n in notes)
    assert any("line 2: 'Mary' became token 'Mary'" in n and "' Mary'" in n for n in notes)
    assert read_probe_file(path).build_batch(byte_tokenizer(True)).spec["notes"] == [
        n for n in read_probe_file(path).build_batch(byte_tokenizer(True)).spec["notes"] if "space" not in n]


def test_folder_with_config_but_no_tokenizer_json_is_named(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(HeadLabError, match="no tokenizer.json"):
        check_tokenizer_files(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    check_tokenizer_files(tmp_path)
