"""The known-circuit benchmark's report: the score table over seeds (edges over the whole graph and over the edges
between heads, a planted truth's scope), the disposer's verdict accuracy, ACDC's ROC from a sweep of thresholds,
where the methods separate, the ranks of the true heads and edges, and the published anchors shown beside them (split from
core/pipelines/benchmark.py, which runs the methods; core/cli/benchmark.py renders report.md from this).
"""

from __future__ import annotations

import hashlib
import json
from typing import Optional, Sequence

import numpy as np

from core.ablation.edges.graph import Edge
from core.stats.recovery import MEASURES, seed_interval

GROUP_KINDS = ("truth", "proposal", "random", "distractor")
EXPECTED = {"truth": "causal", "random": "not causal", "distractor": "not causal", "proposal": None}

# Published edge ROC AUCs of circuit discovery on other models (ACDC, Conmy et al. 2023, the tables of its
# repository), shown beside HeadLab's figures and never mixed with them.
PUBLISHED_ANCHORS = (
    {"source": "ACDC (Conmy et al. 2023)", "task": "tracr reverse", "method": "ACDC", "ablation": "zero",
     "metric": "edge ROC AUC", "value": 1.000},
    {"source": "ACDC (Conmy et al. 2023)", "task": "tracr reverse", "method": "subnetwork probing", "ablation": "zero",
     "metric": "edge ROC AUC", "value": 0.692},
    {"source": "ACDC (Conmy et al. 2023)", "task": "tracr reverse", "method": "head importance", "ablation": "zero",
     "metric": "edge ROC AUC", "value": 0.656},
    {"source": "ACDC (Conmy et al. 2023)", "task": "IOI (GPT-2 small)", "method": "ACDC", "ablation": "resample",
     "metric": "edge ROC AUC", "value": 0.868},
    {"source": "ACDC (Conmy et al. 2023)", "task": "greater-than (GPT-2 small)", "method": "ACDC", "ablation": "resample",
     "metric": "edge ROC AUC", "value": 0.883},
    {"source": "ACDC (Conmy et al. 2023)", "task": "docstring (4-layer attn-only)", "method": "ACDC (KL)",
     "ablation": "resample", "metric": "edge ROC AUC", "value": 0.434},
    {"source": "ACDC (Conmy et al. 2023)", "task": "docstring (4-layer attn-only)", "method": "ACDC (task metric)",
     "ablation": "resample", "metric": "edge ROC AUC", "value": 0.972},
)
PUBLISHED_LABEL = "published numbers on other models (not HeadLab runs)"


HEAD_TO_HEAD = "edge (head to head)"  # the score table's level of the edges between two heads (head_to_head_scope)
NO_HEAD_TO_HEAD = "the circuit lists no edge between two heads, or only such edges"


def score_table(results: Sequence[dict], settings) -> list[dict]:
    """One row per (level, method, task, measure): the mean over the task's seeds with its bootstrap interval,
    the mean permutation baseline and the largest permutation p; a method with no score says why."""
    rows = []
    tasks: dict[str, list[dict]] = {}
    for result in results:
        tasks.setdefault(result["case"]["task"], []).append(result)
    for level, key, names in (("head", "methods", settings.method_names),
                              ("edge", "edge_methods", settings.edge_method_names),
                              (HEAD_TO_HEAD, "edge_methods", settings.edge_method_names)):
        recovery = "recovery_heads" if level == HEAD_TO_HEAD else "recovery"
        for method in names:
            for task, group in tasks.items():
                entries = [next(m for m in r[key] if m["method"] == method) for r in group]
                scored = [e[recovery] for e in entries if e.get(recovery)]  # each: measure -> recovery record
                missing = sorted({e["not_applicable"] or NO_HEAD_TO_HEAD for e in entries if not e.get(recovery)})
                for measure in MEASURES:
                    row = {"level": level, "method": method, "task": task, "measure": measure,
                           "models": [r["case"]["name"] for r in group], "n_scored": len(scored),
                           "not_applicable": missing}
                    if scored:
                        values = [r[measure]["value"] for r in scored]
                        row.update(seed_interval(values, n_boot=settings.n_boot, seed=settings.boot_seed).to_json())
                        row["baseline_mean"] = float(np.mean([r[measure]["baseline_mean"] for r in scored]))
                        row["max_p"] = float(max(r[measure]["p"] for r in scored))
                    rows.append(row)
    return rows


