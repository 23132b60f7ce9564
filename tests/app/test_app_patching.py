"""The "Patching" page on the quick zoo's induction-neox through streamlit's AppTest (the upload path is in
tests/app/test_browser.py: AppTest cannot fill a file uploader).

The heatmap must show exactly what core computes for the built-in counterfactual, the identity check must
read zero, and the top heads must reach the ablation lab in one click.
"""

from __future__ import annotations

import numpy as np
import pytest

from core.ablation.patching import PatchSettings
from core.figures.patching import top_heads
from core.heads import HeadSet
from core.model.refs import ModelRef
from core.pipelines.patching import PatchPlan, patch_model
from core.tasks.counterfactual import InductionCounterfactualSpec
from core.tasks.specs import probe_spec
from tests.app.test_app import chart, errors, make_app, open_page

pytestmark = pytest.mark.zoo

MODEL, N = "induction-neox", 16


def test_built_in_counterfactual_matches_core_and_sends_top_heads_to_the_ablation_lab(quick_zoo):
    at = open_page(make_app(model=MODEL, n=N), "patching")
    assert not at.exception, at.exception
    assert errors(at) == []
    at.button(key="patch_run").click().run()
    assert not at.exception, at.exception
    assert errors(at) == []
    expected = patch_model(ModelRef(MODEL, "zoo"), None, InductionCounterfactualSpec(probe_spec("induction", N, 64)),
                           PatchSettings(), PatchPlan())
    heat = next(t for t in chart(at, "patch_heads")["data"] if t["type"] == "heatmap")
    np.testing.assert_allclose(np.asarray(heat["z"]), expected.activation.scores, atol=1e-5)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["identity check"] == "0.0e+00"
    assert metrics["Spearman ρ (attribution, activation)"] == f"{expected.spearman:.2f}"
    assert at.button(key="patch_run").disabled  # the same pairs and settings are not patched twice

    top = str(HeadSet(tuple(top_heads(expected))))  # HeadSet orders heads by layer; the box lists them by effect
    assert sorted(at.multiselect(key=f"patch_send::{MODEL}::{expected.revision}").value) == sorted(top.split(","))
    at.button(key="patch_to_ablation").click().run()
    assert not at.exception, at.exception
    assert [t.value for t in at.title] == ["Ablation lab"]
    assert at.text_input(key="heads_text").value == top
