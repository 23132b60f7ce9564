"""Unit tests: hand-made arrays and configs, no model."""
