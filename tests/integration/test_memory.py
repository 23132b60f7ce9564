"""Memory-aware chunks on real bridges: lean forwards keep no layer's tensors, the chunk follows the
free memory, and the estimate is an upper bound of the resident memory one chunk really adds."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from transformer_lens.model_bridge import TransformerBridge
from transformers import AutoModelForCausalLM, GPTNeoXConfig

import core.ablation.engine as engine
from core.ablation.edges import EdgeSettings, edge_attribution, edge_graph_of
from core.ablation.edges.memory import edge_forward_bytes, edge_pair_bytes
from core.ablation.edges.runs import edge_chunks, mean_value
from core.ablation.engine import _example_bytes, run_conditions
from core.ablation.spec import Ablation
from core.errors import HeadLabError
from core.heads import HeadSet
from core.model.memory import ForwardShape, lean_forward
from core.probe import collect_head_stats, probe_chunk_size, probe_example_bytes
from core.tasks import InductionProbeSpec
from core.tasks.counterfactual import InductionCounterfactualSpec
from tests.tiny_models import save_tiny_model

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def neox(tmp_path_factory):
    path = save_tiny_model("gpt_neox", tmp_path_factory.mktemp("neox"), seed=0)
    hf = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager")
    return TransformerBridge.boot_transformers(str(path), hf_model=hf).eval()


def test_lean_forward_keeps_no_layer_state_and_changes_no_logit(neox):
    tokens = torch.randint(0, 256, (3, 20), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        plain = neox(tokens)
        assert all(block.attn._pattern is not None for block in neox.blocks)  # what lean_forward drops
        with lean_forward(neox):
            assert neox.original_model.config.use_cache is False  # no KV cache of every layer
            lean = neox(tokens)
            assert all(block.attn._pattern is None for block in neox.blocks)
    assert neox.original_model.config.use_cache is True  # restored
    assert torch.equal(plain, lean)


def test_forward_shape_of_a_bridge(neox):
    # tiny GPT-NeoX: 4 heads, d_model 32, d_mlp 128, 260 tokens, float32
    assert ForwardShape.of_model(neox) == ForwardShape(n_heads=4, d_model=32, d_mlp=128, d_vocab=260, element_size=4)


def test_probe_chunk_follows_the_free_memory(neox):
    batch = InductionProbeSpec(n_examples=10, seq_len=40, token_low=0, token_high=256, seed=3).build()
    assert probe_chunk_size(neox, 10, 40, available_bytes=2**40) == 10  # plenty: one chunk
    small = probe_chunk_size(neox, 10, 40, available_bytes=2**21)
    assert 1 <= small < 10 and small & (small - 1) == 0  # a power of two
    with pytest.raises(HeadLabError, match="not even one example fits.*--seq-len"):
        probe_chunk_size(neox, 10, 40, available_bytes=2**12)
    followed = collect_head_stats(neox, batch)  # chunk_size=None: memory decides
    fixed = collect_head_stats(neox, batch, chunk_size=3)
    for name, tensor in followed.to_tensors().items():
        torch.testing.assert_close(fixed.to_tensors()[name], tensor, atol=1e-6, rtol=0, msg=name)


# ---------------------------------------------------------------------------------------- upper bound


def _reset_peak() -> bool:
    """Hand freed heap back to the system (glibc) and reset this process's peak resident memory
    (Linux >= 4.0: clear_refs "5"), so the next peak is the next run's own; False where refused."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _peak_rss() -> int:
    """The peak resident bytes, VmHWM, which clear_refs resets. (Not getrusage's ru_maxrss: it also
    keeps the peak seen whenever one of the process's threads exited, which no reset clears, so an
    early peak of the set-up can hide the chunk's.)"""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # the kernel counts kB
    raise AssertionError("/proc/self/status has no VmHWM line")


def _peak_growth(run) -> int:
    """Bytes the peak resident memory rose by while `run()` ran."""
    before = _peak_rss()
    run()
    return _peak_rss() - before


