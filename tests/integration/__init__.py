"""Integration tests: tiny random-init models and the trained quick zoo."""
