"""A probe file's own prompts in ablation, the instrumented pass and the screen (issue 17), on a tiny GPT-NeoX
(rotary, parallel residual) bridge: padded batches score every prompt as if it ran alone, the replacement
statistics average real tokens only, the screen reads the prompts whose query token repeats, and `ablate`,
`probe` and `screen --probe-file` run end to end (ablate also in `--mode all` and in an ablation worker)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from transformer_lens.model_bridge import TransformerBridge

from core.__main__ import main
from core.ablation.engine import run_conditions
from core.ablation.replacements import compute_replacements
from core.ablation.spec import Ablation
from core.ablation.workers import AblationWorker, _job
from core.errors import HeadLabError
from core.heads import HeadSet
from core.model.loading import byte_tokenizer
from core.model.refs import ModelRef
from core.probe import collect_head_stats, pattern_batch_for
from core.tasks.probe_file import PADDING_SIDES, read_probe_file
from core.workspace import zoo_dir
from tests.tiny_models import make_fake_zoo, tiny_model

MODEL = "tiny-probe-file-neox"
EXAMPLE_PROBES = Path(__file__).resolve().parents[2] / "assets" / "probes" / "ioi_example.jsonl"
# three prompts of 30, 22 and 26 byte tokens (BOS included); no corrupted prompt: ablation does not read one
PROMPTS = [{"prompt": "the cat sat on the mat, the c", "target": "a"},
           {"prompt": "a bee and a bird, a b", "target": "e"},
           {"prompt": "one two three, one t", "target": "w", "query_pos": 18}]
LENGTHS = [30, 22, 21]
HEADS = HeadSet([(0, 1), (1, 2)])
Z1 = "blocks.1.attn.hook_z"


def _file(records: list[dict], padding: str = "right"):
    return read_probe_file("\n".join(json.dumps(r) for r in records).encode(), "prompts.jsonl", padding)


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    folder = tmp_path_factory.mktemp("neox")
    hf = tiny_model("gpt_neox", seed=0)
    hf.save_pretrained(str(folder))
    return TransformerBridge.boot_transformers(str(folder), hf_model=hf, device="cpu",
                                               tokenizer=byte_tokenizer(add_bos=True)).eval()  # as load_model gives a zoo model


def _metrics(bridge, batch, ablation: Ablation, strategy: str = "auto") -> dict[str, np.ndarray]:
    _, (result,) = run_conditions(bridge, batch, [ablation], strategy=strategy)
    return {"loss": result.loss, "target_logit": result.target_logit}


@pytest.mark.parametrize("padding", PADDING_SIDES)
def test_a_padded_batch_scores_each_prompt_as_if_it_ran_alone(bridge, padding):
    tokenizer = byte_tokenizer(add_bos=True)
    batch = _file(PROMPTS, padding).build_batch(tokenizer, 64)
    assert batch.seq_len == 30 and batch.attention_mask.sum(dim=1).tolist() == LENGTHS
    alone = [_file([record]).build_batch(tokenizer, 64) for record in PROMPTS]
    assert all(one.attention_mask is None for one in alone)  # nothing to pad: no mask
    zero = Ablation(heads=HEADS, mode="zero")  # its replacement reads no other example, so each prompt alone is the answer
    want = {name: np.concatenate([_metrics(bridge, one, zero)[name] for one in alone]) for name in ("loss", "target_logit")}
    for strategy in ("auto", "full"):
        got = _metrics(bridge, batch, zero, strategy)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], atol=2e-4, err_msg=f"{padding} {strategy} {name}")


def test_padded_statistics_average_real_tokens_only(bridge):
    """mean, mean-per-position and token-wise-mean on a right-padded batch against the same sums by hand
    over each prompt's own (unpadded) z; left padding gives the same all-position and token means."""
    tokenizer = byte_tokenizer(add_bos=True)
    own = []  # per prompt: (tokens [len], z of layer 1 [len, head, d_head])
    for record in PROMPTS:
        one = _file([record]).build_batch(tokenizer, 64)
        _, cache = bridge.run_with_cache(one.tokens)
        own.append((one.tokens[0], cache[Z1][0]))
    modes = [Ablation(heads=HEADS, mode=mode) for mode in ("mean", "mean-per-position", "token-wise-mean")]
    right = _file(PROMPTS, "right").build_batch(tokenizer, 64)
    left = _file(PROMPTS, "left").build_batch(tokenizer, 64)
    stats = {side: compute_replacements(bridge, batch.tokens, modes, attention_mask=batch.attention_mask)
             for side, batch in (("right", right), ("left", left))}
    every_z = torch.cat([z for _, z in own])  # [78 real tokens, head, d_head]
    for side in stats:
        torch.testing.assert_close(stats[side].values[("mean", Z1)], every_z.mean(dim=0), atol=1e-5, rtol=1e-5)
    per_position = stats["right"].values[("position", Z1)]  # [30, head, d_head]
    for t in (0, 20, 21, 29):  # position 21: only the 30-token prompt; 29 likewise
        want = torch.stack([z[t] for _, z in own if z.shape[0] > t]).mean(dim=0)
        torch.testing.assert_close(per_position[t], want, atol=1e-5, rtol=1e-5)
    every_token = torch.cat([tokens for tokens, _ in own])
    for side, batch in (("right", right), ("left", left)):
        table = stats[side].values[("token", Z1)]
        index = stats[side].token_index
        for token in (ord("a"), ord(" "), 256):  # 256: BOS, at the start of every prompt
            where = (batch.tokens == token) & (batch.attention_mask == 1)
            row = int(index[where][0])
            torch.testing.assert_close(table[row], every_z[every_token == token].mean(dim=0), atol=1e-5, rtol=1e-5)


