"""What a new user ran into in the app (issue 19), on the quick zoo through AppTest (no browser).

Degenerate controls give an "inconclusive" banner that says why, never a z of 1e8; a link with
garbage in it names what it ignored and what it uses instead; a local folder typed into the model
box loads (and a folder that is not a model is named in an error); a model with no circuit says so
on the dynamics page, which offers only real seeds and continuations.
"""

from __future__ import annotations

import pytest

from core.model.refs import ModelRef, list_checkpoints
from core.workspace import zoo_dir
from tests.app.test_app import errors, make_app, open_page

pytestmark = pytest.mark.zoo

PAGES = ("zoo", "spectral", "screen", "ablation", "inspector", "coactivation", "proposers", "attribution",
         "dynamics")


def _shown(at) -> str:
    return " ".join(b.value for b in [*at.success, *at.info, *at.warning, *at.error])


def test_degenerate_controls_are_inconclusive_in_the_banner(quick_zoo):
    # induction-olmoe has 2 x 4 heads: half of them leave exactly one any-layer control set
    at = open_page(make_app("induction-olmoe"), "ablation")
    at.text_input(key="heads_text").set_value("L0H0,L0H1,L0H2").run()
    assert at.button(key="run_ablation").disabled  # more than half of layer 0: no matched control exists
    assert "no disjoint matched control exists, so Run is off" in _shown(at)
    at.text_input(key="heads_text").set_value("L0H0,L0H1,L1H0,L1H1").run()
    assert "Only 1 distinct matched control set exists" in _shown(at)
    at.radio(key="control_kind").set_value("any-layer").run()
    assert "Only 1 distinct any-layer control set exists" in _shown(at)
    at.button(key="run_ablation").click().run()
    assert not at.exception, at.exception
    result = at.session_state["ablation_history"][0]["result"]
    assert {v.label for v in result.verdicts.values()} == {"inconclusive"}
    banner = " ".join(w.value for w in at.warning)
    assert "Closure verdict, paper rule [CVC]: inconclusive" in banner
    assert "only 1 distinct control set was measured" in banner
    assert "only 1 distinct any-layer control set exists" in banner.lower()
    table = next(d.value for d in at.dataframe if "z" in d.value.columns)  # the results table (the probe-size panel has none)
    assert list(table["z"]) == ["n/a (degenerate)"] * len(table)
    assert all(result.stats[m].get("z") is None for m in result.stats)  # no z from controls that do not vary
    # another model: the heads picked on this one are cleared, with a word
    at.selectbox(key="_w_model").set_value("induction-neox").run()
    assert not at.exception, at.exception
    assert at.text_input(key="heads_text").value == ""
    assert any("was made on induction-olmoe; it is cleared" in i.value for i in at.info)


def test_a_garbage_link_is_named_on_every_page(quick_zoo):
    at = make_app(seq_len=99999, revision="nope", head="L99H99", heads="L99H99")
    at.run()
    last = list_checkpoints(ModelRef.parse("induction-neox"))[-1].revision
    for page in PAGES:
        at.switch_page(f"pages/{page}.py")
        at.run()
        assert not at.exception, (page, at.exception)
        notes = " ".join(w.value for w in at.sidebar.warning)
        assert "seq_len=99999 is outside 8..4096, so the default 64 is used" in notes, page
        assert f"revision='nope' is not a checkpoint of induction-neox, so its last checkpoint, {last}, is used" in notes
        if page == "ablation":
            assert any("L99H99 is outside this model" in e for e in errors(at))
            assert at.button(key="run_ablation").disabled
        if page == "inspector":
            assert "This link's head='L99H99' names no head of this model" in _shown(at)


def _type_into_model_box(at, text: str) -> None:
    """What typing `text` into the model box and picking "Add: text" sends (AppTest knows only listed options)."""
    box = at.selectbox(key="_w_model")
    box.options.append(text)
    box.set_value(text).run()


def test_a_folder_typed_into_the_model_box_loads(quick_zoo, tmp_path):
    folder = str(zoo_dir() / "induction-neox" / "checkpoints" / list_checkpoints(ModelRef.parse("induction-neox"))[-1].revision)
    at = make_app()
    at.run()
    _type_into_model_box(at, folder)
    assert not at.exception, at.exception
    assert errors(at) == []
    assert at.session_state["model"] == folder and at.query_params["model"] in (folder, [folder])
    _type_into_model_box(at, str(tmp_path))  # an empty folder: not a model
    assert any(f"folder {tmp_path} is not a model checkpoint" in e for e in errors(at))
    assert at.selectbox(key="_w_model").value == str(tmp_path)  # kept, not reverted to the default


def test_dynamics_of_a_model_without_a_circuit(quick_zoo):
    at = open_page(make_app("duplicate-neox"), "dynamics")
    assert not at.exception, at.exception
    shown = {m.label: m.value for m in at.metric}
    assert shown["earliest identifying checkpoint"] == "no circuit found"
    assert "0 tokens" not in shown.values() and "0.000%" not in shown.values()
    assert "No zoo model continues duplicate-neox" in _shown(at)  # never induction-olmoe, an unrelated model
    assert at.multiselect(key="dyn_seed_models-duplicate-neox").options == ["duplicate-neox"]
