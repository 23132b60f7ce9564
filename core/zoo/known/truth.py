"""The ground truth of a model whose circuit is known: `KnownCircuit`, and its circuit.json.

A known model (hand-wired, planted by training, or imported) carries a `circuit.json` in its model
folder (beside manifest.json) and in each checkpoint folder (beside the weights). It says which
heads make the circuit, what each does, the head-to-head edges (sender, receiver, input) in the
edge graph's names ("L0H0->L1H0.k", "embed->L0H1.v", "L1H0->logits"), the heads that are busy but
irrelevant (distractors), the ablation type under which the circuit holds, the task that exercises
it (a JSON record from which core/tasks/known.py rebuilds the clean/corrupted pairs and the probe
batch) and the bounds measured when the model was built. `read_circuit` is the one reader: every
problem (no file, a head or an edge the model lacks, an unknown format) is a HeadLabError that
names the fault and what to do.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from core.ablation.spec import PROBE_MODES
from core.errors import HeadLabError
from core.heads import HeadSet, head_name, parse_heads
from core.model.refs import MANIFEST, ModelRef
from core.results import JsonResult
from core.workspace import atomic_write_json, zoo_dir
from core.model.loading import load_config
from core.tasks.known import known_task

CIRCUIT_FILE = "circuit.json"
FORMAT = "headlab-known-circuit/1"
KINDS = ("handwired", "planted", "imported")
ABLATIONS = PROBE_MODES  # the ablation under which a circuit holds: a name AblationSettings.mode takes
CIRCUIT_METRICS = ("logit_diff",)
HEAD_INPUTS = ("q", "k", "v")
BUILD_HINT = "python -m core known --build"
_HEAD = re.compile(r"^L(\d+)H(\d+)$")
_MLP = re.compile(r"^MLP(\d+)$")
_EDGE_HELP = 'write an edge as "L0H1->L1H0.k" (a head\'s q, k or v input), "embed->L0H0.v", "MLP0->L1H0.q" or "L1H0->logits"'

Edge = tuple[str, str, str]  # (sender, receiver, input): input "q" | "k" | "v" for a head, "" otherwise


def edge_text(edge: Edge) -> str:
    """An edge's text form: "L0H0->L1H0.k", "L1H0->logits"."""
    sender, receiver, component = edge
    return f"{sender}->{receiver}.{component}" if component else f"{sender}->{receiver}"


def parse_edge(text: str | list | tuple) -> Edge:
    """An edge from its text ("L0H0->L1H0.k") or a [sender, receiver, input] triple; names checked, not the shape."""
    if isinstance(text, (list, tuple)):
        if len(text) != 3 or not all(isinstance(part, str) for part in text):
            raise HeadLabError(f"edge {list(text)!r} is not a [sender, receiver, input] triple; {_EDGE_HELP}.")
        sender, receiver, component = text
    else:
        parts = str(text).replace(" ", "").split("->")
        if len(parts) != 2 or not all(parts):
            raise HeadLabError(f"edge {text!r} is not understood; {_EDGE_HELP}.")
        sender, target = parts
        receiver, _, component = target.partition(".")
    shown = edge_text((sender, receiver, component))
    if not (sender == "embed" or _HEAD.match(sender) or _MLP.match(sender)):
        raise HeadLabError(f"edge {shown!r} starts at {sender!r}, which is no sender (embed, L{{l}}H{{h}} or MLP{{l}}); {_EDGE_HELP}.")
    if _HEAD.match(receiver):
        if component not in HEAD_INPUTS:
            raise HeadLabError(f"edge {shown!r} enters head {receiver} through {component!r}; a head's inputs are q, k and v.")
    elif receiver == "logits" or _MLP.match(receiver):
        if component:
            raise HeadLabError(f"edge {shown!r}: only a head has q, k and v inputs; {receiver} has one input.")
    else:
        raise HeadLabError(f"edge {shown!r} ends at {receiver!r}, which is no receiver (L{{l}}H{{h}}, MLP{{l}} or logits); {_EDGE_HELP}.")
    return sender, receiver, component


def _node_layer(node: str, n_layers: int) -> int:
    """embed -1, a head or an MLP its layer, the logits n_layers."""
    if node == "embed":
        return -1
    if node == "logits":
        return n_layers
    return int((_HEAD.match(node) or _MLP.match(node)).group(1))


def _head_of(node: str) -> tuple[int, int] | None:
    match = _HEAD.match(node)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