def test_ablate_cli_and_a_worker_on_a_probe_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path / "home"))
    make_fake_zoo(zoo_dir(), MODEL, "gpt_neox", steps=(0,))
    out = tmp_path / "ablate.json"
    assert main(["ablate", MODEL, "--heads", "L1H0,L1H2", "--probe-file", str(EXAMPLE_PROBES), "--padding", "left",
                 "--controls", "3", "--mode", "mean", "--json", str(out)]) == 0
    result = json.loads(out.read_text())["result"]
    batch_spec = result["provenance"]["batch"]
    assert batch_spec["task"] == "probe-file" and batch_spec["name"] == "ioi_example.jsonl"
    assert len(batch_spec["sha256"]) == 64 and batch_spec["padding"] == "left" and batch_spec["n_examples"] == 8
    capsys.readouterr()
    assert main(["ablate", MODEL, "--heads", "L1H0", "--probe-file", str(EXAMPLE_PROBES), "--controls", "2",
                 "--mode", "all"]) == 0
    assert "verdict the same under every type" in capsys.readouterr().out
    bad = tmp_path / "empty-target.jsonl"
    bad.write_text('{"prompt": "When Mary met John, John gave", "target": ""}\n')
    assert main(["ablate", MODEL, "--heads", "L1H0", "--probe-file", str(bad)]) == 2
    assert "line 1" in capsys.readouterr().err

    # a worker (what a Ray actor runs) gets the file's records in its job and scores what this process scores
    probes = read_probe_file(EXAMPLE_PROBES)
    conditions = (Ablation(heads=HeadSet([(1, 0)]), mode="resample", seed=5),)
    job = _job(ModelRef.parse(MODEL), "step000000", probes, "float32")
    worker = AblationWorker()
    _, (got,), _ = worker.run(replace(job, conditions=conditions))
    model = worker.model
    _, (want,) = run_conditions(model, probes.build_batch(model.tokenizer, 64), conditions)
    np.testing.assert_array_equal(got.loss, want.loss)


def test_the_screen_reads_the_prompts_whose_query_token_repeats(bridge):
    """Prompt 3's query token (" ", query_pos 18 of "one two three, one t") repeats, prompt 2's last token "b"
    repeats, but a prompt whose query token is new is left out and named; the pass's per-head outputs at each
    query equal the prompt's own unpadded run."""
    new_token = {"prompt": "abcdefghij", "target": "k"}  # "j" occurs once: no induction key
    records = PROMPTS + [new_token]
    probe = _file(records)
    batch = pattern_batch_for(probe, bridge)
    assert batch.n_examples == 3 and batch.spec["left_out_lines"] == [4]
    assert batch.spec["pattern_found"] == [True] * 3 and len(batch.spec["sha256"]) == 64
    stats = collect_head_stats(bridge, batch)
    tokenizer = byte_tokenizer(add_bos=True)
    for i, record in enumerate(PROMPTS):
        alone = collect_head_stats(bridge, _file([record]).build_batch(tokenizer, 64))
        torch.testing.assert_close(stats.z_query[i], alone.z_query[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(stats.attn_patterns[:, i], alone.attn_patterns[:, 0], atol=1e-5, rtol=1e-5)
    with pytest.raises(HeadLabError, match="pad probe files on the right"):
        pattern_batch_for(_file(PROMPTS, "left"), bridge)
    with pytest.raises(HeadLabError, match="needs prompts with repeated tokens"):
        pattern_batch_for(_file([new_token]), bridge)


def test_probe_and_screen_cli_on_a_probe_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path / "home"))
    make_fake_zoo(zoo_dir(), MODEL, "gpt_neox", steps=(0, 10, 100))
    out = tmp_path / "probe.json"
    assert main(["probe", MODEL, "--all-checkpoints", "--probe-file", str(EXAMPLE_PROBES), "--json", str(out)]) == 0
    probed = json.loads(out.read_text())
    assert probed["task"] == "probe-file" and [row["status"] for row in probed["checkpoints"]] == ["computed"] * 3
    out = tmp_path / "screen.json"
    assert main(["screen", MODEL, "--probe-file", str(EXAMPLE_PROBES), "--json", str(out)]) == 0
    screened = json.loads(out.read_text())
    assert screened["probe_spec"]["sha256"] == probed["probe_spec"]["sha256"]
    assert screened["probe_spec"]["left_out_lines"] == []  # every example prompt ends in a repeated " "
    capsys.readouterr()
    assert main(["screen", MODEL, "--probe-file", str(EXAMPLE_PROBES), "--padding", "left"]) == 2
    assert "pad probe files on the right" in capsys.readouterr().err
