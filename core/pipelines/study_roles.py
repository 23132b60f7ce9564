"""The IOI measures that run the model for `study`: each pair's logit difference, and the per-head inputs of
the head roles (core/stats/ioi_roles.py): attention at END, S2 and S1 + 1, direct effects, OV copy scores."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from core.model.hooks import head_output_weights, mask_kwargs, model_shape
from core.stats.ioi_roles import (ROLE_ATTENTION, ROLE_COPY, ROLE_EFFECT, ROLE_PATTERN, copy_scores, direct_effects,
                                  gathered_attention, head_roles)
from core.tasks.counterfactual import PatchPair
from core.tasks.ioi import IoiCounterfactualSpec

CHUNK = 8  # pairs per forward: Gemma-3's logits are 262k wide


def _end_logit_diff(model: Any, tokens: torch.Tensor, mask: torch.Tensor | None, query: torch.Tensor,
                    io: torch.Tensor, s: torch.Tensor) -> np.ndarray:
    """[example] logit[IO] - logit[S] at each prompt's last token, in chunks of CHUNK."""
    out = []
    with torch.no_grad():
        for start in range(0, tokens.shape[0], CHUNK):
            rows = slice(start, start + CHUNK)
            logits = model(tokens[rows], **mask_kwargs(None if mask is None else mask[rows]))  # [b, pos, vocab]
            end = logits[torch.arange(logits.shape[0]), query[rows]].float()  # [b, vocab]
            out.append((end.gather(1, io[rows, None]) - end.gather(1, s[rows, None]))[:, 0].numpy())
    return np.concatenate(out)


def logit_differences(model: Any, pair: PatchPair) -> dict:
    """The full model's logit difference on the clean prompts (mean, share of pairs where IO beats S) and on the
    corrupted ones (the ABC prompts' IO and S logits)."""
    clean = pair.clean
    io, s = clean.target, pair.corrupted_target
    ld = _end_logit_diff(model, clean.tokens, clean.attention_mask, clean.query_pos, io, s)
    corrupted = _end_logit_diff(model, pair.corrupted_tokens, clean.attention_mask, clean.query_pos, io, s)
    return {"clean_mean": float(ld.mean()), "clean_sd": float(ld.std(ddof=1)) if ld.size > 1 else None,
            "share_io_beats_s": float((ld > 0).mean()), "corrupted_mean": float(corrupted.mean()),
            "per_pair": ld.tolist(), "n": int(ld.size)}


def name_positions(spec: IoiCounterfactualSpec) -> dict[str, np.ndarray]:
    """[example] token positions of IO, S1 and S2 in the clean prompts (the spec's own draws)."""
    draws = spec.probe.draw()
    io, s, io_first = draws["io"], draws["s"], draws["io_first"].astype(bool)
    a, b = np.where(io_first, io, s), np.where(io_first, s, io)
    _, _, slots = spec.probe.tokens_of(draws, a, b, s)  # [example, 3]: A, B, S2
    return {"io": np.where(io_first, slots[:, 0], slots[:, 1]), "s1": np.where(io_first, slots[:, 1], slots[:, 0]),
            "s2": slots[:, 2]}


def _has_post_attention_norm(model: Any) -> bool:
    """Gemma-style blocks normalize the attention output before the residual (pre_feedforward_layernorm marks them)."""
    return hasattr(model.blocks[0].original_component, "pre_feedforward_layernorm")


def _final_norm_weight(model: Any) -> torch.Tensor:
    """[d_model] the final norm's effective weight: the norm applied to a vector of ones (RMS 1)."""
    d_model = int(model.cfg.d_model)
    with torch.no_grad():
        return model.ln_final.original_component(torch.ones(1, 1, d_model)).reshape(d_model).float()


def copy_score_grid(model: Any, vectors: torch.Tensor, token_ids: torch.Tensor, k: int = 5, sign: float = 1.0
                    ) -> np.ndarray:
    """[layer, head] OV copy score as Wang et al. compute it: each name's residual after block 0 (its embedding
    through the first attention and MLP0, read at the name's position in the prompt), through the head's layer's
    input norm, its value and output weights (its KV group's W_V), a Gemma block's post-attention norm, the final
    norm's weight and W_U; the share of names whose own token is in the top-k of sign * those logits (sign -1:
    the negative name movers' score).

    vectors: [name, d_model] residuals after block 0; token_ids: [name] each one's token.
    """
    n_layers, n_heads, d_head = model_shape(model)
    w_o = head_output_weights(model).float()  # [layer, head, d_head, d_model]
    unembed = model.unembed.original_component.weight.detach().float() * _final_norm_weight(model)  # [vocab, d_model]
    ids = [int(i) for i in token_ids]
    post = _has_post_attention_norm(model)
    out = np.zeros((n_layers, n_heads))
    with torch.no_grad():
        for layer in range(n_layers):
            block = model.blocks[layer]
            x = block.ln1.original_component(vectors.float()[None])[0].float()  # [name, d_model]
            w_v = block.attn.v.original_component.weight.detach().float()  # [kv * d_head, d_model]
            group = n_heads // (w_v.shape[0] // d_head)
            for head in range(n_heads):
                g = head // group
                v = x @ w_v[g * d_head:(g + 1) * d_head].T  # [name, d_head]
                written = v @ w_o[layer, head]  # [name, d_model]
                if post:
                    written = block.original_component.post_attention_layernorm(written[None])[0].float()
                out[layer, head] = copy_scores(sign * (written @ unembed.T).numpy(), ids, k)
    return out


