"""Model -> result: each pipeline runs the probe and the ablation engine and returns a result dataclass."""
