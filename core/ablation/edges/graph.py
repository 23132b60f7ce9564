"""The edge graph of a model: which node's output reaches which later node's input.

Nodes, in the order a forward computes them: "embed" (the residual entering block 0), then per
layer l the heads "L{l}H{h}" and the MLP "MLP{l}", and last "logits". A *sender* is a node with an
output (embed, every head, every MLP); a *receiver* is an input: a head's query, key or value
input ("L1H0.q", "L1H0.k", "L1H0.v"), an MLP's input ("MLP1") or the logits ("logits"). There is an
edge from a sender to a receiver when the sender's output is in the residual stream the receiver
reads: every earlier layer's heads and MLPs, the embeddings, and, in a sequential block (attention
then MLP, cfg.parallel_attn_mlp false), the same layer's heads into its MLP. A parallel-residual
block (GPT-NeoX, Pythia) feeds its heads and MLP the same residual, so head l does not reach MLP l.

Under grouped-query attention (n_key_value_heads < n_heads) the nodes are still the query heads, and
"L5H2.k" / "L5H2.v" are query head 2's own copies of the residual entering its group's shared K / V
projection (MIB's convention; core.ablation.patching.paths.ungrouped_key_values): the graph is the same
as with full multi-head attention, and n_key_value_heads is recorded for the reader.

An edge's text is "SENDER->RECEIVER" with the receiver's input: "L0H0->L1H0.k", "embed->L0H1.v",
"MLP0->L1H2.q", "L1H0->logits". Edges are listed sender-major in node order (`EdgeGraph.edges`),
and every per-edge array in HeadLab ([edge]) follows that order. The mask [sender, receiver] says
which pairs are edges.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any, Iterable

import numpy as np

from core.errors import HeadLabError

EMBED, LOGITS = "embed", "logits"
HEAD_INPUTS = ("q", "k", "v")
_HEAD = re.compile(r"^L(\d+)H(\d+)$")
_MLP = re.compile(r"^MLP(\d+)$")
_EDGE_HELP = 'write an edge as "L0H1->L1H0.k" (a head\'s q, k or v input), "embed->L0H0.v", "L1H0->MLP1" or "L1H0->logits"'


@dataclass(frozen=True, order=True)
class Edge:
    """One edge: `sender` node -> `receiver` node's `input` ("q", "k", "v" for a head; "" for an MLP or the logits)."""

    sender: str
    receiver: str
    input: str = ""

    def __str__(self) -> str:
        return f"{self.sender}->{self.receiver_input}"

    @property
    def between_heads(self) -> bool:
        """Whether both ends are attention heads (not the embeddings, an MLP or the logits)."""
        return bool(_HEAD.match(self.sender) and _HEAD.match(self.receiver))

    @property
    def receiver_input(self) -> str:
        """The receiver as the graph names it: "L1H0.k", "MLP1", "logits"."""
        return f"{self.receiver}.{self.input}" if self.input else self.receiver

    @classmethod
    def parse(cls, text: str) -> "Edge":
        """An edge from its text ("L0H1->L1H0.k"); names are checked against a graph by EdgeGraph.index."""
        parts = str(text).replace(" ", "").split("->")
        if len(parts) != 2 or not all(parts):
            raise HeadLabError(f"edge {text!r} is not understood; {_EDGE_HELP}.")
        sender, receiver = parts
        receiver, _, component = receiver.partition(".")
        if _HEAD.match(receiver) and component not in HEAD_INPUTS:
            raise HeadLabError(f"edge {text!r} enters head {receiver} without saying which input; add .q, .k or .v.")
        if not _HEAD.match(receiver) and component:
            raise HeadLabError(f"edge {text!r}: only a head has q, k and v inputs; {receiver} has one input.")
        return cls(sender, receiver, component)


def node_layer(node: str, n_layers: int) -> int:
    """The layer a node sits in: embed -1, a head or MLP its layer, the logits n_layers."""
    if node == EMBED:
        return -1
    if node == LOGITS:
        return n_layers
    match = _HEAD.match(node) or _MLP.match(node)
    if match is None:
        raise HeadLabError(f"node {node!r} is not understood; nodes are embed, L{{l}}H{{h}}, MLP{{l}} and logits.")
    return int(match.group(1))


