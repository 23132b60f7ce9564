"""The command line: one module per command, argument wiring only."""
