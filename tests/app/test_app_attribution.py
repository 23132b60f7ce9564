"""The "Gradient vs causal" page on the quick zoo's reverse-hhg, through streamlit's AppTest.

The live analysis must show exactly what core computes, picked heads must reach the ablation lab,
stored per-seed results must give the seed-level figures, a model trained for another task is told
(st.info) with a way out, and bad input (an OOD length without valid samples) must show st.error while
the page keeps working. Few OOD
batches and evaluation examples keep it quick on two CPUs.
"""

from __future__ import annotations

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from core.model.refs import ModelRef
from core.pipelines import attribution as attr
from core.pipelines import attribution_results as ares
from core.pipelines.attribution import analyze_ref
from core.pipelines.attribution_results import AttributionSettings, summarize
from core.workspace import atomic_write_json
from tests.app.test_app import chart, errors, make_app, open_page

pytestmark = pytest.mark.zoo

MODEL = "reverse-hhg"
N_BATCHES, N_EXAMPLES = 2, 200
EXPORTS_PER_FIGURE = 5  # PNG, SVG, PDF, CSV, JSON


def open_attribution(model: str = MODEL) -> AppTest:
    at = open_page(make_app(model=model, n=32), "attribution")
    assert not at.exception, at.exception
    return at


def quick_settings(at: AppTest) -> None:
    at.number_input(key="attr_n_batches").set_value(N_BATCHES)
    at.number_input(key="attr_n_examples").set_value(N_EXAMPLES)


def test_live_analysis_matches_core_and_sends_heads_to_the_ablation_lab(quick_zoo):
    at = open_attribution()
    assert errors(at) == []
    assert any("Run analysis" in i.value for i in at.info)
    quick_settings(at)
    at.button(key="attr_run").click().run()
    assert not at.exception, at.exception
    assert errors(at) == []
    expected = analyze_ref(ModelRef(MODEL, "zoo"), AttributionSettings(task="reverse", n_batches=N_BATCHES, n_examples=N_EXAMPLES))
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["OOD length"] == str(expected.ood_length)
    assert metrics["hidden heroes"] == str(len(expected.members("hero")))
    scatter = chart(at, "attr_scatter")
    shown = {p[1]: (x, y) for t in scatter["data"] if t.get("name", "").startswith("layer ")
             for x, y, p in zip(t["x"], t["y"], t["customdata"])}
    assert shown == {c: (rc, rg) for c, rc, rg in zip(expected.components, expected.rank_C, expected.rank_G)}
    joint = [t for t in chart(at, "attr_joint")["data"] if t.get("name") == "joint"]
    assert [t["y"][0] for t in joint] == [j.joint_damage for j in (expected.joint_bloats, expected.joint_heroes) if j.components]
    assert len(at.download_button) == EXPORTS_PER_FIGURE * len(at.get("plotly_chart"))
    # the run button is spent: the same settings are not computed twice
    assert at.button(key="attr_run").disabled

    picker = at.multiselect[0]
    assert picker.value == [c for c in expected.members("hero") if "MLP" not in c]
    assert all("MLP" not in option for option in picker.options)  # the ablation lab ablates heads only
    picker.set_value(["L1H0", "L2H3"]).run()
    at.button(key="attr_to_ablation").click().run()
    assert not at.exception, at.exception
    assert [t.value for t in at.title] == ["Ablation lab"]
    assert at.text_input(key="heads_text").value == "L1H0,L2H3"
    # the workspace's induction probe already draws this model's own ordinary tokens (core/tasks/tokens.py), so the
    # hand-off keeps it: no switch, and nothing said about one
    assert at.session_state["task"] == "induction"
    assert not any("The probe was switched" in i.value for i in at.info)
    assert errors(at) == []  # the lab's probe fits the 104-token vocabulary