@dataclass(frozen=True)
class EdgeGraph:
    """Every edge of a model of `n_layers` x `n_heads` (with MLPs unless attn_only).

    senders: node names, in forward order; receivers: input names ("L1H0.k", "MLP1", "logits"), in
    forward order; mask: [sender, receiver] bool, True where the pair is an edge. n_key_value_heads: the
    model's key/value heads (None: one per query head); it changes no edge, each query head's k and v
    inputs being its own either way.
    """

    n_layers: int
    n_heads: int
    parallel_attn_mlp: bool
    attn_only: bool = False
    n_key_value_heads: int | None = None

    def __post_init__(self) -> None:
        if int(self.n_layers) < 1 or int(self.n_heads) < 1:
            raise HeadLabError(f"an edge graph needs at least one layer and one head, not {self.n_layers} x {self.n_heads}.")

    @cached_property
    def senders(self) -> tuple[str, ...]:
        nodes = [EMBED]
        for layer in range(self.n_layers):
            nodes += [f"L{layer}H{h}" for h in range(self.n_heads)]
            if not self.attn_only:
                nodes.append(f"MLP{layer}")
        return tuple(nodes)

    @cached_property
    def receivers(self) -> tuple[str, ...]:
        inputs = []
        for layer in range(self.n_layers):
            inputs += [f"L{layer}H{h}.{c}" for h in range(self.n_heads) for c in HEAD_INPUTS]
            if not self.attn_only:
                inputs.append(f"MLP{layer}")
        return tuple(inputs + [LOGITS])

    def _reaches(self, sender: str, receiver: str) -> bool:
        node = receiver.partition(".")[0]
        s_layer, r_layer = node_layer(sender, self.n_layers), node_layer(node, self.n_layers)
        if s_layer < r_layer:
            return True
        # a head of layer l reaches MLP l only in a sequential block
        return (s_layer == r_layer and _HEAD.match(sender) is not None and _MLP.match(node) is not None
                and not self.parallel_attn_mlp)

    @cached_property
    def mask(self) -> np.ndarray:
        """[sender, receiver] bool: True where the sender's output is in the receiver's input (_reaches, for every
        pair at once: a sender of an earlier layer, or in a sequential block a head of the MLP's own layer)."""
        nodes = [r.partition(".")[0] for r in self.receivers]
        s_layer = np.array([node_layer(s, self.n_layers) for s in self.senders])[:, None]
        r_layer = np.array([node_layer(n, self.n_layers) for n in nodes])[None, :]
        s_head = np.array([_HEAD.match(s) is not None for s in self.senders])[:, None]
        r_mlp = np.array([_MLP.match(n) is not None for n in nodes])[None, :]
        return (s_layer < r_layer) | ((s_layer == r_layer) & s_head & r_mlp & (not self.parallel_attn_mlp))

    @cached_property
    def edges(self) -> tuple[Edge, ...]:
        """Every edge, sender-major in node order (the order of every per-edge array)."""
        out = []
        for i, j in zip(*np.nonzero(self.mask)):
            receiver, _, component = self.receivers[j].partition(".")
            out.append(Edge(self.senders[i], receiver, component))
        return tuple(out)

    @cached_property
    def edge_texts(self) -> tuple[str, ...]:
        """Every edge's text ("L0H1->L1H0.k"), in `edges` order, built without the Edge objects (123k on SmolLM2)."""
        senders, receivers = self.edge_index
        return tuple(f"{self.senders[i]}->{self.receivers[j]}" for i, j in zip(senders.tolist(), receivers.tolist()))

    @cached_property
    def reach(self) -> np.ndarray:
        """[receiver] int: how many senders (a prefix of `senders`, forward order) reach each receiver."""
        last = np.where(self.mask.any(axis=0), self.mask.shape[0] - np.argmax(self.mask[::-1], axis=0), 0)
        return last.astype(np.int64)

    @cached_property
    def edge_index(self) -> tuple[np.ndarray, np.ndarray]:
        """(sender index [edge], receiver index [edge]) into senders / receivers."""
        senders, receivers = np.nonzero(self.mask)
        return senders, receivers

    @property
    def n_edges(self) -> int:
        return int(self.mask.sum())

    @cached_property
    def _position(self) -> dict[Edge, int]:
        return {edge: i for i, edge in enumerate(self.edges)}

    def index(self, edge: Edge | str) -> int:
        """The position of `edge` in `edges`; a clear error when the model has no such node, input or edge."""
        edge = Edge.parse(edge) if isinstance(edge, str) else edge
        for node in (edge.sender, edge.receiver):
            if node not in self.senders and node != LOGITS:
                raise HeadLabError(f"edge {edge} names {node}, which this model ({self.n_layers} layers x {self.n_heads} "
                                   f"heads{', no MLPs' if self.attn_only else ''}) does not have.")
        if edge.sender == LOGITS:
            raise HeadLabError(f"edge {edge} starts at the logits, which send nothing; the logits only receive.")
        if edge.receiver == EMBED:
            raise HeadLabError(f"edge {edge} ends at the embeddings, which receive nothing; they only send.")
        position = self._position.get(edge)
        if position is None:
            raise HeadLabError(f"{edge} is not an edge of this model: {edge.sender} is not in the residual stream "
                               f"{edge.receiver_input} reads (a sender must sit in an earlier layer"
                               f"{'' if self.parallel_attn_mlp else ', or be a head of the MLP' + chr(39) + 's own layer'}).")
        return position

    def indices(self, edges: Iterable[Edge | str]) -> np.ndarray:
        """Positions of several edges (each checked), sorted and without duplicates."""
        return np.array(sorted({self.index(e) for e in edges}), dtype=np.int64)

    def edge_mask(self, edges: Iterable[Edge | str]) -> np.ndarray:
        """[edge] bool: True for the given edges."""
        keep = np.zeros(self.n_edges, dtype=bool)
        keep[self.indices(edges)] = True
        return keep

    def to_matrix(self, per_edge: np.ndarray) -> np.ndarray:
        """A per-edge array [edge] laid out as [sender, receiver] (zero off the edges)."""
        per_edge = np.asarray(per_edge)
        if per_edge.shape[:1] != (self.n_edges,):
            raise HeadLabError(f"expected one value per edge ({self.n_edges}), got shape {per_edge.shape}.")
        out = np.zeros((len(self.senders), len(self.receivers)) + per_edge.shape[1:], dtype=per_edge.dtype)
        senders, receivers = self.edge_index
        out[senders, receivers] = per_edge
        return out

    @cached_property
    def strata(self) -> np.ndarray:
        """[edge] int: the (sender layer, receiver layer, input) stratum of each edge, numbered in edge order.

        The stratum is what a matched-random edge set keeps: the same number of edges from each
        sender layer (embed -1) into each receiver layer's same input (q, k, v, MLP, logits).
        """
        keys: dict[tuple, int] = {}
        out = np.empty(self.n_edges, dtype=np.int64)
        for i, edge in enumerate(self.edges):
            key = (node_layer(edge.sender, self.n_layers), node_layer(edge.receiver, self.n_layers),
                   edge.input or ("mlp" if edge.receiver != LOGITS else LOGITS))
            out[i] = keys.setdefault(key, len(keys))
        return out

    def heads_of(self, keep: np.ndarray) -> list[tuple[int, int]]:
        """The heads an edge set touches (as sender or receiver), sorted: what the ablation lab can test."""
        heads = set()
        for edge, kept in zip(self.edges, np.asarray(keep, dtype=bool)):
            if kept:
                for node in (edge.sender, edge.receiver):
                    match = _HEAD.match(node)
                    if match:
                        heads.add((int(match.group(1)), int(match.group(2))))
        return sorted(heads)

    @classmethod
    def from_summary(cls, summary: dict) -> "EdgeGraph":
        """The graph a result's `graph` record (summary()) describes."""
        n_kv = summary.get("n_key_value_heads")
        return cls(int(summary["n_layers"]), int(summary["n_heads"]), bool(summary["parallel_attn_mlp"]),
                   bool(summary.get("attn_only", False)), None if n_kv is None else int(n_kv))

    def summary(self) -> dict:
        """Counts a reader wants: nodes, senders, receivers, edges (and edges into heads' q/k/v, MLPs, logits)."""
        into = {"q": 0, "k": 0, "v": 0, "mlp": 0, "logits": 0}
        for receiver, count in zip(self.receivers, self.mask.sum(axis=0)):
            node, _, component = receiver.partition(".")
            into[component or ("logits" if node == LOGITS else "mlp")] += int(count)
        return {"n_layers": self.n_layers, "n_heads": self.n_heads, "n_key_value_heads": self.n_key_value_heads or self.n_heads,
                "parallel_attn_mlp": self.parallel_attn_mlp,
                "attn_only": self.attn_only, "nodes": len(self.senders) + 1, "senders": len(self.senders),
                "receivers": len(self.receivers), "edges": self.n_edges, "edges_into": into}


