"""The known-circuit benchmark's cases and its cache of finished items (split from core/pipelines/benchmark.py).

A `BenchmarkCase` is one known model ready to score; `known_case` / `known_cases` make them from the known
models' circuit.json (core.zoo.known). Each (model, item) result is a JSON file under cache_dir()/benchmark/,
written atomically under a key of everything that decides it (`cached_item`), so an interrupted run resumes
from its finished items.
"""

from __future__ import annotations

import json
import math
import re
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from core.ablation.spec import PROBE_MODES
from core.errors import HeadLabError
from core.heads import HeadSet, head_name
from core.model.refs import ModelRef, resolve_checkpoint, weights_fingerprint
from core.store import CorruptCacheEntryWarning, cache_key
from core.tasks.counterfactual import PatchPair
from core.workspace import atomic_write_json, cache_dir, zoo_dir
from core.zoo.known import CIRCUIT_FILE, KNOWN_MODELS, edge_text, known_circuit, known_kind
from core.zoo.known.planted import planted_status

BENCHMARK_VERSION = "2"  # bump when a stored item changes (2: closure verdicts read the rank where controls do not vary)
CACHE_KIND = "benchmark"


@dataclass(frozen=True, eq=False)
class BenchmarkCase:
    """One known model, ready to score.

    name: how the report names it; ref, revision: the checkpoint; task: the circuit's task (seeds of one
    task are pooled); seed: the model's seed among them (None when there is one model of the task);
    kind: "hand-wired" | "planted" | ...; truth: the true heads; edges: the true edges' text
    ("L0H0->L1H0.k"), the measured ones among them also in measured_edges (KnownCircuit.measured_edges);
    mode: the ablation type under which the circuit holds (a PROBE_MODES value);
    distractors: name -> heads that are busy but outside the circuit; pairs: the clean/corrupted pairs
    (the clean side is the probe batch of the screen, the gradient and the disposer); pair_spec: how
    the pairs were made (part of every cache key).
    """

    name: str
    ref: ModelRef
    revision: str
    task: str
    truth: HeadSet
    mode: str
    pairs: PatchPair
    pair_spec: dict
    kind: str = "known"
    seed: Optional[int] = None
    edges: tuple[str, ...] = ()
    measured_edges: tuple[str, ...] = ()
    distractors: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in PROBE_MODES:
            raise HeadLabError(f"{self.name}: ablation type {self.mode!r} is not one of {', '.join(PROBE_MODES)}; "
                               "fix the circuit's ablation type.")
        if len(self.truth) == 0:
            raise HeadLabError(f"{self.name}: the true circuit names no heads; a known circuit needs at least one.")

    def describe(self, shape: tuple[int, int]) -> dict:
        return {"name": self.name, "model": self.ref.name, "revision": self.revision, "task": self.task,
                "seed": self.seed, "kind": self.kind, "shape": list(shape), "mode": self.mode,
                "truth": [head_name(h) for h in self.truth], "edges": list(self.edges),
                "measured_edges": list(self.measured_edges),
                "distractors": {k: [head_name(h) for h in v] for k, v in self.distractors.items()},
                "pairs": {"n_examples": self.pairs.n_examples, "seq_len": self.pairs.seq_len, **self.pair_spec}}


_SEEDED = re.compile(r"^(?P<task>.+)-s(?P<seed>\d+)$")


def task_and_seed(name: str) -> tuple[str, Optional[int]]:
    """A known model's task group and seed from its name: "planted-induction-neox-s1" -> ("planted-induction-neox", 1);
    a name without a seed suffix is a task of its own."""
    match = _SEEDED.match(name)
    return (match["task"], int(match["seed"])) if match else (name, None)


def known_case(model: str | ModelRef, revision: Optional[str] = None) -> BenchmarkCase:
    """The case of a known model: a zoo name or a local folder holding circuit.json (HeadLabError when it has none,
    or when the circuit names heads or edges the model lacks)."""
    ref = model if isinstance(model, ModelRef) else ModelRef.parse(str(model))
    circuit = known_circuit(ref, revision)
    checkpoint = resolve_checkpoint(ref, revision)
    pairs = circuit.build_pair()
    name = Path(ref.name).name if ref.kind == "local" else ref.name
    task, seed = task_and_seed(name)
    distractors = {"distractors": circuit.distractors} if len(circuit.distractors) else {}
    return BenchmarkCase(name=name, ref=ref, revision=checkpoint.revision, task=task, truth=circuit.heads,
                         mode=circuit.ablation, pairs=pairs, pair_spec=dict(circuit.task), kind=circuit.kind, seed=seed,
                         edges=tuple(edge_text(e) for e in circuit.true_edges),
                         measured_edges=tuple(edge_text(e) for e in circuit.measured_edges), distractors=distractors)


def known_cases(names: Sequence[str] = (), kinds: Sequence[str] = ("handwired", "planted"), build: bool = False,
                say: Optional[Callable[[str], None]] = None) -> tuple[list[BenchmarkCase], list[str]]:
    """The cases of the named known models (zoo names or folders; default every registered one of `kinds`), and
    notes on the ones left out. A registered hand-wired model not built yet is built (well under a second);
    a planted one is trained only when `build` (else left out, with the command that trains it)."""
    say = say or (lambda text: None)
    chosen = list(names) or [n for n in KNOWN_MODELS if known_kind(n) in kinds]
    cases, notes = [], []
    for name in chosen:
        registered = name in KNOWN_MODELS
        if registered and not (zoo_dir() / name / CIRCUIT_FILE).exists():  # a folder there: read_circuit refuses it
            status = planted_status(zoo_dir() / name)
            if status is not None and not status.get("confirmed", True):  # trained: no truth to score against
                notes.append(f"{name} was trained but failed its confirmation rule ({'; '.join(status['failures'][:3])}), "
                             "so it has no circuit.json and was left out.")
                continue
            if known_kind(name) == "handwired" or build:
                say(f"building known model {name}")
                KNOWN_MODELS[name](progress=known_kind(name) != "handwired")
            else:
                notes.append(f"{name} is not built yet and was left out; train it with python -m core known --build "
                             f"{name} (or benchmark --build).")
                continue
        cases.append(known_case(name))
    return cases, notes


