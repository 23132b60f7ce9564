"""The "Patching" page on the quick zoo's induction-neox through streamlit's AppTest (the upload path is in
tests/app/test_browser.py: AppTest cannot fill a file uploader).

The heatmap must show exactly what core computes for the built-in counterfactual, the identity check must
read zero, and the top heads must reach the ablation lab in one click.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core.ablation.patching import PatchSettings
from core.ablation.study import AblationSettings
from core.figures.patching import top_heads
from core.heads import HeadSet
from core.model.refs import ModelRef
from core.pipelines.patching import PatchPlan, patch_model
from core.pipelines.recipe import ablate
from core.tasks.counterfactual import InductionCounterfactualSpec
from core.tasks.probe_file import read_probe_file
from core.tasks.specs import probe_spec
from pages._state import LAB_ON_FILE, LAB_PROBE, PROBE_FILE
from tests.app.test_app import chart, errors, make_app, open_page

pytestmark = pytest.mark.zoo

MODEL, N = "induction-neox", 16
EXAMPLE_PROBES = Path(__file__).resolve().parents[2] / "assets" / "probes" / "ioi_example.jsonl"


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


def test_the_lab_ablates_on_an_uploaded_probe_files_prompts(quick_zoo):
    """A probe file uploaded on the Patching page (put in the session here: AppTest cannot fill an uploader) is
    offered in the lab; ablating on it gives core's numbers for `ablate --probe-file` and says so."""
    probe_file = read_probe_file(EXAMPLE_PROBES)
    at = make_app(model=MODEL, n=N)
    at.session_state[PROBE_FILE] = probe_file
    at = open_page(at, "ablation")
    assert not at.exception, at.exception
    at.radio(key=LAB_PROBE).set_value(LAB_ON_FILE).run()
    at.text_input(key="heads_text").input("L1H1,L1H3").run()
    at.button(key="run_ablation").click().run()
    assert not at.exception, at.exception
    assert errors(at) == []
    assert any("on the 8 prompts of ioi_example.jsonl" in c.value for c in at.caption)
    expected = ablate(ModelRef(MODEL, "zoo"), None, HeadSet([(1, 1), (1, 3)]), probe_file, AblationSettings())
    shown = at.dataframe[0].value.set_index("metric")
    for metric in ("loss", "target_logit"):
        # the lab picks its thread count at the click: float32 sums in another order differ in the 7th digit
        assert shown.loc[metric, "candidate Δ"] == pytest.approx(expected.stats[metric]["candidate_delta"], abs=1e-6)
