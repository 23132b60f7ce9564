"""Group ablation: spec.py (Ablation, the one metric definition), engine.py (hooks, prefix reuse), study.py (studies, summaries, worst examples)."""
