"""The sidebar's precision choice (AppTest on the quick zoo): it comes from the URL, reaches the model
loader and the cache keys, and the figures show what core measures in that dtype."""

from __future__ import annotations

import numpy as np
import pytest

from core.model.refs import ModelRef, list_checkpoints
from core.pipelines.recipe import screen_checkpoint
from core.probe import head_stats, head_stats_key
from core.store import entry_path
from core.tasks.specs import probe_spec
from pages._state import WORKSPACE
from tests.app.test_app import MODEL, chart, errors, make_app, open_page

pytestmark = pytest.mark.zoo

SEED = 9173  # a probe no other test measures, so its cache entries are this test's own
N, T = 8, 32  # the smallest probe the sidebar takes: the page probes every checkpoint, twice (float16, then float32)


def test_precision_flows_from_the_sidebar_into_the_cache_and_the_figures(quick_zoo):
    ref = ModelRef.parse(MODEL)
    final = list_checkpoints(ref)[-1]
    spec = probe_spec("induction", N, T, SEED)
    keys = {d: head_stats_key(ref, final.revision, dict(spec.build().spec), d) for d in ("float32", "float16")}
    at = open_page(make_app(n=N, seq_len=T, seed=SEED, dtype="float16", revision=final.revision), "screen")
    assert not at.exception, at.exception
    assert errors(at) == []
    assert at.selectbox(key="_w_dtype").value == "float16"
    assert at.session_state[WORKSPACE].dtype == "float16"
    assert entry_path(keys["float16"]).is_dir() and not entry_path(keys["float32"]).is_dir()
    expected = screen_checkpoint(head_stats(ref, final, spec, dtype="float16"), n_null_draws=0)
    heat = chart(at, "screen_heatmap")["data"][0]
    np.testing.assert_array_equal(np.asarray(heat["customdata"], dtype=float),
                                  expected.selectivity[list(expected.patterns).index("induction")])
    # back to float32: its own entry, and the URL follows
    at.selectbox(key="_w_dtype").set_value("float32").run()
    assert not at.exception and errors(at) == []
    assert at.session_state[WORKSPACE].dtype == "float32"
    assert entry_path(keys["float32"]).is_dir()
    assert at.query_params["dtype"] in ("float32", ["float32"])


def test_unknown_precision_in_the_url_falls_back_to_float32(quick_zoo):
    at = open_page(make_app(dtype="fp16"), "spectral")
    assert not at.exception, at.exception
    assert at.session_state[WORKSPACE].dtype == "float32"
