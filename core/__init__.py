"""HeadLab's compute layer: models, probes, statistics, ablation. Never imports streamlit."""

__version__ = "0.1.0"