@lru_cache(maxsize=16)
def _shared_graph(n_layers: int, n_heads: int, parallel_attn_mlp: bool, attn_only: bool,
                  n_key_value_heads: int | None) -> EdgeGraph:
    """One EdgeGraph per shape, so its cached edges, texts and mask are built once per process, not per call."""
    return EdgeGraph(n_layers, n_heads, parallel_attn_mlp, attn_only, n_key_value_heads)


def edge_graph_of(model: Any) -> EdgeGraph:
    """The edge graph of a loaded bridge (its cfg: n_layers, n_heads, parallel_attn_mlp, attn_only)."""
    cfg = model.cfg
    n_kv = getattr(cfg, "n_key_value_heads", None)
    return _shared_graph(int(cfg.n_layers), int(cfg.n_heads), bool(getattr(cfg, "parallel_attn_mlp", False)),
                         bool(getattr(cfg, "attn_only", False)), None if n_kv is None else int(n_kv))


def edge_graph_of_config(hf_config: Any) -> EdgeGraph:
    """The edge graph of a Hugging Face config without loading weights (counts for the docs and estimates)."""
    hf_config = getattr(hf_config, "text_config", None) or hf_config
    parallel = bool(getattr(hf_config, "use_parallel_residual", False) or getattr(hf_config, "parallel_attn", False))
    n_kv = getattr(hf_config, "num_key_value_heads", None)
    return EdgeGraph(int(hf_config.num_hidden_layers), int(hf_config.num_attention_heads), parallel,
                     n_key_value_heads=None if n_kv is None else int(n_kv))
