"""Head roles on the IOI task as Wang et al. (2022, section 3) define them, the top-k edge set's stability across
resamples, and the per-KV-group view of a screen: pure functions over arrays (no model).

Inputs are measured by core/pipelines/study.py on a real model:
- attention from the final position (END) to the indirect object (IO) and to the subject's mentions;
- each head's direct effect on the logit difference (its output at END through the frozen final norm,
  dotted with W_U[IO] - W_U[S]);
- the OV copy score (the share of names whose residual after block 0, embedding and MLP0, sent through the
  head's OV circuit and the unembedding, puts that same name in the top-5 logits; with the sign flipped for
  negative name movers).
"""

from __future__ import annotations

from itertools import combinations
from typing import Sequence

import numpy as np

from core.errors import HeadLabError

# Thresholds of the role labels (the IOI paper's: name movers attend to IO with 0.59 on GPT-2 and copy names
# in >95% of cases against <20% for an average head; the figures here are looser floors, named in the report)
ROLE_ATTENTION = 0.2   # mean attention from END to the name (IO or S2) a mover / S-inhibition head reads
ROLE_EFFECT = 0.05     # |direct effect| as a share of the full model's mean logit difference
ROLE_COPY = 0.5        # share of names copied (top-5) by the head's OV circuit
ROLE_PATTERN = 0.3     # mean attention to S1 (duplicate-token), S1 + 1 (induction), at S2


