"""The activation estimate and the chunk size it gives, on hand-made shapes with hand-computed bytes."""

from __future__ import annotations

import pytest
import torch
from transformers import GPTNeoXConfig

from core.errors import HeadLabError
from core.model import memory
from core.model.memory import (ForwardShape, chunk_size_for, element_size, estimate_memory_bytes, forward_bytes,
                               memory_budget, task_resources)

GiB = 2**30

# 4 heads, d_model 8, d_mlp 16, vocabulary 10; 3 tokens
TINY = dict(n_heads=4, d_model=8, d_mlp=16, d_vocab=10)


def test_the_copy_counts_the_hand_computations_assume():
    assert (memory.ATTENTION_COPIES, memory.ATTENTION_UPCASTS, memory.RESIDUAL_COPIES, memory.RESIDUAL_UPCASTS,
            memory.MLP_COPIES, memory.LOGIT_COPIES, memory.METRIC_COPIES) == (3, 2, 20, 4, 4, 2, 3)


def test_element_size_follows_the_dtype():
    assert [element_size(d) for d in (torch.float32, torch.bfloat16, torch.float16)] == [4, 2, 2]


def test_forward_bytes_float32_by_hand():
    shape = ForwardShape(**TINY, element_size=4)
    attention = 4 * 3 * 3 * (3 * 4)  # heads x T x T x 3 copies x 4 bytes = 432
    residual = 3 * 8 * (20 * 4)  # T x d_model x 20 copies x 4 bytes = 1920
    mlp = 3 * 16 * 4 * 4  # T x d_mlp x 4 copies x 4 bytes = 768
    query_logits = 10 * 2 * 4 + 10 * 3 * 4  # one row x 2 copies x 4 bytes + 3 float32 metric copies = 200
    assert forward_bytes(shape, 3) == attention + residual + mlp + query_logits == 3320
    all_logits = 3 * 10 * 2 * 4 + 10 * 3 * 4  # every position unembedded = 360
    assert forward_bytes(shape, 3, logit_rows=3) == attention + residual + mlp + all_logits


def test_half_precision_halves_the_activations_and_adds_the_float32_working_copies():
    full = ForwardShape(**TINY, element_size=4)
    half = ForwardShape(**TINY, element_size=2)
    attention = 4 * 3 * 3 * (3 * 2 + 2 * 4)  # 3 copies x 2 bytes + 2 float32 upcasts = 504
    residual = 3 * 8 * (20 * 2 + 4 * 4)  # 20 copies x 2 bytes + 4 float32 upcasts = 1344
    mlp = 3 * 16 * 4 * 2  # 384, half of float32's 768
    query_logits = 10 * 2 * 2 + 10 * 3 * 4  # metrics stay float32 = 160
    assert forward_bytes(half, 3) == attention + residual + mlp + query_logits == 2392
    # the dtype-sized part is exactly half of float32's; the rest are the float32 copies
    upcasts = 4 * 3 * 3 * 2 * 4 + 3 * 8 * 4 * 4
    metrics = 10 * 3 * 4
    assert forward_bytes(half, 3) - upcasts - metrics == (forward_bytes(full, 3) - metrics) // 2


def test_chunk_is_the_largest_power_of_two_that_fits_clamped_to_n():
    assert chunk_size_for(per_example=100, n=1000, budget=1000) == 8  # 10 fit -> 8
    assert chunk_size_for(per_example=100, n=1000, budget=1599) == 8  # 15 fit -> 8
    assert chunk_size_for(per_example=100, n=1000, budget=1600) == 16
    assert chunk_size_for(per_example=100, n=5, budget=10**9) == 5  # never more than n
    assert chunk_size_for(per_example=100, n=1000, budget=100) == 1
    assert chunk_size_for(per_example=100, n=1000, budget=1000, reserved=500) == 4  # 5 fit beside the results


def test_not_even_one_example_is_a_clear_error():
    with pytest.raises(HeadLabError, match=r"not even one example fits.*shorter sequences.*smaller dtype.*another device"):
        chunk_size_for(per_example=101, n=10, budget=100)
    with pytest.raises(HeadLabError, match="for the results"):  # the outputs alone leave no room
        chunk_size_for(per_example=10, n=10, budget=100, reserved=95)


def test_budget_is_the_safety_fraction_of_what_is_free():
    assert memory_budget("cpu", available_bytes=1000) == int(1000 * memory.SAFETY_FRACTION)
    assert 0 < memory.SAFETY_FRACTION < 1
    assert 0 < memory_budget("cpu") < memory.available_memory_bytes("cpu")


@pytest.mark.parametrize("bad", ["n_heads", "element_size"])
def test_shape_sizes_must_be_positive(bad):
    with pytest.raises(HeadLabError, match=f"ForwardShape.{bad} is 0"):
        ForwardShape(**{**TINY, "element_size": 4, bad: 0})


def test_pythia_1b_at_the_reference_length_fits_24_gib():
    """Pythia-1B (16 x 8 heads, d_model 2048, d_ff 8192, vocab 50304), T = 256, float32, 24 GiB machine."""
    config = GPTNeoXConfig(vocab_size=50304, hidden_size=2048, num_hidden_layers=16, num_attention_heads=8,
                           intermediate_size=8192, tie_word_embeddings=False)
    weights = estimate_memory_bytes(config)
    assert weights < 24 * GiB  # the weights load
    shape = ForwardShape(n_heads=8, d_model=2048, d_mlp=8192, d_vocab=50304, element_size=4)
    per_example = forward_bytes(shape, 256)
    budget = memory_budget("cpu", available_bytes=24 * GiB - weights)
    chunk = chunk_size_for(per_example, 2000, budget, reserved=2000 * 200_000)  # ~0.4 GB of results
    assert chunk >= 1 and chunk * per_example + 2000 * 200_000 <= budget
    assert chunk >= 32  # far from one example at a time


def test_task_resources_cpu_one_core_gpu_eighths():
    """A CPU task reserves one core; a CUDA task the eighths of one GPU its estimate takes (1/8 .. 1)."""
    small = GPTNeoXConfig(num_hidden_layers=2, num_attention_heads=4, hidden_size=64, intermediate_size=256, vocab_size=260)
    assert task_resources(small, torch.float32, "cpu") == (1.0, 0.0)
    need = estimate_memory_bytes(small, torch.float32)
    assert task_resources(small, torch.float32, "cuda", gpu_bytes=100 * need) == (1.0, 0.125)  # 1% -> the smallest share
    assert task_resources(small, torch.float32, "cuda", gpu_bytes=int(need / 0.3)) == (1.0, 0.375)  # 30% -> 3/8
    assert task_resources(small, torch.float32, "cuda", gpu_bytes=need // 2) == (1.0, 1.0)  # more than one GPU: capped at 1
