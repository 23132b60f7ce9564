"""The app opened on a hub name, offline, over a local Hugging Face cache (AppTest, no browser).

A tiny zoo model is written into a temporary hub cache (core/zoo/hub_cache.py) as a Pythia-named
hub model; the app opened with ?model=ORG/NAME must list the cached revisions as its checkpoints,
say where they come from, and draw the pattern screen with the numbers of the zoo folder's weights.
HF_HOME and HF_HUB_OFFLINE are set before the app runs; huggingface_hub read its constants at
import, so those are patched too.
"""

from __future__ import annotations

from pathlib import Path

import huggingface_hub
import huggingface_hub.constants as hub_constants
import numpy as np
import pytest

from core.model.refs import ModelRef, list_checkpoints
from core.pipelines.recipe import ScreenSettings, screen
from core.tasks.specs import probe_spec
from core.zoo.hub_cache import write_hub_cache
from pages._cache import NULL_DRAWS
from pages._widgets import format_tokens
from tests.app.test_app import chart, errors, make_app, open_page
from tests.tiny_models import make_fake_zoo

ZOO_MODEL = "tiny-neox"
HUB = "headlab/pythia-tiny-app"
STEPS = (0, 10, 100)
N, T = 16, 32


def no_network(*args, **kwargs):
    raise AssertionError("the hub was asked while offline")


@pytest.fixture
def hub_home(tmp_path: Path, monkeypatch) -> Path:
    """A fake zoo and its hub-cache copy under tmp_path, offline; returns the hub cache folder."""
    cache = tmp_path / "hf" / "hub"
    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path / "headlab"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub, "list_repo_refs", no_network)
    make_fake_zoo(tmp_path / "headlab" / "zoo", ZOO_MODEL, "gpt_neox", steps=STEPS, seed=11)
    write_hub_cache(ZOO_MODEL, HUB)
    return cache


def test_app_on_a_hub_name_lists_the_cache_and_screens_it(hub_home):
    at = make_app(HUB, n=N, seq_len=T)
    at.run()
    assert not at.exception, at.exception
    assert errors(at) == []
    assert at.session_state["model"] == HUB
    assert at.session_state["revision"] == "step100"  # the last cached checkpoint
    slider = at.select_slider(key="_w_revision")
    checkpoints = list_checkpoints(ModelRef.parse(HUB))
    assert [c.revision for c in checkpoints] == [f"step{s}" for s in STEPS]
    assert list(slider.options) == [format_tokens(c.tokens) for c in checkpoints]
    captions = " ".join(c.value for c in at.sidebar.caption)
    assert "checkpoints from the local Hugging Face cache (offline)" in captions
    assert "holds 4 revisions: main, step0, step10, step100" in captions

    open_page(at, "screen")
    assert not at.exception, at.exception
    assert errors(at) == []
    heat = chart(at, "screen_heatmap")["data"][0]
    zoo = screen(ModelRef.parse(ZOO_MODEL), probe_spec("induction", N, T), ScreenSettings(n_null_draws=NULL_DRAWS))
    expected = zoo.selectivity_by_checkpoint[-1, list(zoo.final.patterns).index("induction")]  # [layer, head]
    np.testing.assert_array_equal(np.asarray(heat["customdata"], dtype=float), expected)


def test_app_on_a_hub_revision_missing_from_the_cache_says_how_to_get_it(hub_home):
    at = make_app(HUB, n=N, seq_len=T, revision="step7")
    at.run()
    assert not at.exception, at.exception
    assert at.session_state["revision"] == "step100"  # the slider falls back to a cached checkpoint
    at = open_page(make_app(f"{HUB}-missing", n=N, seq_len=T), "screen")
    assert not at.exception, at.exception
    assert any("holds none" in e and "HF_HUB_OFFLINE is set" in e for e in errors(at)), errors(at)
