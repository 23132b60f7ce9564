"""Edge-level circuit discovery: the edge graph (graph.py), edge patching on a bridge (runs.py), EAP, EAP-IG and
brute-force edge patching (eap.py), ACDC-style pruning (acdc.py), faithfulness curves and matched-random edge
controls (faithfulness.py). Every method runs the clean prompts and patches edges from the corrupted run.
"""

from core.ablation.edges.acdc import acdc, check_threshold, kept_by_each
from core.ablation.edges.eap import METHODS, EdgeScores, edge_attribution, edge_patching_each
from core.ablation.edges.faithfulness import (MIB_FRACTIONS, EdgeControls, FaithfulnessCurve, edge_controls,
                                              faithfulness_curve, matched_random_edge_sets, top_edges)
from core.ablation.edges.graph import Edge, EdgeGraph, edge_graph_of, edge_graph_of_config
from core.ablation.edges.runs import EDGE_METRICS, REPLACEMENTS, EdgeSettings

__all__ = [
    "EDGE_METRICS", "METHODS", "MIB_FRACTIONS", "REPLACEMENTS", "Edge", "EdgeControls", "EdgeGraph", "EdgeScores",
    "EdgeSettings", "FaithfulnessCurve", "acdc", "check_threshold", "edge_attribution", "edge_controls",
    "edge_graph_of", "edge_graph_of_config", "edge_patching_each", "faithfulness_curve", "kept_by_each",
    "matched_random_edge_sets", "top_edges",
]
