"""Hand-wired models: weights written by code (being filled in)."""

HANDWIRED: dict = {}
