"""Benchmarks and the reference passes they time, kept out of the runtime modules."""
