"""core/model/hooks.py without a model: hook names made in one function, and the shape / device views."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from core.errors import HeadLabError
from core.model.hooks import HOOK_NAMES, _bind, hook_name, mlp_hook_name, model_device, model_shape, router_logit_hooks


def test_hook_name_gives_transformer_lens_names():
    assert hook_name("z", 3) == "blocks.3.attn.hook_z"
    assert hook_name("pattern", 0) == "blocks.0.attn.hook_pattern"
    assert hook_name("attn_out", 1) == "blocks.1.attn.hook_out"
    assert hook_name("mlp_out", 2) == "blocks.2.hook_mlp_out"
    assert hook_name("mlp_module_out", 2) == "blocks.2.mlp.hook_out"
    assert hook_name("router_logits", 5) == "blocks.5.mlp.gate.hook_out"
    assert hook_name("expert_indices", 5) == "blocks.5.mlp.hook_expert_indices"
    assert hook_name("unembed_in") == "unembed.hook_in"
    assert hook_name("unembed_in", 4) == "unembed.hook_in"  # a layer is not needed, and ignored


def test_hook_name_refuses_unknown_kind_and_missing_layer():
    with pytest.raises(HeadLabError, match="unknown hook kind 'hook_z'; use one of z, pattern"):
        hook_name("hook_z", 0)
    with pytest.raises(HeadLabError, match="belongs to one block; pass its layer"):
        hook_name("z")
    assert set(HOOK_NAMES) >= {"z", "pattern", "router_logits", "expert_indices", "unembed_in"}


def _fake_model(hooks: list[str], n_layers: int = 2) -> SimpleNamespace:
    cfg = SimpleNamespace(n_layers=n_layers, n_heads=4, d_head=8)
    return SimpleNamespace(cfg=cfg, hook_dict=dict.fromkeys(hooks), parameters=lambda: iter([torch.zeros(1)]))


def test_mlp_hook_name_takes_the_name_the_model_has():
    assert mlp_hook_name(_fake_model(["blocks.1.hook_mlp_out", "blocks.1.mlp.hook_out"]), 1) == "blocks.1.hook_mlp_out"
    assert mlp_hook_name(_fake_model(["blocks.1.mlp.hook_out"]), 1) == "blocks.1.mlp.hook_out"
    with pytest.raises(HeadLabError, match="no MLP output hook for layer 0"):
        mlp_hook_name(_fake_model([]), 0)


def test_router_logit_hooks_need_both_router_hooks():
    model = _fake_model(["blocks.0.mlp.gate.hook_out", "blocks.0.mlp.hook_expert_indices", "blocks.1.mlp.gate.hook_out"])
    assert router_logit_hooks(model) == {0: "blocks.0.mlp.gate.hook_out"}
    assert router_logit_hooks(_fake_model([])) == {}


def test_shape_device_and_bind():
    model = _fake_model([])
    assert model_shape(model) == (2, 4, 8)
    assert model_device(model) == torch.device("cpu")
    assert model_device(SimpleNamespace(parameters=lambda: iter([]))) == torch.device("cpu")
    calls = []
    hook = _bind(lambda tensor, hook, layer: calls.append((tensor, hook, layer)), 3)
    hook("t", "h")
    assert calls == [("t", "h", 3)]