def verdict_accuracy(results: Sequence[dict]) -> dict:
    """Per group kind: how many groups, how many the disposer judged right (paper rule), the rate, and the verdicts."""
    out = {}
    for kind in GROUP_KINDS:
        records = [d for r in results for d in r["disposals"] if d["kind"] == kind]
        verdicts: dict[str, int] = {}
        for d in records:
            verdicts[d["verdict_paper"]] = verdicts.get(d["verdict_paper"], 0) + 1
        judged = [d["correct"] for d in records if d["correct"] is not None]
        out[kind] = {"n": len(records), "n_judged": len(judged), "expected": EXPECTED[kind], "verdicts": verdicts,
                     "correct": int(sum(judged)) if judged else None,
                     "rate": float(np.mean(judged)) if judged else None}
    return out


def report_fingerprint(report: dict) -> str:
    """SHA-256 of the report without its runtime: equal for a resumed and an uninterrupted run."""
    body = {k: v for k, v in report.items() if k != "runtime"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def sweep_roc(thresholds: Sequence[float], kept: Sequence[Sequence[int]], truth: np.ndarray) -> dict:
    """ACDC's ROC from a sweep of thresholds, as its paper draws it: each threshold's kept edges (indices into the
    graph's edges) give one point (FPR, TPR) against the true edges (truth: [edge] bool); the curve runs from (0, 0)
    through the points sorted by FPR, each TPR raised to the best at or below its FPR (the points' upper envelope),
    to (1, 1); its area by the trapezoid rule."""
    truth = np.asarray(truth, dtype=bool)
    n_true, n_false = int(truth.sum()), int((~truth).sum())
    if n_true == 0 or n_false == 0:
        raise ValueError("a sweep ROC needs true and false edges")
    points = []
    for threshold, indices in zip(thresholds, kept):
        mask = np.zeros(truth.shape, dtype=bool)
        mask[np.asarray(list(indices), dtype=np.int64)] = True
        tp, fp = int((mask & truth).sum()), int((mask & ~truth).sum())
        points.append({"threshold": float(threshold), "n_kept": int(mask.sum()), "tp": tp, "fp": fp,
                       "tpr": tp / n_true, "fpr": fp / n_false})
    curve = sorted([(0.0, 0.0), (1.0, 1.0)] + [(p["fpr"], p["tpr"]) for p in points])
    fpr = np.array([c[0] for c in curve])
    tpr = np.maximum.accumulate(np.array([c[1] for c in curve]))
    auc = float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2.0))
    return {"points": points, "auc": auc, "n_true": n_true, "n_false": n_false}


def between_heads_mask(edges: Sequence[str]) -> np.ndarray:
    """[edge] bool: True where the edge (its text) runs from a head into a head."""
    return np.array([Edge.parse(text).between_heads for text in edges], dtype=bool)


def mean_rank(value: float, pool: np.ndarray) -> float:
    """The rank of `value` in `pool` by score (1 = highest); ties share their mean rank."""
    return float((pool > value).sum() + ((pool == value).sum() + 1) / 2.0)


def head_to_head_scope(edges: Sequence[str], scores: np.ndarray, truth: np.ndarray,
                       sweep: Optional[dict] = None) -> Optional[tuple[np.ndarray, np.ndarray, Optional[dict]]]:
    """The edges between two heads only: (scores, truth, sweep with its kept indices renumbered), or None when the
    truth has no such edge. A planted circuit's truth names the head-to-head edges it planted (and measured) and
    nothing of the embeddings', MLPs' and logits' edges its heads also use, which the full graph counts as false."""
    inside = between_heads_mask(edges)  # [edge]
    if not truth[inside].any() or truth[inside].all():
        return None
    position = np.cumsum(inside) - 1  # [edge] -> index among the head-to-head edges
    renumbered = None
    if sweep:
        renumbered = {"thresholds": list(sweep["thresholds"]),
                      "kept": [[int(position[i]) for i in kept if inside[i]] for kept in sweep["kept"]]}
    return np.asarray(scores, dtype=np.float64)[inside], truth[inside], renumbered


