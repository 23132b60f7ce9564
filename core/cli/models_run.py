"""The work of `python -m core models` (core/cli/models.py holds its arguments and their checks): list the zoo or
one model's checkpoints, or import a GGUF file."""

from __future__ import annotations

import argparse

from core.model.gguf import QUANTIZED_NOTE, import_gguf_once, source_text
from core.model.refs import RETRAIN_HINT, ModelRef, list_checkpoints, list_zoo, read_manifest, unfinished_training
from core.workspace import zoo_dir


def import_gguf(args: argparse.Namespace) -> dict:
    """`models import FILE [--name NAME]`: the GGUF file imported into the zoo once."""
    return import_gguf_once(args.file, args.name)


def run_models(args: argparse.Namespace) -> dict:
    """The zoo (no model given), or one model's checkpoints."""
    if args.model is None:
        return list_models()
    ref = ModelRef.parse(args.model)
    checkpoints = list_checkpoints(ref)
    for c in checkpoints:
        tokens = "unknown" if c.tokens < 0 else f"{c.tokens:,}"
        print(f"{c.revision:28s} step {c.step:>9,}  tokens {tokens}")
    unfinished = unfinished_training(ref)
    if unfinished:
        print(f"note: {unfinished}.")
    return {"model": ref.to_json(), "checkpoints": [c.to_json() for c in checkpoints], "unfinished": unfinished}


def list_models() -> dict:
    """Print one line per zoo model (imported ones with licence, source and SHA-256) and return the rows."""
    rows = []
    for name in list_zoo():
        manifest = read_manifest(name)
        config = manifest.get("config", {})
        source = manifest.get("source") or {}
        rows.append({"name": name, "family": manifest.get("family"), "task": manifest.get("task"),
                     "kind": manifest.get("kind", "trained"),
                     "checkpoints": len(manifest["checkpoints"]),
                     "complete": manifest.get("complete"),
                     # how it was trained and what it reached: the zoo docs quote these
                     "shape": {k: config.get("model", {}).get(k) for k in ("n_layers", "n_heads", "d_model")},
                     "steps_trained": manifest["checkpoints"][-1].get("step") if manifest["checkpoints"] else None,
                     "final": manifest.get("final"), "train_seconds": manifest.get("train_seconds"),
                     "threads": manifest.get("threads"),
                     "licence": source.get("licence"), "source": source_text(source) if source else None,
                     "sha256": source.get("sha256"), "quantization": source.get("quantization")})
        row = rows[-1]
        line = f"{name:24s} {str(row['family']):10s} {str(row['task']):12s} {row['checkpoints']:4d} checkpoints"
        if row["complete"] is False:
            line += "  UNFINISHED (training stopped early; rerun its zoo or train command to resume)"
        if source:
            line += (f"  {row['quantization']} from {row['source']}, SHA-256 {row['sha256']}, "
                     f"licence {row['licence'] or 'not stated in the file'}")
        print(line)
    if not rows:
        print(f"the zoo at {zoo_dir()} is empty; train it with {RETRAIN_HINT}")
    elif any(r["kind"] == "imported" for r in rows):
        print(f"note: {QUANTIZED_NOTE}.")
    return {"zoo": str(zoo_dir()), "models": rows}