def gathered_attention(pattern_rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Mean over examples of the attention each head pays from its query row to one key position per example.

    pattern_rows: [example, layer, head, key] (the query row already chosen, e.g. END); positions: [example]
    key index. Returns [layer, head].
    """
    rows = np.asarray(pattern_rows, dtype=np.float64)
    pos = np.asarray(positions, dtype=np.int64)
    if rows.ndim != 4 or pos.shape != (rows.shape[0],):
        raise HeadLabError(f"expected pattern rows [example, layer, head, key] and one position per example, got "
                           f"{rows.shape} and {pos.shape}.")
    if pos.min() < 0 or pos.max() >= rows.shape[3]:
        raise HeadLabError(f"a key position lies outside the {rows.shape[3]} keys of the pattern rows.")
    picked = rows[np.arange(rows.shape[0]), :, :, pos]  # [example, layer, head]
    return picked.mean(axis=0)


def direct_effects(head_out: np.ndarray, direction: np.ndarray) -> np.ndarray:
    """Each head's direct effect on a logit difference: mean over examples of head_out . direction.

    head_out: [example, layer, head, d_model], each head's write into the residual at END already divided by the
    final norm's frozen scale (and times its weight); direction: [example, d_model], W_U[IO] - W_U[S] per example.
    Returns [layer, head].
    """
    out = np.asarray(head_out, dtype=np.float64)
    d = np.asarray(direction, dtype=np.float64)
    if out.ndim != 4 or d.shape != (out.shape[0], out.shape[3]):
        raise HeadLabError(f"expected head outputs [example, layer, head, d_model] and a direction [example, d_model], "
                           f"got {out.shape} and {d.shape}.")
    return np.einsum("elhm,em->lh", out, d) / out.shape[0]


def copy_scores(name_logits: np.ndarray, name_ids: Sequence[int], k: int = 5) -> float:
    """Share of names whose own token is in the top-k of the logits their OV output gives.

    name_logits: [name, vocab], row i the logits from name i's embedding through one head's OV circuit;
    name_ids: [name] the token id of each name.
    """
    logits = np.asarray(name_logits, dtype=np.float64)
    ids = np.asarray(name_ids, dtype=np.int64)
    if logits.ndim != 2 or ids.shape != (logits.shape[0],):
        raise HeadLabError(f"expected logits [name, vocab] and one id per name, got {logits.shape} and {ids.shape}.")
    k = min(int(k), logits.shape[1])
    top = np.argpartition(-logits, k - 1, axis=1)[:, :k]
    return float(np.mean([ids[i] in top[i] for i in range(len(ids))]))


def head_roles(attn_io: np.ndarray, attn_s2: np.ndarray, effect: np.ndarray, copy: np.ndarray,
               attn_dup: np.ndarray, attn_ind: np.ndarray, attn_prev: np.ndarray, logit_diff: float,
               neg_copy: np.ndarray | None = None) -> np.ndarray:
    """[layer, head] role labels ("" for none), first rule that holds:

    name mover: END attends to IO >= ROLE_ATTENTION, direct effect >= ROLE_EFFECT of the logit difference, copies;
    negative name mover: the same attention, a direct effect <= -ROLE_EFFECT of it, and its OV copying with the sign
    flipped (neg_copy; `copy` when not given);
    S-inhibition: END attends to S2 >= ROLE_ATTENTION, no direct effect of that size (it acts through later heads);
    induction: from S2 to S1 + 1 >= ROLE_PATTERN; duplicate-token: from S2 to S1 >= ROLE_PATTERN;
    previous-token: from S1 + 1 to S1 >= ROLE_PATTERN.
    attn_*: [layer, head] mean attention; effect: [layer, head] direct effects; copy: [layer, head] copy shares;
    logit_diff: the full model's mean logit difference (the scale of `effect`).
    """
    inputs = (attn_io, attn_s2, effect, copy, attn_dup, attn_ind, attn_prev, copy if neg_copy is None else neg_copy)
    arrays = [np.asarray(a, dtype=np.float64) for a in inputs]
    shape = arrays[0].shape
    if any(a.shape != shape for a in arrays) or len(shape) != 2:
        raise HeadLabError("every head-role input must be one [layer, head] array of the same shape.")
    io, s2, eff, cp, dup, ind, prev, neg = arrays
    scale = abs(float(logit_diff)) if logit_diff else 1.0
    share = eff / scale
    labels = np.full(shape, "", dtype=object)
    rules = [
        ("name mover", (io >= ROLE_ATTENTION) & (share >= ROLE_EFFECT) & (cp >= ROLE_COPY)),
        ("negative name mover", (io >= ROLE_ATTENTION) & (share <= -ROLE_EFFECT) & (neg >= ROLE_COPY)),
        ("S-inhibition", (s2 >= ROLE_ATTENTION) & (np.abs(share) < ROLE_EFFECT)),
        ("induction", ind >= ROLE_PATTERN),
        ("duplicate-token", dup >= ROLE_PATTERN),
        ("previous-token", prev >= ROLE_PATTERN),
    ]
    for name, mask in rules:
        labels[(labels == "") & mask] = name
    return labels


def jaccard(a: set, b: set) -> float:
    """|a & b| / |a | b| (1.0 for two empty sets)."""
    a, b = set(a), set(b)
    union = a | b
    return 1.0 if not union else len(a & b) / len(union)


def mean_pairwise_jaccard(sets: Sequence[set]) -> float:
    """Mean Jaccard overlap over every pair of the sets (at least two)."""
    if len(sets) < 2:
        raise HeadLabError("stability needs at least two edge sets to compare.")
    return float(np.mean([jaccard(a, b) for a, b in combinations(sets, 2)]))


def kv_group_view(classes: np.ndarray, n_kv_heads: int) -> list[dict]:
    """Per layer and KV group: its query heads' classes and whether they share one.

    classes: [layer, head] class labels (e.g. the screen's "induction", "previous_token", "" or "none");
    query head h belongs to group h // (heads / n_kv_heads). Returns one record per (layer, group):
    {"layer", "group", "heads": [h...], "classes": [...], "shared": bool}.
    """
    labels = np.asarray(classes, dtype=object)
    n_layers, n_heads = labels.shape
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise HeadLabError(f"{n_heads} query heads do not split into {n_kv_heads} KV groups.")
    size = n_heads // n_kv_heads
    out = []
    for layer in range(n_layers):
        for group in range(n_kv_heads):
            heads = list(range(group * size, (group + 1) * size))
            names = [str(labels[layer, h]) for h in heads]
            out.append({"layer": layer, "group": group, "heads": heads, "classes": names,
                        "shared": len(set(names)) == 1})
    return out


def group_role_summary(records: list[dict], roles: Sequence[str]) -> dict:
    """For each role: how many groups hold a head of it, and in how many of those every head of the group has it."""
    out = {}
    for role in roles:
        holding = [r for r in records if role in r["classes"]]
        out[role] = {"groups_with_role": len(holding), "groups_all_heads": sum(r["shared"] for r in holding),
                     "heads": sum(r["classes"].count(role) for r in holding)}
    return out