@dataclass(frozen=True)
class KnownCircuit(JsonResult):
    """A circuit known by construction (or confirmed by exhaustive patching), as circuit.json records it.

    heads: the true circuit; roles: "L0H0" -> what the head does; edges: (sender, receiver, input)
    triples, built or planted; measured_edges: edges found by patching beyond those (a planted model's circuit
    heads can lean on an edge from a head outside the circuit whose paths cancel as a whole), so a sender may be
    any earlier head, a receiver is a circuit head; true_edges: both; distractors: heads that are busy (sharp
    patterns, large outputs) but do not move the task; ablation: the mode (AblationSettings.mode) under which the
    claims hold; metric: the task metric ("logit_diff": the clean target's logit minus the corrupted target's, at
    the query);
    task: the JSON record core/tasks/known.py rebuilds the pairs and the probe batch from; bounds:
    measured numbers (metric means: clean, corrupted, true heads ablated, every other head ablated,
    and the limits the tests hold them to); notes: how the model was made.
    """

    name: str
    kind: str
    heads: HeadSet
    roles: dict[str, str]
    edges: tuple[Edge, ...]
    measured_edges: tuple[Edge, ...] = ()
    distractors: HeadSet = field(default_factory=HeadSet)
    ablation: str = "zero"
    metric: str = "logit_diff"
    task: dict = field(default_factory=dict)
    bounds: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("heads", "distractors"):
            value = getattr(self, name)
            if not isinstance(value, HeadSet):
                object.__setattr__(self, name, HeadSet(tuple(value)))
        object.__setattr__(self, "edges", tuple(parse_edge(edge) for edge in self.edges))
        object.__setattr__(self, "measured_edges", tuple(parse_edge(edge) for edge in self.measured_edges))
        object.__setattr__(self, "notes", tuple(str(note) for note in self.notes))
        if self.kind not in KINDS:
            raise HeadLabError(f"known circuit {self.name!r} has kind {self.kind!r}; use one of {', '.join(KINDS)}.")
        if self.ablation not in ABLATIONS:
            raise HeadLabError(f"known circuit {self.name!r} holds under ablation {self.ablation!r}, which HeadLab "
                               f"does not run; use one of {', '.join(ABLATIONS)}.")
        if self.metric not in CIRCUIT_METRICS:
            raise HeadLabError(f"known circuit {self.name!r} is scored by {self.metric!r}; use one of {', '.join(CIRCUIT_METRICS)}.")
        if not len(self.heads):
            raise HeadLabError(f"known circuit {self.name!r} names no heads; a known circuit has at least one true head "
                               f"(fix the circuit.json or rebuild the model: {BUILD_HINT} {self.name}).")
        overlap = set(self.heads) & set(self.distractors)
        if overlap:
            raise HeadLabError(f"known circuit {self.name!r} lists {HeadSet(tuple(overlap))} both as circuit heads and as "
                               "distractors; a head is one or the other.")
        names = {head_name(h) for h in self.heads}
        for key in self.roles:
            if key not in names:
                raise HeadLabError(f"known circuit {self.name!r} gives a role to {key}, which is not one of its heads "
                                   f"({self.heads}); give roles to circuit heads only.")
        for edge in self.edges:
            for node in edge[:2]:
                head = _head_of(node)
                if head is not None and head not in self.heads:
                    raise HeadLabError(f"known circuit {self.name!r} has the edge {edge_text(edge)!r} through {node}, "
                                       f"which is not one of its heads ({self.heads}); add the head or drop the edge.")
        for edge in self.measured_edges:
            head = _head_of(edge[1])
            if head is None or head not in self.heads:
                raise HeadLabError(f"known circuit {self.name!r} has the measured edge {edge_text(edge)!r} into "
                                   f"{edge[1]}, which is not one of its heads ({self.heads}); a measured edge ends at a "
                                   "circuit head.")
            if edge in self.edges:
                raise HeadLabError(f"known circuit {self.name!r} lists {edge_text(edge)!r} both as an edge and as a "
                                   "measured edge; list it once.")

    def validate(self, n_layers: int, n_heads: int, where: str = "") -> "KnownCircuit":
        """Refuse heads and edges a model of this shape lacks, naming the first bad one and the shape."""
        shape = f"{n_layers} layers x {n_heads} heads: L0H0 .. L{n_layers - 1}H{n_heads - 1}"
        source = where or f"known circuit {self.name!r}"
        for what, heads in (("head", self.heads), ("distractor", self.distractors)):
            for head in heads:
                if not (0 <= head[0] < n_layers and 0 <= head[1] < n_heads):
                    raise HeadLabError(f"{source} names {what} {head_name(head)}, which this model lacks ({shape}); "
                                       f"fix the circuit.json or rebuild the model ({BUILD_HINT}).")
        for edge in self.true_edges:
            sender, receiver, _ = edge
            for node in (sender, receiver):
                layer = _node_layer(node, n_layers)
                if node.startswith("MLP") and not 0 <= layer < n_layers:
                    raise HeadLabError(f"{source} has the edge {edge_text(edge)!r} through {node}, a layer this model "
                                       f"lacks ({shape}); fix the circuit.json or rebuild the model ({BUILD_HINT}).")
            if _node_layer(sender, n_layers) > _node_layer(receiver, n_layers) or (
                    _head_of(receiver) is not None and _node_layer(sender, n_layers) == _node_layer(receiver, n_layers)):
                raise HeadLabError(f"{source} has the edge {edge_text(edge)!r}, whose sender does not come before its "
                                   f"receiver (a head reads only earlier layers); fix the circuit.json.")
        return self

    @property
    def edge_texts(self) -> tuple[str, ...]:
        return tuple(edge_text(edge) for edge in self.edges)

    @property
    def true_edges(self) -> tuple[Edge, ...]:
        """The edge truth: the built or planted edges, then the measured ones."""
        return (*self.edges, *self.measured_edges)

    def build_pair(self):
        """The task's clean/corrupted pairs (core.tasks.counterfactual.PatchPair), rebuilt from `task`."""
        return known_task(self.task).build_pair()

    def build_batch(self):
        """The task's probe batch (core.tasks.probe_batch.ProbeBatch; the pairs' clean side), rebuilt from `task`."""
        return known_task(self.task).build_batch()

    def to_json(self) -> dict:
        """circuit.json's record: heads and edges in their text forms, so a reader can check them by eye."""
        return {"format": FORMAT, "name": self.name, "kind": self.kind,
                "heads": [head_name(h) for h in self.heads], "roles": dict(self.roles),
                "edges": list(self.edge_texts), "measured_edges": [edge_text(e) for e in self.measured_edges],
                "distractors": [head_name(h) for h in self.distractors],
                "ablation": self.ablation, "metric": self.metric, "task": dict(self.task),
                "bounds": dict(self.bounds), "notes": list(self.notes)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "KnownCircuit":
        """Read circuit.json's record; heads as "L0H1" names or [layer, head] pairs. HeadLabError on any fault."""
        return _from_record(data, "this circuit record")


def _heads(value: Any, what: str, where: str) -> HeadSet:
    if isinstance(value, str):
        return parse_heads(value) if value.strip() else HeadSet()
    if not isinstance(value, list):
        raise HeadLabError(f"{where}: {what} must be a list of heads like [\"L0H1\", \"L1H0\"].")
    heads = []
    for item in value:
        if isinstance(item, str):
            heads.extend(parse_heads(item))
        elif isinstance(item, (list, tuple)) and len(item) == 2 and all(isinstance(x, int) for x in item):
            heads.append(tuple(item))
        else:
            raise HeadLabError(f"{where}: {what} holds {item!r}, which is no head; write heads like \"L0H1\".")
    return HeadSet(tuple(heads))


def _from_record(data: Any, where: str) -> KnownCircuit:
    if not isinstance(data, Mapping):
        raise HeadLabError(f"{where} is not a JSON object; rebuild the model ({BUILD_HINT}).")
    fmt = data.get("format")
    if fmt != FORMAT:
        raise HeadLabError(f"{where} is in format {fmt!r}, which this HeadLab does not read (it reads {FORMAT!r}); "
                           f"rebuild the model with this HeadLab ({BUILD_HINT}) or update HeadLab.")
    missing = [key for key in ("name", "kind", "heads", "edges", "ablation") if key not in data]
    if missing:
        raise HeadLabError(f"{where} lacks {', '.join(missing)}; rebuild the model ({BUILD_HINT}) or add the field.")
    for key, kind in (("roles", dict), ("task", dict), ("bounds", dict), ("edges", list), ("measured_edges", list),
                      ("notes", list)):
        if key in data and not isinstance(data[key], kind):
            raise HeadLabError(f"{where}: {key} must be a JSON {'object' if kind is dict else 'list'}.")
    try:
        bounds = {str(k): float(v) for k, v in (data.get("bounds") or {}).items()}
    except (TypeError, ValueError):
        raise HeadLabError(f"{where}: bounds must map names to numbers.") from None
    if data.get("task"):
        known_task(data["task"])  # its counts checked as it is read, not when a reader first builds the pairs
    return KnownCircuit(
        name=str(data["name"]), kind=str(data["kind"]),
        heads=_heads(data["heads"], "heads", where),
        roles={str(k): str(v) for k, v in (data.get("roles") or {}).items()},
        edges=tuple(parse_edge(edge) for edge in data["edges"]),
        measured_edges=tuple(parse_edge(edge) for edge in data.get("measured_edges") or ()),
        distractors=_heads(data.get("distractors", []), "distractors", where),
        ablation=str(data["ablation"]), metric=str(data.get("metric", "logit_diff")),
        task=dict(data.get("task") or {}), bounds=bounds, notes=tuple(data.get("notes") or ()),
    )


# ----------------------------------------------------------------------------- files


def write_circuit(folder: Path, circuit: KnownCircuit) -> Path:
    """Write `circuit` as folder/circuit.json, atomically; returns the file's path."""
    path = Path(folder) / CIRCUIT_FILE
    atomic_write_json(path, circuit.to_json())
    return path


def model_folder(ref: ModelRef | str | Path) -> Path:
    """The folder a model's circuit.json sits in: a zoo model's folder, or the local folder itself."""
    if isinstance(ref, Path):
        return ref
    if isinstance(ref, str):
        ref = ModelRef.parse(ref)
    if ref.kind == "hub":
        raise HeadLabError(f"hub model {ref.name} has no known circuit; known circuits come with HeadLab's known models "
                           f"(build them with {BUILD_HINT}) or a local folder holding a circuit.json.")
    return zoo_dir() / ref.name if ref.kind == "zoo" else Path(ref.name)


def folder_shape(folder: Path) -> tuple[int, int] | None:
    """(n_layers, n_heads) from a model folder's config.json, or its manifest's model config; None when neither says."""
    folder = Path(folder)
    try:
        if (folder / "config.json").is_file():
            config = json.loads((folder / "config.json").read_text())
            return int(config["num_hidden_layers"]), int(config["num_attention_heads"])
        if (folder / MANIFEST).is_file():
            model = json.loads((folder / MANIFEST).read_text())["config"]["model"]
            return int(model["n_layers"]), int(model["n_heads"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None


def read_circuit(folder_or_ref: Path | str | ModelRef, n_layers: int | None = None,
                 n_heads: int | None = None) -> KnownCircuit:
    """The known circuit of a model folder (or a ModelRef / model name), validated against the model's shape.

    The shape is n_layers x n_heads when given, else read from the folder's config.json or manifest.
    Raises HeadLabError when the folder has no circuit.json, when the file is unreadable or in an
    unknown format, or when a head or an edge names a head, layer or input the model lacks.
    """
    folder = model_folder(folder_or_ref)
    path = folder / CIRCUIT_FILE
    if path.exists() and not path.is_file():
        raise HeadLabError(f"{path} is a folder (or another non-file) where the model's {CIRCUIT_FILE} belongs; "
                           f"remove it and rebuild the model ({BUILD_HINT} {folder.name}).")
    if not path.is_file():
        from core.zoo.known import KNOWN_MODELS  # the registry imports this module

        names = ", ".join(KNOWN_MODELS) or "none registered"
        raise HeadLabError(
            f"{folder} has no {CIRCUIT_FILE}, so this model has no known circuit; pick a known model ({names}; "
            f"build them with {BUILD_HINT}, list them with python -m core known) or write a {CIRCUIT_FILE} "
            "beside its weights (docs/known-circuits.md)."
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise HeadLabError(f"{path} is unreadable ({type(exc).__name__}: {exc}); rebuild the model ({BUILD_HINT}).") from None
    circuit = _from_record(data, str(path))
    if n_layers is None or n_heads is None:
        shape = folder_shape(folder)
        if shape is not None:
            n_layers, n_heads = shape
    if n_layers is not None and n_heads is not None:
        circuit.validate(int(n_layers), int(n_heads), str(path))
    return circuit


def known_circuit(ref: ModelRef | str, revision: str | None = None) -> KnownCircuit:
    """The known circuit of a model reference (a zoo name or a local folder), checked against its config.

    A zoo model's circuit.json sits beside manifest.json; a local folder's in the folder itself
    (a model folder or one checkpoint folder). The shape comes from the checkpoint's config.json.
    """
    if isinstance(ref, str):
        ref = ModelRef.parse(ref)
    folder = model_folder(ref)
    config = load_config(ref, revision)
    return read_circuit(folder, int(config.num_hidden_layers), int(config.num_attention_heads))
