"""Seeded data for probing and training: the induction and natural-text probe batches, byte text, [HHG] sequences.

Everything random takes an explicit seed, so a probe spec fully determines its batch.
"""

from core.tasks.induction import (
    InductionProbeSpec,
    default_zoo_probe_spec,
    make_induction_probe,
    reference_probe_spec,
)
from core.tasks.probe_batch import PATTERNS, ProbeBatch
from core.tasks.text import (
    TextProbeSpec,
    default_text_probe_spec,
    load_text_bytes,
    make_text_probe,
    text_fingerprint,
)
from core.tasks.vocab import BOS, BYTE_VOCAB_SIZE, EOS, PAD, SEP

__all__ = [
    "BOS",
    "BYTE_VOCAB_SIZE",
    "EOS",
    "PAD",
    "PATTERNS",
    "SEP",
    "InductionProbeSpec",
    "ProbeBatch",
    "TextProbeSpec",
    "default_text_probe_spec",
    "default_zoo_probe_spec",
    "load_text_bytes",
    "make_induction_probe",
    "make_text_probe",
    "reference_probe_spec",
    "text_fingerprint",
]
