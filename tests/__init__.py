"""HeadLab tests."""
