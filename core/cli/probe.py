"""`python -m core probe`: fill the HeadStats cache for one or every checkpoint, and the probe flags every command shares."""

from __future__ import annotations

import argparse

from tqdm import tqdm

from core.errors import HeadLabError
from core.model.loading import DEFAULT_DTYPE, DTYPES, load_config
from core.model.refs import ModelRef, list_checkpoints, resolve_checkpoint
from core.probe import HEADSTATS_VERSION, check_probe_fits, head_stats, head_stats_key
from core.tasks.specs import TASKS, ProbeSpec, probe_spec


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    """--device and --dtype: where and in which precision every command that loads a model runs it."""
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default=DEFAULT_DTYPE,
                        help="precision of the model's forward pass: float32 (default), bfloat16, or float16 (the "
                             "reference probe's, on a GPU); statistics are accumulated in float32 either way")


def add_probe_spec_arguments(parser: argparse.ArgumentParser) -> None:
    """The probe batch flags every command that runs a probe shares (and --device, --dtype)."""
    parser.add_argument("--task", choices=TASKS, default="induction", help="probe task (default induction)")
    parser.add_argument("--n", type=int, default=256, help="probe sequences N (default 256)")
    parser.add_argument("--seq-len", type=int, default=64, help="probe length T (default 64)")
    parser.add_argument("--seed", type=int, default=42, help="probe seed (default 42)")
    parser.add_argument("--token-low", type=int, default=0, help="induction tokens from (default 0)")
    parser.add_argument("--token-high", type=int, default=256, help="induction tokens below (default 256: bytes)")
    add_device_arguments(parser)


def probe_spec_from_args(args: argparse.Namespace) -> ProbeSpec:
    """The probe spec the flags describe."""
    return probe_spec(args.task, args.n, args.seq_len, args.seed, args.token_low, args.token_high)


def add_probe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="zoo name, local Hugging Face folder or hub name")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--revision", default=None, help="one checkpoint (default: the final one)")
    which.add_argument("--all-checkpoints", action="store_true", help="every checkpoint of the model")
    add_probe_spec_arguments(parser)
    parser.add_argument("--chunk-size", type=int, default=None,
                        help="examples per forward (default: as many as fit in the free memory)")


def cli_probe(args: argparse.Namespace) -> dict:
    """Fill the HeadStats cache for one or all checkpoints, with a progress bar; returns what each one did."""
    ref = ModelRef.parse(args.model)
    if args.all_checkpoints:
        checkpoints = list_checkpoints(ref)
    else:
        checkpoints = [resolve_checkpoint(ref, args.revision)]
    if not checkpoints:
        raise HeadLabError(f"model {ref} lists no checkpoints; train it or pick another model.")
    spec = probe_spec_from_args(args)
    check_probe_fits(spec, load_config(ref, checkpoints[-1].revision))
    batch = spec.build()
    spec_json = dict(batch.spec)

    rows = []
    bar = tqdm(total=len(checkpoints) * batch.n_examples, unit="seq", desc=str(ref.name)[-30:])
    try:
        for ckpt in checkpoints:
            bar.set_postfix_str(ckpt.revision)
            status: list[str] = []
            head_stats(ref, ckpt, batch, device=args.device, chunk_size=args.chunk_size, progress=bar.update,
                       on_status=status.append, dtype=args.dtype)
            if status[0] == "cached":
                bar.update(batch.n_examples)
                tqdm.write(f"{ckpt.revision}: cached")
            rows.append({
                "revision": ckpt.revision, "step": ckpt.step, "tokens": ckpt.tokens, "status": status[0],
                "key": head_stats_key(ref, ckpt.revision, spec_json, args.dtype),
            })
    finally:
        bar.close()
    return {"model": str(ref), "task": args.task, "probe_spec": spec_json, "code_version": HEADSTATS_VERSION,
            "dtype": args.dtype, "checkpoints": rows}
