"""Models whose circuit is known: the registry of builders, and the ground truth they write (truth.py).

`KNOWN_MODELS` maps a model name to its builder: the hand-wired models (weights written by code,
handwired.py: `HANDWIRED`), the models trained with a planted circuit (planted.py: `PLANTED`) and the
hard planted ones (hard.py: `HARD`: 48 heads, a chain over three or more layers, a backup head,
busy neighbours trained on a second task).

The builder signature, one for every entry:

    builder(out_dir: Path | None = None, progress: bool | Callable[[int, int], None] | None = None) -> Path

builds the model into `out_dir` (default: the zoo folder zoo_dir()/<name>, so `ModelRef.parse(name)`
finds it) and returns that folder. The folder is written inside core.workspace.atomic_directory,
so it either holds the whole model or does not exist: manifest.json, checkpoints/<revision>/
(save_pretrained safetensors weights, config.json and a tokenizer) and circuit.json beside
manifest.json and inside every checkpoint folder. `progress`: True for a progress bar, a callable
progress(done, total), or None / False for silence. A builder called again rebuilds (a hand-wired
model in well under a second); a trained one may resume or skip finished work, as planted.py says.

Readers: `read_circuit(folder_or_ref, n_layers=None, n_heads=None)` and `known_circuit(ref)`.
"""

from core.zoo.known.handwired import HANDWIRED
from core.zoo.known.hard import HARD
from core.zoo.known.planted import PLANTED
from core.zoo.known.truth import (CIRCUIT_FILE, KINDS, KnownCircuit, edge_text, known_circuit, parse_edge,
                                  read_circuit, write_circuit)

KNOWN_MODELS = {**HANDWIRED, **PLANTED, **HARD}


def known_kind(name: str) -> str:
    """"handwired" or "planted": which registry a known model's builder comes from."""
    return "handwired" if name in HANDWIRED else "planted"


__all__ = ["CIRCUIT_FILE", "HANDWIRED", "HARD", "KINDS", "KNOWN_MODELS", "PLANTED", "KnownCircuit", "edge_text",
           "known_circuit", "known_kind", "parse_edge", "read_circuit", "write_circuit"]
