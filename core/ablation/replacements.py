"""What an ablated activation is replaced by, and the hooks that write it.

An ablation knocks heads out at hook_z (before W_O) and MLPs out at their output hook, at every
position, and writes something in their place (spec.MODE_HELP). Every mode but "zero" needs a
statistic of the clean run on the probe examples; `compute_replacements` gathers them in one pass,
and `Replacements.value` hands a hook the tensor for the examples and positions it sees. With
act = [head, d_head] at hook_z and [d_model] at an MLP output, the statistics are:

- "mean": [*act], one mean over every example AND position: [HHG]'s "mean activation over the OOD
  distribution" and its reference code's. In a model without positional embeddings it also
  removes the position information a head carries.
- "mean-per-position": [pos, *act], the mean over the examples at each position (HeadLab's "mean"
  before issue 18; it keeps what the position alone predicts).
- "resample": [example, pos, *act], every example's clean activation; example i reads example
  donor[i]'s at the same positions, donor a seeded derangement (`derangement`: nobody its own donor).
- "token-wise-mean": [token, *act] over the distinct input tokens of the probe: at (example, pos)
  the mean over every (example', pos') of the probe whose input token is the same token.
- "reference-slice" ([HHG] only): the reference code's overwrite. A head's all-position mean z is
  written over its d_head columns of the attention output AFTER W_O (dense bias included), i.e. over
  residual dimensions h*d_head .. (h+1)*d_head-1 of the whole layer: not a head ablation. MLPs get
  their all-position mean, as in the reference.

Replacements are clean-run values: a donor's activation is its clean one even when an earlier
layer is ablated too, so the prefix path and full forwards write the same numbers.

Padded batches (a probe file's prompts of different lengths, with an attention mask): the means and
token tables average real tokens only, and a position no example fills gets zeros; resample reads
the donor at the same position index, which on prompts of different lengths may be the donor's
padding. What is written at padding positions reaches no real token (the mask hides them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from core.ablation.spec import Ablation
from core.errors import HeadLabError
from core.model.hooks import hook_name, mask_kwargs, mlp_hook_name, model_device, model_shape
from core.model.memory import ForwardShape, chunk_size_for, forward_bytes, lean_forward, memory_budget

# mode -> the clean-run statistic it reads (zero reads none)
STATISTIC = {"mean": "mean", "mean-per-position": "position", "resample": "donor", "token-wise-mean": "token",
             "reference-slice": "mean"}


def derangement(n: int, seed: int) -> np.ndarray:
    """A permutation of range(n) with no fixed point, uniform over such permutations: [n] int64.

    Drawn by rejection from numpy's Generator(seed) (about e draws on average), so it is reproducible.
    """
    if n < 2:
        raise HeadLabError(f"resample ablation needs at least 2 probe examples (each takes another's activation); "
                           f"the probe has {n}: use more examples.")
    rng = np.random.default_rng(seed)
    while True:
        perm = rng.permutation(n)
        if not np.any(perm == np.arange(n)):
            return perm


@dataclass
class Replacements:
    """The clean-run statistics ablations write, from compute_replacements (or by hand in tests).

    values: (statistic, hook name) -> tensor (shapes in the module docstring), float32;
    donors: resample seed -> [example] donor index; token_index: [example, pos] row of each input
    token in the "token" tables.
    """

    values: dict[tuple[str, str], torch.Tensor] = field(default_factory=dict)
    donors: dict[int, torch.Tensor] = field(default_factory=dict)
    token_index: torch.Tensor | None = None

    def value(self, ablation: Ablation, name: str, rows: tuple[int, int], n_pos: int) -> torch.Tensor:
        """What `ablation` writes at hook `name` for examples rows[0]..rows[1]-1 at positions 0..n_pos-1:
        a tensor broadcastable to [rows, n_pos, *act]."""
        if ablation.mode == "zero":
            return torch.zeros(())
        stat = STATISTIC[ablation.mode]
        if (stat, name) not in self.values or (stat == "donor" and ablation.seed not in self.donors):
            raise HeadLabError(f"{ablation.mode} ablation needs the clean statistics of {name}; compute them with "
                               "compute_replacements(model, tokens, ablation).")
        table = self.values[(stat, name)]
        if stat == "mean":
            return table[None, None]
        lo, hi = rows
        if stat == "position":
            _check_positions(ablation, n_pos, int(table.shape[0]))
            return table[None, :n_pos]
        index = self.donors[ablation.seed] if stat == "donor" else self.token_index  # [example] or [example, pos]
        if hi > int(index.shape[0]):
            raise HeadLabError(f"{ablation.mode} ablation has statistics for {index.shape[0]} examples, not {hi}; "
                               "compute them on the batch being ablated.")
        if stat == "donor":
            _check_positions(ablation, n_pos, int(table.shape[1]))
            return table[index[lo:hi], :n_pos]
        _check_positions(ablation, n_pos, int(index.shape[1]))
        return table[self.token_index[lo:hi, :n_pos]]


def _check_positions(ablation: Ablation, n_pos: int, have: int) -> None:
    if n_pos > have:
        raise HeadLabError(f"{ablation.mode} ablation has statistics for {have} positions but the input has {n_pos}; "
                           "compute them on sequences at least as long.")


def replaced_hook_names(model: Any, ablation: Ablation) -> list[str]:
    """The hooks whose clean statistics `ablation` reads (hook_z of its head layers, its MLP outputs)."""
    names = [hook_name("z", layer) for layer in ablation.heads.layers]
    return names + [mlp_hook_name(model, layer) for layer in ablation.mlp_layers]


@torch.no_grad()
def compute_replacements(model: Any, tokens: torch.Tensor, ablations: Ablation | Iterable[Ablation],
                         batch_size: int | None = None, attention_mask: torch.Tensor | None = None) -> Replacements:
    """The clean statistics every ablation in `ablations` writes, in one pass over tokens [example, pos].

    For sequence tasks pass the evaluation set. batch_size: examples per forward (default: as many as
    fit in the free memory). attention_mask: [example, pos] (1 real, 0 padding) of a padded batch; the
    statistics then average real tokens only.
    """
    ablations = [ablations] if isinstance(ablations, Ablation) else list(ablations)
    needs: dict[str, set[str]] = {}  # hook name -> statistics
    for ablation in ablations:
        if ablation.mode != "zero":
            for name in replaced_hook_names(model, ablation):
                needs.setdefault(name, set()).add(STATISTIC[ablation.mode])
    device = model_device(model)
    n, seq_len = int(tokens.shape[0]), int(tokens.shape[1])
    real = (torch.ones(n, seq_len) if attention_mask is None else attention_mask.float()).to(device)  # [example, pos]
    out = Replacements()
    for seed in sorted({a.seed for a in ablations if a.mode == "resample"}):
        out.donors[seed] = torch.as_tensor(derangement(n, seed), device=device)
    if not needs:
        return out
    distinct = torch.zeros(0)
    if any("token" in stats for stats in needs.values()):
        distinct, inverse = torch.unique(tokens, return_inverse=True)
        out.token_index = inverse.to(device)  # [example, pos]
    sums: dict[tuple[str, str], torch.Tensor] = {}
    kept: dict[str, list[torch.Tensor]] = {}
    where = {"lo": 0}  # the first example of the chunk being run

    def add(key: tuple[str, str], value: torch.Tensor) -> None:
        sums[key] = value if key not in sums else sums[key] + value

    def accumulate(act: torch.Tensor, name: str) -> None:
        act = act.detach().float()  # [row, pos, *act]
        weight = real[where["lo"] : where["lo"] + act.shape[0]]  # [row, pos]: 1 real, 0 padding
        counted = act * weight.view(*weight.shape, *([1] * (act.ndim - 2)))  # padding adds nothing to the sums
        for stat in needs[name]:
            if stat == "mean":
                add((stat, name), counted.sum(dim=(0, 1)))
            elif stat == "position":
                add((stat, name), counted.sum(dim=0))
            elif stat == "donor":
                kept.setdefault(name, []).append(act)
            else:
                rows = out.token_index[where["lo"] : where["lo"] + act.shape[0]].reshape(-1)  # [row*pos]
                table = torch.zeros(len(distinct), *act.shape[2:], device=act.device)
                add((stat, name), table.index_add_(0, rows, counted.flatten(0, 1)))

    size = int(batch_size or chunk_size_for(forward_bytes(ForwardShape.of_model(model), seq_len, logit_rows=seq_len), n,
                                            memory_budget(device), "the ablation statistics' clean forward"))
    hooks = [(name, _reading(accumulate, name)) for name in sorted(needs)]
    with lean_forward(model):
        for start in range(0, n, size):
            where["lo"] = start
            mask = mask_kwargs(None if attention_mask is None else attention_mask[start : start + size].to(device))
            model.run_with_hooks(tokens[start : start + size].to(device), fwd_hooks=hooks, **mask)
    # how many real tokens each statistic averages (at least 1: a padding-only position or token gets zeros)
    counts = None if out.token_index is None else torch.bincount(
        out.token_index.reshape(-1), weights=real.reshape(-1), minlength=len(distinct)).clamp(min=1)
    for (stat, name), total in sums.items():
        if stat == "mean":
            out.values[(stat, name)] = total / real.sum()
        elif stat == "position":
            out.values[(stat, name)] = total / real.sum(dim=0).clamp(min=1).view(-1, *([1] * (total.ndim - 1)))
        else:
            out.values[(stat, name)] = total / counts.view(-1, *([1] * (total.ndim - 1))).float()
    for name, parts in kept.items():
        out.values[("donor", name)] = torch.cat(parts)
    return out


def _reading(fn: Callable[[torch.Tensor, str], None], name: str) -> Callable:
    """A hook that hands its activation to fn under `name` (the bridge may resolve an alias to another
    point, whose hook.name differs) and changes nothing."""

    def hook(act, hook=None):
        fn(act, name)
        return act

    return hook


# ----------------------------------------------------------------------------------------------
# Hooks
# ----------------------------------------------------------------------------------------------


def head_mask_rows(ablations: Sequence[Ablation], layer: int, n_heads: int, rows_per: int, device) -> torch.Tensor | None:
    """Bool [condition*rows_per, head]: which heads of `layer` each row ablates; None if none."""
    mask = torch.zeros(len(ablations), n_heads, dtype=torch.bool)
    for i, ablation in enumerate(ablations):
        for l, h in ablation.heads:
            if l == layer:
                mask[i, h] = True
    if not bool(mask.any()):
        return None
    return mask.repeat_interleave(rows_per, dim=0).to(device)


def per_row(value: torch.Tensor, n_rows: int) -> torch.Tensor:
    """A replacement with one row per example [rows_per, ...] repeated for stacked conditions [n_rows, ...]."""
    if value.ndim == 0 or value.shape[0] in (1, n_rows):
        return value
    return value.repeat(n_rows // value.shape[0], *([1] * (value.ndim - 1)))


def ablation_hooks(model: Any, ablations: Sequence[Ablation], rows: tuple[int, int],
                   replacements: Replacements | None) -> list[tuple[str, Callable]]:
    """Forward hooks that apply `ablations` (one mode and seed) to a batch stacked condition-major:
    row = condition*rows_per + example, the examples being rows[0]..rows[1]-1 of the probe."""
    n_layers, n_heads, _ = model_shape(model)
    device = model_device(model)
    rows_per = rows[1] - rows[0]
    first = ablations[0]
    stats = replacements or Replacements()
    hooks: list[tuple[str, Callable]] = []
    for layer in sorted({layer for a in ablations for layer in a.layers}):
        head_rows = head_mask_rows(ablations, layer, n_heads, rows_per, device)
        if head_rows is not None and first.mode == "reference-slice":
            mean_z = stats.value(first, hook_name("z", layer), rows, 1)  # [1, 1, head, d_head]
            hooks.append((hook_name("attn_out", layer), _slice_hook(mean_z, head_rows)))
        elif head_rows is not None:
            name = hook_name("z", layer)

            def z_hook(z, hook=None, mask=head_rows, name=name):
                # z: [row, pos, head, d_head]; mask: [row, head]
                value = per_row(stats.value(first, name, rows, z.shape[1]).to(z.device, z.dtype), z.shape[0])
                return torch.where(mask[:, None, :, None], value, z)

            hooks.append((name, z_hook))
        mlp_rows = torch.tensor([layer in a.mlp_layers for a in ablations], dtype=torch.bool)
        if bool(mlp_rows.any()):
            name = mlp_hook_name(model, layer)
            mask = mlp_rows.repeat_interleave(rows_per).to(device)

            def mlp_hook(out, hook=None, mask=mask, name=name):
                # out: [row, pos, d_model]; mask: [row]
                value = per_row(stats.value(first, name, rows, out.shape[1]).to(out.device, out.dtype), out.shape[0])
                return torch.where(mask[:, None, None], value, out)

            hooks.append((name, mlp_hook))
    return hooks


def _slice_hook(mean_z: torch.Tensor, head_rows: torch.Tensor) -> Callable:
    """The reference code's overwrite at the attention output (after W_O and its bias): columns
    h*d_head .. (h+1)*d_head-1 := head h's all-position mean z, for each ablated head h.

    mean_z: [1, 1, head, d_head]; head_rows: bool [row, head]."""
    n_heads, d_head = int(mean_z.shape[-2]), int(mean_z.shape[-1])
    flat = mean_z.reshape(-1)  # [head*d_head], head-major like the reference's view(B, T, n_heads, d_head)
    columns = head_rows.repeat_interleave(d_head, dim=1)  # [row, head*d_head]

    def hook(out, hook=None):
        # out: [row, pos, d_model]
        if out.shape[-1] != n_heads * d_head:
            raise HeadLabError(f"reference-slice needs d_model = heads x d_head ({n_heads} x {d_head}); this model's "
                               f"attention output has {out.shape[-1]} dimensions. Use another ablation mode.")
        return torch.where(columns[:, None, :], flat.to(out.device, out.dtype), out)

    return hook
