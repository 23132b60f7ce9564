"""`python -m core models [MODEL]`: list the zoo, or one model's checkpoints with their token counts."""

from __future__ import annotations

import argparse

from core.model.refs import RETRAIN_HINT, ModelRef, list_checkpoints, list_zoo, read_manifest
from core.workspace import zoo_dir


def add_models_arguments(parser: argparse.ArgumentParser) -> None:
    """`python -m core models [MODEL]`: list the zoo, or one model's checkpoints."""
    parser.add_argument("model", nargs="?", default=None,
                        help="a zoo name, a local Hugging Face folder or a hub name; omit to list the zoo")


def cli_models(args: argparse.Namespace) -> dict:
    """Print the zoo (no model given) or the model's checkpoints with their token counts."""
    if args.model is None:
        rows = []
        for name in list_zoo():
            manifest = read_manifest(name)
            config = manifest.get("config", {})
            rows.append({"name": name, "family": manifest.get("family"), "task": manifest.get("task"),
                         "checkpoints": len(manifest["checkpoints"]),
                         "complete": manifest.get("complete"),
                         # how it was trained and what it reached: the zoo docs quote these
                         "shape": {k: config.get("model", {}).get(k) for k in ("n_layers", "n_heads", "d_model")},
                         "steps_trained": manifest["checkpoints"][-1].get("step") if manifest["checkpoints"] else None,
                         "final": manifest.get("final"), "train_seconds": manifest.get("train_seconds"),
                         "threads": manifest.get("threads")})
            print(f"{name:24s} {str(rows[-1]['family']):10s} {str(rows[-1]['task']):12s} "
                  f"{rows[-1]['checkpoints']:4d} checkpoints")
        if not rows:
            print(f"the zoo at {zoo_dir()} is empty; train it with {RETRAIN_HINT}")
        return {"zoo": str(zoo_dir()), "models": rows}
    ref = ModelRef.parse(args.model)
    checkpoints = list_checkpoints(ref)
    for c in checkpoints:
        tokens = "unknown" if c.tokens < 0 else f"{c.tokens:,}"
        print(f"{c.revision:28s} step {c.step:>9,}  tokens {tokens}")
    return {"model": ref.to_json(), "checkpoints": [c.to_json() for c in checkpoints]}
