"""Where the tests find the published reference files: the project's own copy (tests/data/reference/,
sources and licences in its README), so a plain clone reproduces the published numbers."""

from pathlib import Path

REFERENCE = Path(__file__).resolve().parent / "data" / "reference"
CLOSURE = REFERENCE / "coactivation-closure" / "results"  # [CVC] result files
SPC = REFERENCE / "spectral-probe-circuits"  # [SPC] result files
