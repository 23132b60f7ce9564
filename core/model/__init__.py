"""Model references, checkpoints, loading and the hook / weight views of a loaded model."""

from core.model import gguf  # noqa: F401  registers ModelRef.parse's importer of .gguf paths (refs.py says why)