# ---------------------------------------------------------------------------------------------
# the cache of finished items


def _item_key(case: BenchmarkCase, item: str, extra: dict) -> str:
    """Everything an item depends on: the model's weights, the pairs, the circuit's heads as circuit.json states
    them (a proposal's size and every disposal's groups follow the true heads), the item and its settings. Not the
    true edges: no item reads them (edge scores cover every edge; the report scores them against the truth)."""
    model_id = case.ref.to_json()
    circuit = {"truth": [head_name(h) for h in case.truth], "mode": case.mode,
               "kind": case.kind, "distractors": {str(k): [head_name(h) for h in HeadSet.of(v)]
                                                  for k, v in case.distractors.items()},
               "pairs": [case.pairs.n_examples, case.pairs.seq_len]}
    payload = {"item": item, "weights": weights_fingerprint(case.ref, case.revision), "circuit": circuit, **extra}
    return cache_key(CACHE_KIND, json.dumps(model_id, sort_keys=True), case.revision, case.pair_spec,
                     BENCHMARK_VERSION, payload)


def _item_path(key: str):
    digest = key.partition(":")[2]
    return cache_dir() / CACHE_KIND / f"{digest}.json"


def cached_item(case: BenchmarkCase, item: str, extra: dict, compute: Callable[[], dict],
                check: Optional[Callable[[dict], Any]] = None, device: str = "cpu") -> tuple[dict, float, str]:
    """(result, seconds it took when computed, the device it was computed on): the finished item, else computed
    and written whole (a temporary file renamed into place) so an interrupted run leaves no half of it.

    check: reads a result the way the report will (raising KeyError, TypeError, ValueError on a malformed one),
    so an entry edited by hand or cut short is named as corrupt and computed again, never a KeyError later.
    The record keeps the device it was computed on (the report's provenance lists those devices).
    """
    key = _item_key(case, item, extra)
    path = _item_path(key)
    if path.exists():
        try:
            record = json.loads(path.read_text())
            if record.get("key") == key:
                if check is not None:
                    check(record["result"])
                return record["result"], float(record["seconds"]), str(record.get("device", "not recorded"))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            warnings.warn(f"benchmark cache entry {path} is corrupt ({type(exc).__name__}); it is computed again and "
                          "replaced.", CorruptCacheEntryWarning, stacklevel=2)
            if path.is_dir():
                raise HeadLabError(f"{path} is a folder where a benchmark cache file belongs; remove that folder "
                                   "(nothing of HeadLab's is in it) and rerun.") from None
    started = time.perf_counter()
    result = compute()
    seconds = time.perf_counter() - started
    try:
        atomic_write_json(path, {"key": key, "item": item, "model": case.name, "seconds": seconds, "device": device,
                                 "result": result})
    except OSError as exc:
        raise HeadLabError(f"cannot write the benchmark cache under {path.parent} ({exc.strerror}); free disk space "
                           "or set HEADLAB_HOME to a folder you can write (nothing was left half-written).") from None
    return result, seconds, device


# ---------------------------------------------------------------------------------------------
# one case


def check_known_heads(case: BenchmarkCase, n_layers: int, n_heads: int) -> None:
    """Refuse a case whose truth or distractors name heads the model lacks, before any work."""
    named = [("true circuit", case.truth)] + [(f"distractor group {k!r}", HeadSet.of(v)) for k, v in case.distractors.items()]
    for what, heads in named:
        missing = [head_name(h) for h in heads if not (0 <= h[0] < n_layers and 0 <= h[1] < n_heads)]
        if missing:
            raise HeadLabError(f"{case.name}: the {what} names {', '.join(missing)}, but the model has {n_layers} layers "
                               f"of {n_heads} heads (L0H0..L{n_layers - 1}H{n_heads - 1}); fix its circuit.json.")


def true_edge_mask(case: BenchmarkCase, edges: Sequence[str]) -> np.ndarray:
    """[edge] bool over the graph's edges (their text, in order): True at the circuit's true edges; an edge the
    graph lacks is refused."""
    index = {text: i for i, text in enumerate(edges)}
    missing = [e for e in case.edges if e not in index]
    if missing:
        raise HeadLabError(f"{case.name}: the circuit's edges {', '.join(missing[:3])} are not edges of the model's graph "
                           "(core.ablation.edges); fix its circuit.json.")
    mask = np.zeros(len(edges), dtype=bool)
    mask[[index[e] for e in case.edges]] = True
    return mask


def random_groups(truth: HeadSet, n_layers: int, n_heads: int, n_groups: int, seed: int) -> list[HeadSet]:
    """Up to n_groups distinct random head sets of the truth's size, drawn from the heads outside it (seeded)."""
    free = [(l, h) for l in range(n_layers) for h in range(n_heads) if (l, h) not in truth]
    size = len(truth)
    if size > len(free) or n_groups == 0:
        return []
    n_possible = math.comb(len(free), size)
    rng = np.random.RandomState(seed)
    seen: list[HeadSet] = []
    attempts = 0
    while len(seen) < min(n_groups, n_possible) and attempts < 100 * n_groups:
        attempts += 1
        group = HeadSet.of(free[int(i)] for i in rng.choice(len(free), size=size, replace=False))
        if group not in seen:
            seen.append(group)
    return seen
