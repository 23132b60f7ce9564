"""Steps 1-3 on the quick zoo's models, cross-checked against independent head scores and the README tour.

The independent scores use TransformerLens's own head-detector detection patterns
(`get_previous_token_head_detection_pattern` etc., applied to token sequences directly, since
`detect_head` needs a tokenizer), its 'mul' similarity score, and Olsson et al.'s prefix-matching
score, all computed here from full attention patterns (`hook_pattern`): a code path the screen never
uses, with targets found from token identity rather than from the probe's planted positions.

The detector's score is a share of attention. The like-for-like HeadLab score is the selectivity
against the uniform baseline (share x (q+1); the membership selectivity that picks circuits). The
default selectivity divides by each head's own attention on 50 random keys instead, a different
statistic that may reorder close heads, so for it only the top heads and the all-head ranking must
agree. Two cross-checks, because the screen reads one query position (q = T-1, METHODS.md) and the
detector averages every position:
- at the query position, on the probe's own sequences: the detector's score with every attention row
  but q's zeroed, i.e. the same quantity as the screen's.
- averaged over every position of BOS + 31 random bytes twice (63 tokens): a different statistic on
  different data, so only the top heads and the all-head ranking must agree (induction: also above
  the floor). L1H1 of duplicate-neox attends to duplicates far more when the whole second half repeats
  (share at the last position 0.68) than on the probe's single repeat (0.30), so its duplicate-token
  Spearman over the 5 heads above the floor is 0.70 there.
Duplicate-token heads are checked on `duplicate-neox`, the zoo model trained to grow them; the
induction models have at most one head above the null floor (induction-neox: 2.5x, floor 2.0).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr
from transformer_lens.head_detector import (compute_head_attention_similarity_score,
                                            get_duplicate_token_head_detection_pattern,
                                            get_induction_head_detection_pattern,
                                            get_previous_token_head_detection_pattern)

from core.__main__ import main
from core.model.loading import load_model
from core.model.refs import ModelRef
from core.pipelines.recipe import ScreenSettings, run_recipe, screen
from core.stats.selectivity import circuit_members
from core.tasks import BOS, PATTERNS
from core.tasks.specs import probe_spec

pytestmark = pytest.mark.zoo

MODEL = "induction-neox"
DUPLICATE_MODEL = "duplicate-neox"
HALF_LEN = 31  # BOS + 2 x 31 tokens: the cross-check sequences span the probe's 64 positions but one
# The README tour's key claims (its steps 1-3): the zoo's weights depend on the CPU's float kernels (docs/zoo.md),
# and the same code and seed trained other heads on an AMD EPYC (AVX2) than on the Intel Xeon (AVX-512) the
# README's figures come from, so the tour is recorded once per CPU seen, and the suite's zoo must reproduce every
# claim of one of them. CPU -> its `python -m core recipe induction-neox --json` output:
MEASUREMENTS = Path(__file__).resolve().parents[2] / "docs" / "measurements"
TOURS = {"Intel Xeon (AVX-512), the README's": MEASUREMENTS / "tour-recipe.json",
         "AMD EPYC (AVX2)": MEASUREMENTS / "tour-recipe-avx2.json"}


@pytest.fixture(scope="module")
def report(quick_zoo):
    return screen(ModelRef.parse(MODEL), probe_spec("induction"), ScreenSettings(n_null_draws=200))


@pytest.fixture(scope="module")
def screens(quick_zoo, report):
    """The final-checkpoint screen of each quick-zoo model the cross-check uses."""
    duplicate = screen(ModelRef.parse(DUPLICATE_MODEL), probe_spec("induction"), ScreenSettings(n_null_draws=200))
    return {MODEL: report.final, DUPLICATE_MODEL: duplicate.final}


def attention_on_repeats(name: str):
    """Full attention patterns [example, layer, head, q, k] on BOS + HALF_LEN random bytes repeated twice."""
    model = load_model(ModelRef.parse(name))
    gen = torch.Generator().manual_seed(7)
    half = torch.randint(0, 256, (48, HALF_LEN), generator=gen)
    tokens = torch.cat([torch.full((48, 1), BOS), half, half], dim=1)
    n_layers = model.cfg.n_layers
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_pattern"))
    patterns = torch.stack([cache[f"blocks.{l}.attn.hook_pattern"] for l in range(n_layers)], dim=1)
    return tokens, patterns


@pytest.fixture(scope="module")
def repeated_patterns(quick_zoo):
    return attention_on_repeats(MODEL)


@pytest.fixture(scope="module")
def duplicate_repeated_patterns(quick_zoo):
    return attention_on_repeats(DUPLICATE_MODEL)


def prefix_matching(tokens, patterns) -> np.ndarray:
    """Olsson et al.: mean attention from each second-copy token to the token after its first copy."""
    half = (tokens.shape[1] - 1) // 2
    queries = torch.arange(half + 1, 2 * half + 1)
    keys = queries - half + 1
    scores = patterns[:, :, :, queries, keys]  # [example, layer, head, position]
    return scores[..., :-1].mean(dim=(0, -1)).numpy()


def detector_scores(tokens, patterns, make_detection) -> np.ndarray:
    """TransformerLens head-detector 'mul' scores [layer, head], averaged over sequences."""
    n_examples, n_layers, n_heads = patterns.shape[:3]
    out = np.zeros((n_layers, n_heads))
    for example in range(n_examples):
        detection = make_detection(tokens[example])
        for layer in range(n_layers):
            for head in range(n_heads):
                out[layer, head] += compute_head_attention_similarity_score(
                    patterns[example, layer, head], detection,
                    exclude_bos=False, exclude_current_token=False, error_measure="mul")
    return out / n_examples


def top3(scores: np.ndarray) -> set:
    order = np.argsort(-scores, axis=None)[:3]
    return {tuple(int(i) for i in np.unravel_index(o, scores.shape)) for o in order}


def test_candidate_circuit_is_the_top_prefix_matching_heads(report, repeated_patterns):
    circuit = set(report.candidate_circuit)
    assert circuit, "no head reached the membership threshold (50x scaled to the probe length)"
    pm = prefix_matching(*repeated_patterns)
    best_outside = max(pm[h] for h in np.ndindex(pm.shape) if h not in circuit)
    assert min(pm[h] for h in circuit) > best_outside


def test_literal_50x_members_are_the_top_prefix_matching_heads(report, repeated_patterns):
    """METHODS.md's 50x against 1/(q+1), unscaled: at T = 64 it asks for >= 78% of the attention on p+1,
    which the quick model (trained on repeats up to 40 bytes, the probe's distances) gives in its
    strongest heads; those are exactly the top heads by prefix matching."""
    literal = set(circuit_members(report.final.membership, 50.0))
    assert literal, "no head reached the literal 50x"
    assert literal <= set(report.candidate_circuit)
    pm = prefix_matching(*repeated_patterns)
    top = {tuple(int(i) for i in np.unravel_index(o, pm.shape)) for o in np.argsort(-pm, axis=None)[:len(literal)]}
    assert literal == top


def test_previous_token_heads_sit_below_the_induction_heads(report):
    """Previous-token heads far above the null floor, all below the induction circuit's layer.

    The quick zoo's weights depend on the CPU's float kernels (same code, same seed: repeated-half
    loss 0.815 at 20 tokens on one machine, 0.622 on another), and with them where the strongest
    previous-token head falls against the 30x class line (78.6x on one, 29.4x on the other). So the
    check is a margin over the null floor (10x it), not the class line itself.
    """
    previous = report.final.selectivity[PATTERNS.index("previous-token")]  # [layer, head]
    assert previous.max() >= 10 * report.final.noise_floor, f"strongest previous-token head {previous.max():.1f}x"
    prev_heads = report.final.previous_token_circuit
    assert len(prev_heads) > 0, "no previous-token circuit (membership threshold)"
    first_prev_layer = min(prev_heads.layers)
    assert all(layer > first_prev_layer for layer, _ in report.candidate_circuit)


def test_specialized_fraction_reported_with_its_null_floor(report):
    fractions = report.final.fractions()
    assert 0.0 < fractions["specialized_fraction_above_null_p99"] < 1.0
    assert report.final.noise_floor >= 2.0


DETECTORS = [
    ("previous-token", MODEL, get_previous_token_head_detection_pattern),
    ("duplicate-token", DUPLICATE_MODEL, get_duplicate_token_head_detection_pattern),
    ("induction", MODEL, get_induction_head_detection_pattern),
]


def query_rows_on_probe(name: str):
    """The screen's probe tokens [example, pos] and each head's full attention row at q
    [example, layer, head, key], from hook_pattern."""
    batch = probe_spec("induction").build()
    model = load_model(ModelRef.parse(name))
    rows = []
    with torch.no_grad():
        for start in range(0, len(batch.tokens), 64):
            tokens = batch.tokens[start:start + 64]
            query = batch.query_pos[start:start + 64]
            _, cache = model.run_with_cache(tokens, names_filter=lambda hook: hook.endswith("hook_pattern"))
            examples = torch.arange(len(tokens))
            rows.append(torch.stack([cache[f"blocks.{l}.attn.hook_pattern"][examples, :, query, :]
                                     for l in range(model.cfg.n_layers)], dim=1))
    return batch.tokens, batch.query_pos, torch.cat(rows)


@pytest.fixture(scope="module")
def probe_query_rows(quick_zoo):
    return {name: query_rows_on_probe(name) for name in (MODEL, DUPLICATE_MODEL)}


def detector_scores_at_query(tokens, query_pos, rows, make_detection) -> np.ndarray:
    """The detector's 'mul' score [layer, head] of the attention pattern with every row but q's zeroed
    (so: the share of q's attention on the detection targets), averaged over sequences."""
    n_examples, n_layers, n_heads, seq_len = rows.shape
    out = np.zeros((n_layers, n_heads))
    for example in range(n_examples):
        detection = make_detection(tokens[example])
        q = int(query_pos[example])
        for layer in range(n_layers):
            for head in range(n_heads):
                pattern = torch.zeros(seq_len, seq_len)
                pattern[q] = rows[example, layer, head]
                out[layer, head] += compute_head_attention_similarity_score(
                    pattern, detection, exclude_bos=False, exclude_current_token=False, error_measure="mul")
    return out / n_examples


def screen_scores(screens, name: str, pattern: str):
    """The screen's default selectivity [layer, head] for one pattern, its membership (uniform-baseline)
    selectivity [layer, head], and the null floor."""
    final = screens[name]
    default, membership = final.selectivity[final.patterns.index(pattern)], final.membership_of(pattern)
    assert (membership > final.noise_floor).sum() >= 3, f"{name} has fewer than 3 {pattern} heads above the null floor"
    return default, membership, final.noise_floor


@pytest.mark.parametrize("pattern, name, make_detection", DETECTORS)
def test_agrees_with_transformer_lens_head_detector_at_the_query_position(screens, probe_query_rows,
                                                                         pattern, name, make_detection):
    """Membership selectivity: top-3 sets overlap in >= 2 heads, Spearman >= 0.8 over the heads above the
    null floor and over all heads. Default selectivity: top-3 overlap >= 2, all-head Spearman >= 0.8.

    Measured on the 256 probe sequences (membership: top-3, heads above the floor, Spearman above,
    Spearman all; default: top-3, Spearman all): previous-token 3/3, 5, 1.00, 1.00; 3/3, 1.00.
    Duplicate-token 3/3, 5, 1.00, 1.00; 3/3, 1.00. Induction 3/3, 6, 1.00, 1.00; 3/3, 1.00.
    Over the heads above the floor the default selectivity gives 0.70 for previous-token: L0H8 is
    78.6x (first, beside L0H9's 78.4x) but takes only 0.27 of q's attention to L0H9's 0.61 and
    L0H1's 0.33, because it puts almost none on the random keys.
    """
    default, membership, floor = screen_scores(screens, name, pattern)
    theirs = detector_scores_at_query(*probe_query_rows[name], make_detection)
    above_floor = membership > floor
    assert len(top3(membership) & top3(theirs)) >= 2
    assert spearmanr(membership[above_floor], theirs[above_floor]).statistic >= 0.8
    assert spearmanr(membership.ravel(), theirs.ravel()).statistic >= 0.8
    assert len(top3(default) & top3(theirs)) >= 2
    assert spearmanr(default.ravel(), theirs.ravel()).statistic >= 0.8


@pytest.mark.parametrize("pattern, name, make_detection", DETECTORS)
def test_agrees_with_transformer_lens_head_detector_over_repeated_tokens(
        screens, repeated_patterns, duplicate_repeated_patterns, pattern, name, make_detection):
    """Averaged over every position of repeated random tokens, default selectivity: top-3 sets overlap in
    >= 2 heads and the all-head rankings agree (Spearman >= 0.8); for induction also over the heads above
    the floor. Measured: previous-token 3/3, 0.97; duplicate-token 3/3, 0.86; induction 3/3, 0.965 (0.94
    over its 6 heads above the floor)."""
    default, membership, floor = screen_scores(screens, name, pattern)
    patterns = duplicate_repeated_patterns if name == DUPLICATE_MODEL else repeated_patterns
    theirs = detector_scores(*patterns, make_detection)
    assert len(top3(default) & top3(theirs)) >= 2
    assert spearmanr(default.ravel(), theirs.ravel()).statistic >= 0.8
    if pattern == "induction":
        above_floor = default > floor
        assert spearmanr(default[above_floor], theirs[above_floor]).statistic >= 0.8


def test_screen_cli_writes_json_and_second_probe_is_cached(quick_zoo, tmp_path, capsys):
    """`python -m core screen`, then `probe` over every checkpoint, in this process (core.__main__.main; the
    interpreter's own start is tested in tests/unit/test_cli_startup.py)."""
    out = tmp_path / "screen.json"
    small = ["--n", "32"]  # every checkpoint is probed: an eighth of the default probe keeps the test short
    assert main(["screen", MODEL, "--task", "induction", *small, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["candidate_circuit"] and len(data["spectral"]["pr"]) == len(data["checkpoints"])
    capsys.readouterr()
    assert main(["probe", MODEL, "--all-checkpoints", *small]) == 0
    assert capsys.readouterr().out.count("cached") == len(data["checkpoints"])


@pytest.fixture(scope="module")
def recipe(quick_zoo) -> dict:
    """`python -m core recipe induction-neox` (20 matched draws): what the README's tour runs."""
    return run_recipe(ModelRef.parse(MODEL), probe_spec("induction"), n_controls=20)


def test_recipe_finds_a_causal_circuit_and_composition(recipe):
    """Issue 4 on the quick zoo: the screened circuit is causal against 20 matched draws, the upper
    bound saturates, and ablating the previous-token circuit also breaks induction."""
    out = recipe
    assert out["verdict"]["label"] == "causal"
    metrics = out["candidate"]["summary"]["metrics"]
    assert metrics["loss"]["candidate_delta"] > max(out["candidate"]["result"]["stats"]["loss"]["control_deltas"])
    assert metrics["top1"]["candidate_delta"] < min(out["candidate"]["result"]["stats"]["top1"]["control_deltas"])
    assert metrics["top1"]["upper_bound_delta"] <= -0.9 * metrics["top1"]["clean"]
    composition = out["composition"]["summary"]["metrics"]
    assert composition["top1"]["candidate_delta"] < -0.5 * composition["top1"]["clean"]
    assert composition["loss"]["z"] > 1.8


def tour_claims(recipe_run: dict) -> dict:
    """What the README's tour claims of a recipe run: circuits, the spectral top six as a set, the verdict."""
    found = recipe_run["screen"]
    return {"candidate circuit": found["candidate_circuit"], "previous-token circuit": found["previous_token_circuit"],
            "spectral top six": sorted(found["top_k_spectral"][:6]),
            "ablated selection": recipe_run["candidate"]["summary"]["selection"],
            "verdict": recipe_run["verdict"]["label"]}


def test_the_quick_zoo_gives_one_recorded_tour(recipe):
    recorded = {cpu: tour_claims(json.loads(path.read_text())) for cpu, path in TOURS.items()}
    assert {claims["verdict"] for claims in recorded.values()} == {"causal"}
    got = tour_claims(recipe)
    assert got in recorded.values(), f"this CPU's quick zoo gives {got}; the recorded tours: {recorded}"
