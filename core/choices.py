"""The names and defaults the command line offers (tasks, dtypes, modes, methods, presets), and the checks of
a seed and a device its flags make as they are read.

Kept apart, importing nothing but core.errors, so that building a command's arguments loads no torch:
`python -m core CMD --help` and a mistyped flag answer at once. Each value lives here only; the module
that implements it imports it from here (core.tasks.specs takes PROBE_TASKS, core.ablation.spec the
modes, ...). A few registries hold heavy objects (the benchmark's methods, the zoo presets, the real
models); their names are copied here and tests/unit/test_cli_startup.py checks each copy against its
registry.
"""

from __future__ import annotations

import re
from numbers import Integral

from core.errors import HeadLabError

# --- where and how a model runs (core/executor.py, core/model/loading.py) ---
BACKENDS = ("serial", "ray")
DTYPE_NAMES = ("float32", "bfloat16", "float16")  # torch's dtypes of these names: core.model.loading.DTYPES
DEFAULT_DTYPE = "float32"


def check_device(device: str) -> str:
    """The device name, or HeadLabError: empty, a device HeadLab does not run on (tpu, ...), cuda or cuda:N
    without that GPU, mps without Apple's backend. The one check of a device, made by the CLI's argument layer
    (core/cli/probe.py device_arg) before any estimate or work, and again by every loader."""
    device = str(device).strip()
    if device == "cpu":  # the default: nothing to look up, so a command's flags load no torch
        return device
    if not device:
        raise HeadLabError("--device is empty; use cpu, or cuda / cuda:N on a machine with an NVIDIA GPU.")
    match = re.fullmatch(r"cuda(?::(\d+))?", device)
    if match:
        import torch  # to count the GPUs (the CLI's flags load it only when a GPU is asked for)

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise HeadLabError(f"device {device!r} was asked for but no CUDA GPU is present; use cpu.")
        if match.group(1) is not None and int(match.group(1)) >= count:
            raise HeadLabError(f"device {device!r} was asked for but this machine has {count} CUDA GPU(s) "
                               f"(cuda:0..cuda:{count - 1}); use one of those or cpu.")
        return device
    if device == "mps":
        import torch  # Apple's backend (the CLI's flags load it only when mps is asked for)

        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise HeadLabError("device 'mps' was asked for but Apple's MPS backend is not available here; use cpu.")
        return device
    raise HeadLabError(f"unknown device {device!r}; use cpu, or cuda / cuda:N on a machine with an NVIDIA GPU.")


# --- probes (core/tasks/) ---
PROBE_TASKS = ("induction", "induction-repeat", "text", "ioi")  # core.tasks.specs.SPEC_CLASSES, in this order
FREE_LENGTH_TASKS = ("induction", "induction-repeat", "text")  # probes of any seq_len (IOI's is its templates')
CORRUPTIONS = ("abc", "swap")  # the ioi task's counterfactuals (core/tasks/ioi.py)
PADDING_SIDES = ("right", "left")  # a probe file's padding (core/tasks/probe_file.py)
HHG_FORMATS = ("headlab", "reference")  # [HHG] reverse/sort training layouts (core/tasks/sequences.py says what)
MAX_SEED = 2**32 - 1  # numpy's RandomState takes seeds in [0, 2**32 - 1]; every probe and control draw uses it


def check_seed(seed: int, what: str = "seed") -> int:
    """The seed as an int, or HeadLabError when numpy's RandomState cannot take it (outside [0, 2**32 - 1]).

    what: how the user names it in the message (e.g. "--control-seed", "Induction probe seed").
    """
    if isinstance(seed, bool) or not isinstance(seed, Integral):
        raise HeadLabError(f"{what} must be a whole number, got {seed!r}.")
    if not 0 <= int(seed) <= MAX_SEED:
        raise HeadLabError(f"{what} is {seed}; use a seed between 0 and {MAX_SEED} (2**32 - 1).")
    return int(seed)


# --- metrics (core/stats/inference.py, core/ablation/patching/, core/ablation/edges/) ---
METRICS = ("loss", "top1", "top5", "target_logit")
PATCH_METRICS = ("logit_diff",) + METRICS
EDGE_METRICS = PATCH_METRICS + ("kl",)
EDGE_REPLACEMENTS = ("resample", "mean")  # what a patched edge carries
EDGE_ALGORITHMS = ("eap", "eap-ig", "acdc")  # core.ablation.edges.eap.METHODS
PATCH_DIRECTIONS = ("denoise", "noise")  # core.stats.patching.DIRECTIONS
CONTROL_KINDS = ("matched", "any-layer")
PATCH_TOP_K = 40  # heads activation-patched after attribution patching ranks them (core/pipelines/patching.py)

# --- ablation modes (core/ablation/spec.py) ---
NOT_A_HEAD_ABLATION = "not a head ablation: reproduces the published numbers"
# What an ablated activation is replaced by (core/ablation/replacements.py computes the values):
MODE_HELP = {
    "zero": "replaced by 0",
    "mean": "replaced by its mean over every example and position of the probe (one value per head)",
    "mean-per-position": "replaced by its mean over the probe examples at the same position",
    "resample": "replaced by the same component's output on another probe example (a seeded derangement)",
    "token-wise-mean": "replaced by its mean over every (example, position) of the probe holding the same input token",
    "reference-slice": NOT_A_HEAD_ABLATION + " ([HHG] reference code: the head's "
                       "all-position mean z written over columns h*d_head..(h+1)*d_head of the attention output after W_O)",
}
MODES = tuple(MODE_HELP)
PROBE_MODES = ("zero", "mean", "mean-per-position", "resample", "token-wise-mean")  # studies on a probe batch
SEQUENCE_MODES = ("mean", "mean-per-position", "reference-slice", "zero")  # [HHG] greedy decoding (ablated_logits_fn)


