"""The work of `python -m core known` (core/cli/known.py holds its arguments): list the known models, built or not
(built only when the circuit reads, the weights are whole and give the circuit's recorded clean and corrupted logit
differences again), and build the ones asked for."""

from __future__ import annotations

import argparse

from core.errors import HeadLabError
from core.heads import head_name
from core.model.loading import verify_safetensors_folder
from core.model.refs import MANIFEST, ModelRef, checkpoint_path, zoo_model_dir
from core.workspace import zoo_dir
from core.zoo.known import CIRCUIT_FILE, HANDWIRED, KNOWN_MODELS, edge_text, known_kind, read_circuit
from core.zoo.known.handwired import bounds_mismatch


def _row(name: str) -> dict:
    """One known model as the listing shows it: registry kind, whether built, and its circuit when it is."""
    folder = zoo_model_dir(name)
    # exists(), not is_file(): a folder in circuit.json's place is read (and refused as broken), not "not built"
    row = {"name": name, "kind": known_kind(name), "built": (folder / MANIFEST).is_file() and (folder / CIRCUIT_FILE).exists(),
           "folder": str(folder)}
    if row["built"]:
        try:  # "built" only when its weights are there and whole, its circuit reads and the weights give its bounds
            circuit = read_circuit(folder)
            verify_safetensors_folder(checkpoint_path(ModelRef.parse(name)))
            mismatch = bounds_mismatch(name, circuit)
        except HeadLabError as exc:
            mismatch = str(exc).split(';')[0]
        if mismatch:
            row.update(built=False, broken=f"{mismatch}; rebuild it with python -m core known --build {name}")
            return row
        row.update(heads=[head_name(h) for h in circuit.heads], roles=dict(circuit.roles),
                   edges=list(circuit.edge_texts), measured_edges=[edge_text(e) for e in circuit.measured_edges],
                   distractors=[head_name(h) for h in circuit.distractors],
                   ablation=circuit.ablation, metric=circuit.metric, task=dict(circuit.task), bounds=dict(circuit.bounds))
    return row


def bounds_text(row: dict) -> str:
    """What a built model's listing line says of its circuit.json bounds: the logit difference clean and with the
    circuit or every other head ablated, or top-1 where that is what it records (the hard models)."""
    b = row.get("bounds") or {}
    if not row["built"]:
        return ""
    if "true_ablated" in b:
        return (f"  logit diff {b['clean']:.2f} clean, {b['true_ablated']:.3f} circuit ablated, "
                f"{b.get('others_ablated', float('nan')):.2f} others ablated ({row['ablation']})")
    if "top1_true_ablated" in b:
        return (f"  top-1 {b['top1_clean']:.3f} clean, {b['top1_true_ablated']:.3f} circuit ablated, "
                f"{b['top1_others_ablated']:.3f} others ablated ({row['ablation']})")
    return ""


def run_known(args: argparse.Namespace) -> dict:
    """Build what was asked, then list every known model (name, kind, heads, built or not)."""
    built = []
    if args.build is not None:
        names = list(args.build) or list(HANDWIRED)
        unknown = [n for n in names if n not in KNOWN_MODELS]
        if unknown:
            raise HeadLabError(f"unknown known model(s) {', '.join(unknown)}; choose from {', '.join(KNOWN_MODELS)}.")
        for name in names:
            print(f"building {name} ...", flush=True)
            KNOWN_MODELS[name](progress=known_kind(name) != "handwired")
            built.append(name)
    rows = [_row(name) for name in KNOWN_MODELS]
    for row in rows:
        heads = ",".join(row.get("heads", [])) or "-"
        state = "built" if row["built"] else "broken" if row.get("broken") else "not built"
        print(f"{row['name']:28s} {row['kind']:9s} {state:9s} {heads:24s}{bounds_text(row)}")
    for row in rows:
        if row.get("broken"):
            print(f"note: {row['name']}: {row['broken']}")
    if not any(r["built"] for r in rows):
        print("no known model is built yet; build the hand-wired ones with python -m core known --build")
    return {"zoo": str(zoo_dir()), "built_now": built, "models": rows}
