"""A hand-built attention-only transformer with TransformerBridge's hook names, for known-answer tests.

No norms and no MLPs: the residual at a position is its embedding plus every head's z @ W_O there,
and the logits are that residual @ W_U. So the logits are exactly linear in the last layer's z,
and weights set by hand can confine a head's output to a subspace only one reader sees (a route
isolated by construction). It offers what core/ablation/patching reads from a bridge: cfg,
run_with_hooks / hooks (and stop_at_layer), blocks.{l}.hook_resid_pre, blocks.{l}.attn.hook_z [batch, pos, head, d_head]
and, while cfg.use_split_qkv_input is on, blocks.{l}.attn.hook_{q,k,v}_input [batch, pos, head, d_model].
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint


class HandAttention(nn.Module):
    """Causal softmax attention; W_Q, W_K, W_V [head, d_model, d_head], W_O [head, d_head, d_model]."""

    def __init__(self, cfg: SimpleNamespace):
        super().__init__()
        self.cfg = cfg
        shape_in = (cfg.n_heads, cfg.d_model, cfg.d_head)
        self.W_Q, self.W_K, self.W_V = (nn.Parameter(torch.zeros(shape_in)) for _ in range(3))
        self.W_O = nn.Parameter(torch.zeros(cfg.n_heads, cfg.d_head, cfg.d_model))
        self.hook_q_input, self.hook_k_input, self.hook_v_input = HookPoint(), HookPoint(), HookPoint()
        self.hook_z = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [batch, pos, d_model] -> [batch, pos, d_model]
        if self.cfg.use_split_qkv_input:
            per_head = x[:, :, None, :].expand(-1, -1, self.cfg.n_heads, -1)  # [batch, pos, head, d_model]
            xq, xk, xv = self.hook_q_input(per_head), self.hook_k_input(per_head), self.hook_v_input(per_head)
            q, k, v = (torch.einsum("bphm,hmd->bphd", xi, w) for xi, w in ((xq, self.W_Q), (xk, self.W_K), (xv, self.W_V)))
        else:
            q, k, v = (torch.einsum("bpm,hmd->bphd", x, w) for w in (self.W_Q, self.W_K, self.W_V))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / self.cfg.d_head ** 0.5
        n = x.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
        pattern = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)  # [batch, head, query, key]
        z = self.hook_z(torch.einsum("bhqk,bkhd->bqhd", pattern, v))  # [batch, pos, head, d_head]
        return torch.einsum("bphd,hdm->bpm", z, self.W_O)


class HandBlock(nn.Module):
    def __init__(self, cfg: SimpleNamespace):
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.attn = HandAttention(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        return x + self.attn(x)


class HandModel(HookedRootModule):
    """tokens [batch, pos] -> logits [batch, pos, vocab]: (W_E[tok] + W_pos[pos] + heads) @ W_U."""

    def __init__(self, n_layers: int = 2, n_heads: int = 2, d_model: int = 16, d_head: int = 4, d_vocab: int = 8,
                 n_ctx: int = 16):
        super().__init__()
        self.cfg = SimpleNamespace(n_layers=n_layers, n_heads=n_heads, d_model=d_model, d_head=d_head, d_vocab=d_vocab,
                                   n_ctx=n_ctx, d_mlp=4 * d_model, use_split_qkv_input=False, model_name="hand-made")
        self.original_model = None  # what core.model.hooks reads a Hugging Face config from: none here
        self.W_E = nn.Parameter(torch.zeros(d_vocab, d_model))
        self.W_pos = nn.Parameter(torch.zeros(n_ctx, d_model))
        self.W_U = nn.Parameter(torch.zeros(d_model, d_vocab))
        self.blocks = nn.ModuleList(HandBlock(self.cfg) for _ in range(n_layers))
        self.setup()

    def set_use_split_qkv_input(self, flag: bool) -> None:
        self.cfg.use_split_qkv_input = bool(flag)

    def forward(self, tokens: torch.Tensor, stop_at_layer: int | None = None) -> torch.Tensor:
        """stop_at_layer k: the residual entering block k [batch, pos, d_model] (as TransformerLens models return)."""
        x = self.W_E[tokens] + self.W_pos[: tokens.shape[1]][None]
        for layer, block in enumerate(self.blocks):
            if layer == stop_at_layer:
                return x
            x = block(x)
        return x @ self.W_U


def random_hand_model(seed: int = 0, **shape) -> HandModel:
    """A HandModel with every weight drawn from N(0, 1) (seeded), eval mode."""
    model = HandModel(**shape)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=gen))
    return model.eval()