def test_model_trained_for_another_task_is_told_with_a_way_out(quick_zoo):
    at = open_attribution("induction-neox")
    assert errors(at) == []  # a normal state, said as information, not as an error
    assert any("trained for 'induction', not sequence reversal or sorting" in i.value for i in at.info)
    button = next(b for b in at.button if b.label == f"Analyse {MODEL} (reverse)")
    button.click().run()
    assert not at.exception, at.exception
    assert errors(at) == []
    assert any(f"**{MODEL}**" in m.value and "**reverse**" in m.value for m in at.markdown)


def test_ood_lengths_without_valid_samples_show_errors(quick_zoo):
    at = open_attribution()
    at.radio(key="attr_ood_choice").set_value("given").run()
    at.number_input(key="attr_ood_length").set_value(5).run()  # a training length
    assert any("OOD length 5 has no valid out-of-distribution samples" in e for e in errors(at))
    assert not any(b.key == "attr_run" for b in at.button)  # nothing to run with these settings
    at.number_input(key="attr_ood_length").set_value(30)
    at.number_input(key="attr_n_batches").set_value(1)
    at.number_input(key="attr_n_examples").set_value(20).run()
    assert errors(at) == []
    at.button(key="attr_run").click().run()
    assert not at.exception, at.exception
    assert any("solves none of the 20 samples of length 30" in e for e in errors(at))
    assert any("Over seeds" in s.value for s in at.subheader)  # the page keeps going


@pytest.fixture
def stored_seeds(quick_zoo):
    """Hand-made per-seed results as a preset run stores them: 3 reverse seeds (one skipped model), 2 sort."""
    folder = attr.attribution_dir() / "mean"
    written = []

    def store(name, task, G, C):
        settings = ares.AttributionSettings(task=task)
        result = ares.assemble_result(name, "step1", ares.component_order(4, 4), G, C, 0.5, {8: 0.5}, 8, settings,
                                      lambda members: 0.4)
        atomic_write_json(folder / f"{name}.json", result.to_json())
        written.append(folder / f"{name}.json")
        return result

    C = np.arange(1, 21) / 100  # rank_C = 1..20
    results = [store("fake-reverse-s0", "reverse", np.arange(1, 21), C),  # rho 1
               store("fake-reverse-s1", "reverse", np.arange(20, 0, -1), C),  # rho -1: 7 bloats, 7 heroes
               store("fake-reverse-s2", "reverse", np.r_[20, np.arange(2, 20), 1], C)]  # L0H0 bloat, L3MLP hero
    sort = [store(f"fake-sort-s{i}", "sort", np.arange(1, 21), C) for i in range(2)]
    skip = folder / "fake-reverse-s3.skipped.json"
    atomic_write_json(skip, {"model": "fake-reverse-s3", "revision": "step1", "reason": "no OOD length in the band",
                             "settings": ares.AttributionSettings(task="reverse").to_json()})
    written.append(skip)
    yield results, sort
    for path in written:
        path.unlink(missing_ok=True)


def test_seed_figures_from_stored_results(stored_seeds):
    results, sort = stored_seeds
    at = open_attribution()
    assert errors(at) == []
    expected = summarize(results, [("fake-reverse-s3", "no OOD length in the band")])
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["models"] == "3" and metrics["skipped"] == "1"
    strip = chart(at, "attr_rho_strip")
    seeds = [t for t in strip["data"] if t.get("name", "").endswith("seeds")]
    assert [t["y"] for t in seeds] == [list(expected.rhos), [1.0, 1.0]]  # reverse, then sort with the same settings
    heroes, bloats = chart(at, "attr_heatmap")["data"]
    z = np.asarray(bloats["z"], dtype=float)  # [layer, heads + MLP]
    want = np.zeros((4, 5))
    for comp, count in zip(expected.components, expected.bloat_counts):
        layer, head = int(comp[1]), comp[2:]
        want[layer, 4 if head == "MLP" else int(head[1:])] = count / 3
    np.testing.assert_allclose(z, want)
    assert np.asarray(heroes["z"], dtype=float)[3, 4] == pytest.approx(2 / 3)  # L3MLP a hero in s1 and s2
    assert any("fake-reverse-s3" in m.value for m in at.markdown)
