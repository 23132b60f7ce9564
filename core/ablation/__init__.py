"""The ablation engine: the metric definition, the hooks with prefix reuse, and studies over conditions."""