def ioi_head_roles(model: Any, spec: IoiCounterfactualSpec, pair: PatchPair, logit_diff: float) -> dict:
    """Every head's IOI measures and its role label (core.stats.ioi_roles.head_roles), as JSON lists [layer][head]."""
    n_layers, n_heads, _ = model_shape(model)
    clean = pair.clean
    pos = name_positions(spec)
    end = clean.query_pos.numpy()
    names = ["ln_final.hook_in", "blocks.0.hook_resid_post"] + [f"blocks.{l}.attn.hook_{k}" for l in range(n_layers)
                                                                 for k in ("pattern", "z")]
    rows = {key: [] for key in ("end", "s2", "s1_next")}
    head_out, resid, after_block0 = [], [], []
    w_o = head_output_weights(model).float()  # [layer, head, d_head, d_model]
    with torch.no_grad():
        for start in range(0, clean.n_examples, CHUNK):
            sl = slice(start, start + CHUNK)
            idx = torch.arange(clean.tokens[sl].shape[0])
            mask = None if clean.attention_mask is None else clean.attention_mask[sl]
            _, cache = model.run_with_cache(clean.tokens[sl], names_filter=lambda n: n in names, **mask_kwargs(mask))
            e, s2, s1n = (torch.as_tensor(a[sl]) for a in (end, pos["s2"], pos["s1"] + 1))
            for key, q in (("end", e), ("s2", s2), ("s1_next", s1n)):
                rows[key].append(torch.stack([cache[f"blocks.{l}.attn.hook_pattern"][idx, :, q] for l in range(n_layers)],
                                             dim=1).float().numpy())  # [b, layer, head, key]
            z = torch.stack([cache[f"blocks.{l}.attn.hook_z"][idx, e] for l in range(n_layers)], dim=1).float()
            head_out.append(torch.einsum("blhd,lhdm->blhm", z, w_o))  # [b, layer, head, d_model]
            resid.append(cache["ln_final.hook_in"][idx, e].float())  # [b, d_model]
            names_at = torch.stack([torch.as_tensor(pos[k][sl]) for k in ("io", "s1", "s2")], dim=1)  # [b, 3]
            after_block0.append(cache["blocks.0.hook_resid_post"][idx[:, None], names_at].float())  # [b, 3, d_model]
    rows = {key: np.concatenate(value) for key, value in rows.items()}
    attn = {"io": gathered_attention(rows["end"], pos["io"]), "s1": gathered_attention(rows["end"], pos["s1"]),
            "s2": gathered_attention(rows["end"], pos["s2"]),
            "duplicate": gathered_attention(rows["s2"], pos["s1"]),
            "induction": gathered_attention(rows["s2"], pos["s1"] + 1),
            "previous": gathered_attention(rows["s1_next"], pos["s1"])}
    notes = []
    if _has_post_attention_norm(model):
        effect = np.zeros((n_layers, n_heads))
        notes.append("direct effects not measured: this architecture normalizes each block's summed attention output "
                     "(a post-attention RMSNorm), so a head's own write has no frozen-scale share; the labels that "
                     "need it (name movers) are left out.")
    else:
        resid_end = torch.cat(resid)  # [example, d_model]
        eps = float(getattr(model.ln_final.original_component, "variance_epsilon", 1e-6))
        scale = torch.rsqrt(resid_end.pow(2).mean(-1, keepdim=True) + eps)  # [example, 1]
        written = torch.cat(head_out) * scale[:, None, None, :] * _final_norm_weight(model)
        w_u = model.unembed.original_component.weight.detach().float()
        direction = w_u[clean.target] - w_u[pair.corrupted_target]  # [example, d_model]
        effect = direct_effects(written.numpy(), direction.numpy())
    vectors = torch.cat(after_block0).reshape(-1, int(model.cfg.d_model))  # [example * 3, d_model]: IO, S1, S2
    ids = torch.stack([clean.target, pair.corrupted_target, pair.corrupted_target], dim=1).reshape(-1)  # [example * 3]
    copy = copy_score_grid(model, vectors, ids)
    neg_copy = copy_score_grid(model, vectors, ids, sign=-1.0)
    labels = head_roles(attn["io"], attn["s2"], effect, copy, attn["duplicate"], attn["induction"], attn["previous"],
                        logit_diff, neg_copy)
    table = []
    for layer, head in zip(*np.nonzero(labels != "")):
        table.append({"head": f"L{layer}H{head}", "role": str(labels[layer, head]),
                      **{f"attn_{k}": float(v[layer, head]) for k, v in attn.items()},
                      "direct_effect": float(effect[layer, head]), "copy_score": float(copy[layer, head]),
                      "neg_copy_score": float(neg_copy[layer, head])})
    return {"attention": {k: v.tolist() for k, v in attn.items()}, "direct_effect": effect.tolist(),
            "copy_score": copy.tolist(), "neg_copy_score": neg_copy.tolist(), "table": table, "notes": notes,
            "copy_input": "the residual after block 0 (embedding, first attention, MLP0) at IO, S1 and S2 in the "
                          "clean prompts, through the head's layer's input norm (Wang et al.'s copy score)",
            "thresholds": {"attention": ROLE_ATTENTION, "effect_share": ROLE_EFFECT, "copy": ROLE_COPY,
                           "pattern": ROLE_PATTERN, "copy_top_k": 5}}
