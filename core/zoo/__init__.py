"""HeadLab's own model zoo: the training loop and the presets."""