def mode_help(modes: tuple[str, ...], default: str = "zero") -> str:
    """Help text for a choice of ablation modes (a --mode flag, a page's selectbox): what each writes."""
    return "; ".join(f"{m}: {MODE_HELP[m]}" for m in modes) + f" (default {default})"


# --- the screen, attribution and closure defaults (core/stats/, core/pipelines/) ---
PR_DEFINITION = "entropy"  # core.stats.spectral.DEFAULT_DEFINITION
PR_RULE = "trapezoid"  # core.stats.spectral.DEFAULT_RULE
CLASS_THRESHOLD = 30.0  # core/stats/selectivity.py
GRADIENT_VARIANTS = ("paper", "reference")  # core/pipelines/attribution_results.py
CLASS_RULES = ("paper", "reference")
ATTRIBUTION_THRESHOLD = 6.0  # core.pipelines.attribution_results.DEFAULT_THRESHOLD
ISING_C = 1000.0  # core.stats.ising.DEFAULT_C
COACTIVATION_STRATA = 4  # reference K = 4 routing strata (core/pipelines/coactivation.py)
COACTIVATION_NULL = 10  # reference: 10 random partitions
CLOSURE_CONTROLS = 5  # reference closure test: 5 random controls per kind (core/pipelines/closure.py)
CLOSURE_CONTROL_SEED = 123  # reference matched-random RandomState(123)
PROPOSER_CONTROLS = 20  # random control sets per proposal (core/pipelines/proposers.py)
# the proposers of core/pipelines/proposers.py, in its order: name -> what it proposes
PROPOSER_SUMMARIES = {
    "spectral": "top heads by PR-integral over training [SPC Step 1]",
    "pattern screen": "heads at or above the induction membership threshold [SPC Step 2]",
    "co-activation": "the candidate Ising community [CVC]",
    "gradient": "top heads by probe-loss gradient norm [HHG]",
}

# --- reports (core/pipelines/replicate_claims.py, study.py, benchmark.py) ---
REPLICATE_TARGETS = ("spectral", "closure", "attribution")
REPLICATE_PRESETS = ("quick", "paper")
PR_RISE_MARGIN = 0.5  # PR units above the running minimum (core.stats.dynamics.DEFAULT_MARGIN)
STUDY_TASKS = ("induction", "ioi")
# the IOI stages that may be left out (--skip), most costly last; logit-diff and patching always run
SKIPPABLE = ("edges-eap", "edges-eap-ig", "random-edges", "stability", "roles", "disposer", "paths", "proposers",
             "gradient-vs-causal", "acdc-cost")
BENCHMARK_QUICK = dict(n_draws=1000, n_controls=10, n_random_groups=3, max_examples=48, n_boot=1000, disposer_boot=100)
# copies of core.pipelines.benchmark.HEAD_METHOD_NAMES and EDGE_METHOD_NAMES (checked by a test)
BENCHMARK_HEAD_METHODS = ("pattern screen", "spectral", "co-activation", "gradient", "activation patching (denoise)",
                          "activation patching (noise)", "attribution patching (denoise)", "attribution patching (noise)")
BENCHMARK_EDGE_METHODS = ("EAP", "EAP-IG", "ACDC", "ACDC (threshold sweep)")
IMAGE_FORMATS = ("png", "svg", "pdf")  # core/figures/bundle.py
PROBE_FIGURES = ("spectral", "screen", "ablation")  # `export --figure`: models probed with the induction or text batch
SEQUENCE_FIGURES = ("attribution",)  # [HHG] reversal / sorting models
EXPORT_FIGURES = PROBE_FIGURES + SEQUENCE_FIGURES

# --- the zoo (core/zoo/) ---
DEFAULT_PRESET = "quick"  # `python -m core zoo` without --preset
REAL_PRESET = "real"  # pretrained models fetched from the package index and imported (core/zoo/real.py); trains nothing
HUB_FIXTURE_MODEL = "induction-neox"  # the zoo model `zoo --as-hub` writes unless --model says otherwise
FAMILIES = ("gpt_neox", "llama", "olmoe")
TRAIN_TASKS = ("induction", "reverse", "sort", "shifted", "duplicate", "tokens", "none")  # core.zoo.config.TASKS
REVISION_STYLES = ("pythia", "olmo")  # hub branch names step{N} or step{N}-tokens{X}B (core/zoo/hub_cache.py)
ZOO_PRESET_NAMES = ("quick", "paper", "scale")  # a copy of core.zoo.presets.ZOO_PRESETS' keys (checked by a test)
REAL_MODEL_NAMES = ("smollm2-135m", "gemma3-270m")  # a copy of core.zoo.real.REAL_MODELS' keys (checked by a test)
# Published architectures, from EleutherAI/pythia-{14m,70m,160m,1b}'s config.json: name -> (layers, heads, d_model)
# (core.zoo.presets.PYTHIA_SHAPES builds each model config)
PYTHIA_SIZES = {"pythia-14m": (6, 4, 128), "pythia-70m": (6, 8, 512), "pythia-160m": (12, 12, 768),
                "pythia-1b": (16, 8, 2048)}

# --- benchmarks (core/bench/) ---
SWEEP_MODELS = ("induction-neox", "induction-olmoe")  # zoo models whose checkpoints `bench sweep` probes