def measure_peaks() -> None:
    """Run in a fresh process: one probe chunk, then one ablation example batch, each after resetting
    the peak resident memory, on a random 12-layer GPT-NeoX at T = 256. Prints, as JSON, each one's
    growth of the peak and its estimate (both None where the kernel refuses the reset)."""
    torch.set_num_threads(1)
    n_layers, n, seq_len = 12, 24, 256
    config = GPTNeoXConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=n_layers, num_attention_heads=8,
                           intermediate_size=256, max_position_embeddings=512, rotary_pct=0.25,
                           use_parallel_residual=True, tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        model = TransformerBridge.boot_transformers(folder, hf_model=hf).eval()
    batch = InductionProbeSpec(n_examples=n, seq_len=seq_len, token_low=100, token_high=1000, seed=0).build()
    warm = InductionProbeSpec(n_examples=1, seq_len=8, token_low=100, token_high=1000, seed=0).build()
    conditions = [Ablation(HeadSet(((layer, 0),))) for layer in (0, n_layers // 2)]
    collect_head_stats(model, warm, chunk_size=1)  # lazy set-up out of the way
    run_conditions(model, warm, conditions[:1])

    if not _reset_peak():
        print(json.dumps({"probe": None, "engine": None, "edges_eap": None, "edges_patched": None}))
        return
    per_example, stored = probe_example_bytes(model, seq_len)  # the results are written during the chunk
    out = {"probe": {"measured": _peak_growth(lambda: collect_head_stats(model, batch, chunk_size=n)),
                     "estimate": n * (per_example + stored)}}
    for block in model.blocks:  # a clean slate: nothing the probe's forward may have left behind
        block.attn._pattern = None
    _reset_peak()
    estimate = n * _example_bytes(model, seq_len, n_kept=3)  # the two start layers' residuals + the final one
    engine._auto_example_batch = lambda *args: n  # all n examples in one batch (n = 24 is not a power of two)
    out["engine"] = {"measured": _peak_growth(lambda: run_conditions(model, batch, conditions)),
                     "estimate": estimate}
    out.update(measure_edge_peaks(model))
    print(json.dumps(out))


def measure_edge_peaks(model, n_pairs: int = 8, seq_len: int = 64) -> dict:
    """An edge run's peak growth against its estimate (core.ablation.edges.memory), one chunk of n_pairs: EAP
    end to end (the recorded runs kept, the gradient pass) and one patched forward with half the edges removed."""
    spec = InductionProbeSpec(n_examples=n_pairs, seq_len=seq_len, token_low=100, token_high=1000, seed=1)
    pair = InductionCounterfactualSpec(spec, seed=0).build()
    settings = EdgeSettings(allow_small_gap=True, batch_size=n_pairs)  # random weights: no gap to keep
    graph, shape = edge_graph_of(model), ForwardShape.of_model(model)
    edge_attribution(model, pair.select(slice(0, 1)), settings)  # lazy set-up out of the way
    _reset_peak()
    out = {"edges_eap": {"measured": _peak_growth(lambda: edge_attribution(model, pair, settings)),
                         "estimate": n_pairs * edge_pair_bytes(shape, graph, seq_len, grad=True)}}
    chunks, _ = edge_chunks(model, pair, settings, graph)
    removed = np.random.default_rng(0).random(graph.n_edges) < 0.5
    _reset_peak()
    out["edges_patched"] = {"measured": _peak_growth(lambda: mean_value(model, graph, chunks, removed, "logit_diff")),
                            "estimate": n_pairs * edge_forward_bytes(shape, graph, seq_len, grad=False)}
    return out


@pytest.fixture(scope="module")
def peaks() -> dict:
    code = "from tests.integration.test_memory import measure_peaks; measure_peaks()"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the peak resident memory is read from Linux's /proc")
@pytest.mark.parametrize("what", ["probe", "engine", "edges_eap", "edges_patched"])
def test_estimate_bounds_the_measured_peak(peaks, what):
    """One chunk's peak resident growth stays under the estimate, and is a real share of it (else the
    measurement missed the chunk). Without lean_forward the twelve layers' kept attention patterns
    and KV cache take it over the estimate, so the bound fails."""
    if peaks[what] is None:
        pytest.skip("this kernel refuses to reset the peak resident memory (/proc/self/clear_refs)")
    measured, estimate = peaks[what]["measured"], peaks[what]["estimate"]
    assert measured <= estimate, peaks[what]
    assert measured >= 0.2 * estimate, peaks[what]
