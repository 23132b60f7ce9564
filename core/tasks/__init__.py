"""Seeded data for probing and training: the induction (one-shot and repeated-sequence), natural-text and IOI
probe batches, clean/corrupted pairs for patching (built in, or from a user's probe file), byte text, [HHG]
sequences, and which tokens of a real model's tokenizer a random-token probe may draw (tokens.py).

Everything random takes an explicit seed, so a probe spec fully determines its batch.
"""

from core.tasks.counterfactual import InductionCounterfactualSpec, PatchPair
from core.tasks.induction import InductionProbeSpec, default_zoo_probe_spec, reference_probe_spec
from core.tasks.ioi import IoiCounterfactualSpec, IoiSpec, ioi_spec
from core.tasks.probe_batch import PATTERNS, ProbeBatch
from core.tasks.probe_file import ProbeFile, read_probe_file
from core.tasks.repeat import RepeatInductionSpec
from core.tasks.specs import ProbeSpec, probe_spec, spec_from_json
from core.tasks.text import TextProbeSpec, default_text_probe_spec, load_text_bytes, text_fingerprint
from core.tasks.vocab import BOS, BYTE_VOCAB_SIZE, EOS, PAD, SEP, token_label

__all__ = [
    "BOS",
    "BYTE_VOCAB_SIZE",
    "EOS",
    "PAD",
    "PATTERNS",
    "SEP",
    "InductionCounterfactualSpec",
    "InductionProbeSpec",
    "IoiCounterfactualSpec",
    "IoiSpec",
    "PatchPair",
    "ProbeBatch",
    "ProbeFile",
    "ProbeSpec",
    "RepeatInductionSpec",
    "TextProbeSpec",
    "default_text_probe_spec",
    "default_zoo_probe_spec",
    "ioi_spec",
    "load_text_bytes",
    "probe_spec",
    "read_probe_file",
    "reference_probe_spec",
    "spec_from_json",
    "text_fingerprint",
    "token_label",
]