def sweep_table(results: Sequence[dict], settings) -> list[dict]:
    """Per task: the mean over seeds of ACDC's threshold-sweep ROC AUC (sweep_roc) with its bootstrap interval."""
    rows = []
    for level, key in (("edge", "sweep_roc"), (HEAD_TO_HEAD, "sweep_roc_heads")):
        tasks: dict[str, list[float]] = {}
        for result in results:
            for entry in result["edge_methods"]:
                if entry.get(key):
                    tasks.setdefault(result["case"]["task"], []).append(entry[key]["auc"])
        rows += [{"method": "ACDC (threshold sweep)", "level": level, "task": task, "n_scored": len(values),
                  **seed_interval(values, n_boot=settings.n_boot, seed=settings.boot_seed).to_json()}
                 for task, values in tasks.items()]
    return rows


def true_head_ranks(results: Sequence[dict]) -> list[dict]:
    """Per model and head method: the rank of each true head among all heads by the method's score (1 = highest;
    ties share their mean rank): where a method loses a backup or a head on saturated attention, it shows here."""
    rows = []
    for result in results:
        truth = result["case"]["truth"]
        for entry in result["methods"]:
            if entry.get("scores") is None:
                continue
            scores = np.asarray(entry["scores"], dtype=np.float64)  # [layer, head]
            flat = scores.reshape(-1)
            n_heads = scores.shape[1]
            ranks = {}
            for name in truth:
                layer, head = (int(part) for part in name[1:].split("H"))
                value = flat[layer * n_heads + head]
                ranks[name] = mean_rank(value, flat)
            rows.append({"model": result["case"]["name"], "task": result["case"]["task"], "method": entry["method"],
                         "ranks": ranks, "n_heads": int(flat.size)})
    return rows


def true_edge_ranks(results: Sequence[dict], n_above: int = 5) -> list[dict]:
    """Per model and edge method: the rank of each true edge among all edges and among the edges between two heads
    (1 = highest; ties share their mean rank), and the false edges scored above the lowest-ranked true edge (the
    first n_above by score): what a method ranks above the true edges shows why its precision is what it is."""
    rows = []
    for result in results:
        truth = list(result["case"]["edges"])
        for entry in result["edge_methods"]:
            if entry.get("scores") is None or not truth:
                continue
            edges = list(entry["edges"])
            scores = np.asarray(entry["scores"], dtype=np.float64)  # [edge]
            inside = between_heads_mask(edges)  # [edge]
            values = {text: scores[edges.index(text)] for text in truth}
            lowest = min(values.values())
            false_above = [i for i in np.argsort(-scores, kind="stable") if scores[i] > lowest and edges[i] not in values]
            rows.append({"model": result["case"]["name"], "task": result["case"]["task"], "method": entry["method"],
                         "n_edges": len(edges), "n_head_to_head": int(inside.sum()),
                         "ranks": {text: mean_rank(v, scores) for text, v in values.items()},
                         "ranks_head_to_head": {text: mean_rank(v, scores[inside]) for text, v in values.items()
                                                if Edge.parse(text).between_heads},
                         "n_false_above": len(false_above),
                         "false_above": [[edges[i], float(scores[i])] for i in false_above[:n_above]]})
    return rows


SEPARATION_MIN_GAP = 0.01  # means closer than this do not separate, however narrow their intervals (0.9998 vs 0.9995)


def separations(table: Sequence[dict], measure: str = "roc_auc", min_gap: float = SEPARATION_MIN_GAP) -> list[dict]:
    """Pairs of methods on one task and level whose bootstrap intervals over seeds do not overlap: method `above`'s
    interval lies wholly above method `below`'s, and its mean at least min_gap above (a task of one seed has no
    interval and is left out)."""
    rows = [r for r in table if r["measure"] == measure and r.get("low") is not None and r.get("n_scored", 0) > 1]
    out = []
    for a in rows:
        for b in rows:
            if ((a["level"], a["task"]) == (b["level"], b["task"]) and a["low"] > b["high"]
                    and a["mean"] - b["mean"] >= min_gap):
                out.append({"level": a["level"], "task": a["task"], "measure": measure, "above": a["method"],
                            "above_interval": [a["low"], a["high"]], "above_mean": a["mean"], "below": b["method"],
                            "below_interval": [b["low"], b["high"]], "below_mean": b["mean"]})
    return out
