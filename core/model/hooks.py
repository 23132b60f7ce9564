"""Hook names and the views of a loaded model that HeadLab reads: shape, device, dtype, family, W_O, bias.

Hook names are made here, never typed out (like TransformerLens's `get_act_name`): a model loaded
by `core.model.loading.load_model` is a TransformerBridge whose hooks sit at
`blocks.{layer}.attn.hook_z` etc. Weights are raw (no folding), so `hook_name("z", l)` is exactly
the input of the model's own output projection and
`einsum("...hd,hdm->...m", hook_z, head_output_weights(model)[l]) + output_bias(model, l)` is the
attention output (METHODS.md, Step 1 pitfall).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch

from core.errors import HeadLabError

# kind -> hook name; "{layer}" marks the kinds that belong to one block.
HOOK_NAMES = {
    "z": "blocks.{layer}.attn.hook_z",  # [batch, pos, head, d_head], the output projection's input
    "pattern": "blocks.{layer}.attn.hook_pattern",  # [batch, head, query, key]
    "attn_out": "blocks.{layer}.attn.hook_out",  # [batch, pos, d_model]
    "resid_pre": "blocks.{layer}.hook_resid_pre",  # [batch, pos, d_model], the residual entering the block
    # [batch, pos, head, d_model]: each head's own copy of resid_pre before its query / key / value
    # (only while cfg.use_split_qkv_input is on; path patching sets it)
    "q_input": "blocks.{layer}.attn.hook_q_input",
    "k_input": "blocks.{layer}.attn.hook_k_input",
    "v_input": "blocks.{layer}.attn.hook_v_input",
    "mlp_out": "blocks.{layer}.hook_mlp_out",  # [batch, pos, d_model], HookedTransformer-style bridges
    "mlp_module_out": "blocks.{layer}.mlp.hook_out",  # [batch, pos, d_model], the bridge's MLP module
    # [batch * pos, expert] on MoE; a gated dense MLP's gate projection has the same name
    "router_logits": "blocks.{layer}.mlp.gate.hook_out",
    "expert_indices": "blocks.{layer}.mlp.hook_expert_indices",  # [batch * pos, top_k] (MoE)
    "unembed_in": "unembed.hook_in",  # [batch, pos, d_model], the final residual after the norm
}


def hook_name(kind: str, layer: int | None = None) -> str:
    """The hook name for `kind` (a key of HOOK_NAMES) at `layer`; layer is needed for block hooks."""
    template = HOOK_NAMES.get(kind)
    if template is None:
        raise HeadLabError(f"unknown hook kind {kind!r}; use one of {', '.join(HOOK_NAMES)}.")
    if "{layer}" not in template:
        return template
    if layer is None:
        raise HeadLabError(f"hook kind {kind!r} belongs to one block; pass its layer.")
    return template.format(layer=int(layer))


def mlp_hook_name(model: Any, layer: int) -> str:
    """The bridge's hook on one MLP's output (the MLP's contribution to the residual stream).

    Its name differs by family, so the first of "mlp_out", "mlp_module_out" the model has is used.
    """
    for kind in ("mlp_out", "mlp_module_out"):
        name = hook_name(kind, layer)
        if name in model.hook_dict:
            return name
    raise HeadLabError(f"this model exposes no MLP output hook for layer {layer}; MLP ablation needs a TransformerBridge model.")


def router_logit_hooks(model: Any) -> dict[int, str]:
    """MoE layers -> the hook holding that layer's router logits, [batch * pos, n_experts].

    The rows are the flattened (batch, pos) tokens in row-major order: reshape to
    [batch, pos, n_experts] and softmax over the last axis for the router weights. Empty for dense
    models. (`blocks.{l}.mlp.hook_expert_weights` holds only the top-k weights, zeros elsewhere.)
    """
    hooks = {}
    for layer in range(int(model.cfg.n_layers)):
        name = hook_name("router_logits", layer)
        if name in model.hook_dict and hook_name("expert_indices", layer) in model.hook_dict:
            hooks[layer] = name
    return hooks


def _bind(fn: Callable, layer: int) -> Callable:
    """A TransformerLens hook fn(tensor, hook) that calls fn(tensor, hook, layer)."""
    def hook(tensor, hook):
        return fn(tensor, hook, layer)
    return hook


# ----------------------------------------------------------------------------- shape, device, dtype, family


def mask_kwargs(attention_mask: torch.Tensor | None) -> dict:
    """A forward's keyword arguments for an attention mask [row, pos] (none when nothing is padded)."""
    return {} if attention_mask is None else {"attention_mask": attention_mask}


def model_shape(model: Any) -> tuple[int, int, int]:
    """(n_layers, n_heads, d_head) of a loaded bridge."""
    return int(model.cfg.n_layers), int(model.cfg.n_heads), int(model.cfg.d_head)


def model_device(model: Any) -> torch.device:
    """The device of the model's first parameter (cpu for a model without parameters)."""
    for param in model.parameters():
        return param.device
    return torch.device("cpu")


def model_dtype(model: Any) -> torch.dtype:
    """The dtype of the model's first floating-point parameter (float32 for a model without one)."""
    for param in model.parameters():
        if param.is_floating_point():
            return param.dtype
    return torch.float32


def family_of(hf_config: Any) -> str:
    """The model family from a Hugging Face config: "gpt_neox", "llama", "olmoe", ... (model_type)."""
    return str(getattr(hf_config, "model_type", "") or "unknown")


def model_family(model: Any) -> str:
    """The Hugging Face model_type of a loaded bridge (e.g. "gpt_neox", "olmoe")."""
    return family_of(getattr(model.original_model, "config", None))


def model_context_length(model: Any) -> int | None:
    """Longest sequence the model accepts (max_position_embeddings / n_ctx), None when unknown."""
    config = getattr(model.original_model, "config", None)
    for value in (getattr(config, "max_position_embeddings", None), getattr(model.cfg, "n_ctx", None)):
        if isinstance(value, int) and value > 0:
            return value
    return None


def model_vocab_size(model: Any) -> int:
    """Token ids the model can read: the HF config's vocab_size, else the bridge's d_vocab."""
    config = getattr(model.original_model, "config", None)
    return int(getattr(config, "vocab_size", None) or model.cfg.d_vocab)


# ----------------------------------------------------------------------------- output weights


def _output_projection(model: Any, layer: int) -> torch.nn.Module:
    """The HF module that maps the concatenated head outputs (hook_z) to the residual stream."""
    return model.blocks[layer].attn.o.original_component


def head_output_weights(model: Any) -> torch.Tensor:
    """W_O slices: [layer, head, d_head, d_model], laid out so that
    `einsum("...hd,hdm->...m", hook_z, W[l])` + output_bias == the attention output.

    Read from the HF output projection (an nn.Linear, weight [d_model, head * d_head]): hook_z is
    the projection's input split head-major, so head h owns input columns h*d_head:(h+1)*d_head.
    """
    n_layers, n_heads, d_head = model_shape(model)
    slices = []
    for layer in range(n_layers):
        proj = _output_projection(model, layer)
        if isinstance(proj, torch.nn.Linear):
            weight = proj.weight.detach().T  # [head * d_head, d_model]
        else:  # GPT-2 style Conv1D stores [in, out] already
            weight = proj.weight.detach()
        if weight.shape[0] != n_heads * d_head:
            raise HeadLabError(
                f"layer {layer}'s output projection has {weight.shape[0]} inputs, not "
                f"{n_heads} heads x {d_head}; this architecture is not supported."
            )
        slices.append(weight.reshape(n_heads, d_head, weight.shape[1]))
    return torch.stack(slices)  # [layer, head, d_head, d_model]


def output_bias(model: Any, layer: int) -> torch.Tensor | None:
    """The output projection's bias [d_model] at `layer`, or None (Llama, OLMoE have none)."""
    bias = getattr(_output_projection(model, layer), "bias", None)
    return None if bias is None else bias.detach()


_HOOK_NAMES: "weakref.WeakKeyDictionary[Any, frozenset[str]]" = weakref.WeakKeyDictionary()


def bridge_hook_names(model: Any) -> frozenset[str]:
    """The names of a model's hooks, read once per model: each read of a bridge's hook_dict rebuilds its alias
    table (~16 ms on SmolLM2), and a patched or edge run asks for them in every forward."""
    try:
        return _HOOK_NAMES[model]
    except (KeyError, TypeError):
        names = frozenset(getattr(model, "hook_dict", {}))
        try:
            _HOOK_NAMES[model] = names
        except TypeError:  # not weakly referable: read every time
            pass
        return names
