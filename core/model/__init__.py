"""Model references, checkpoints, loading and the hook / weight views of a loaded model."""
