"""Precision choices: the one parse function, its error, the memory estimate at each dtype, and --dtype on every command."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from core.__main__ import build_parser
from core.errors import HeadLabError
from core.model.loading import DEFAULT_DTYPE, DTYPES, check_device, dtype_name, parse_dtype
from core.model.memory import ACTIVATION_MARGIN_BYTES, estimate_memory_bytes

# every command that loads a model, with the arguments it needs besides --dtype
MODEL_COMMANDS = {
    "probe": ["m"], "screen": ["m"], "ablate": ["m", "--heads", "L0H0"], "recipe": ["m"],
    "attribution": ["m", "--task", "reverse"], "proposers": ["m"], "export": ["m", "--figure", "all", "--out", "x"],
    "coactivation": ["m"], "replicate": ["spectral"], "bench probe": [], "bench ablation": [], "bench scale": [],
    "bench live": [],
}


def test_parse_dtype_names_and_torch_dtypes():
    assert DEFAULT_DTYPE == "float32" and tuple(DTYPES) == ("float32", "bfloat16", "float16")
    for name, torch_dtype in DTYPES.items():
        assert parse_dtype(name) is torch_dtype
        assert parse_dtype(torch_dtype) is torch_dtype
        assert dtype_name(name) == dtype_name(torch_dtype) == name


@pytest.mark.parametrize("bad", ["fp16", "half", "Float16", "float64", torch.float64, torch.int8, None])
def test_parse_dtype_refuses_anything_else_naming_the_choices(bad):
    with pytest.raises(HeadLabError, match="use one of float32, bfloat16, float16"):
        parse_dtype(bad)
    with pytest.raises(HeadLabError, match="unknown dtype"):
        dtype_name(bad)


def test_memory_estimate_follows_the_dtype():
    config = SimpleNamespace(hidden_size=64, vocab_size=1000, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=256, model_type="gpt_neox", tie_word_embeddings=False)
    full = estimate_memory_bytes(config, parse_dtype("float32")) - ACTIVATION_MARGIN_BYTES
    for name in ("bfloat16", "float16"):
        half = estimate_memory_bytes(config, parse_dtype(name)) - ACTIVATION_MARGIN_BYTES
        assert half == pytest.approx(full / 2, abs=1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a GPU")
def test_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises(HeadLabError, match="no CUDA GPU is present; use cpu"):
        check_device("cuda")
    assert check_device("cpu") == "cpu"


@pytest.mark.parametrize("command", sorted(MODEL_COMMANDS))
def test_every_model_command_takes_dtype_and_device(command, capsys):
    parser = build_parser()
    argv = command.split() + MODEL_COMMANDS[command]
    args = parser.parse_args(argv)
    assert args.dtype == "float32" and args.device == "cpu"
    args = parser.parse_args(argv + ["--dtype", "float16"])
    assert args.dtype == "float16"
    if torch.cuda.is_available():
        assert parser.parse_args(argv + ["--device", "cuda"]).device == "cuda"
    else:  # the device is checked as the flags are read, before any work
        with pytest.raises(SystemExit):
            parser.parse_args(argv + ["--device", "cuda"])
        assert "no CUDA GPU is present" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(argv + ["--dtype", "fp16"])
    assert "invalid choice: 'fp16'" in capsys.readouterr().err
