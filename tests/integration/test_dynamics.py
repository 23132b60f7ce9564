"""Training dynamics drivers (core/pipelines/dynamics.py) on tiny fake zoo models.

The drivers run on tiny random-init checkpoints saved as a fake zoo (tests/tiny_models.py), where
every cell can be recomputed directly with the ablation engine. The pure functions and the figure
builders are tested on hand-made arrays in tests/unit/test_dynamics.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from core.errors import HeadLabError
from core.heads import HeadSet


# ---------------------------------------------------------------------------------------------
# drivers on tiny fake zoo models (random weights: the numbers are checked against the engine itself)


@pytest.fixture(scope="module")
def fake_zoo():
    from core.workspace import zoo_dir
    from tests.tiny_models import make_fake_zoo

    zoo = zoo_dir()
    for name, seed in (("dyn-a", 0), ("dyn-b", 10)):
        if not (zoo / name).exists():
            make_fake_zoo(zoo, name, "gpt_neox", steps=(0, 10, 100), seed=seed)
    return zoo


def _spec():
    from core.tasks.specs import probe_spec

    return probe_spec("induction", n_examples=16, seq_len=32)


def test_training_trajectories_match_the_recipe(fake_zoo):
    from core.model.refs import ModelRef, list_checkpoints
    from core.pipelines.recipe import screen_checkpoint
    from core.probe import head_stats
    from core.stats.spectral import pr_per_head
    from core.pipelines.dynamics import training_trajectories

    ref = ModelRef.parse("dyn-a")
    traj = training_trajectories(ref, _spec())
    assert traj.pr.shape == (3, 2, 4) and traj.membership.shape == (3, 2, 4)
    batch = _spec().build()
    for i, ckpt in enumerate(list_checkpoints(ref)):
        stats = head_stats(ref, ckpt, batch)
        np.testing.assert_allclose(traj.pr[i], pr_per_head(stats.z_query))
        np.testing.assert_allclose(traj.membership[i], screen_checkpoint(stats, n_null_draws=0).membership)
    assert traj.tokens == (0.0, 20480.0, 204800.0)


def test_training_trajectories_need_the_induction_probe(fake_zoo):
    from core.pipelines.dynamics import training_trajectories
    from core.model.refs import ModelRef
    from core.tasks.specs import probe_spec

    with pytest.raises(HeadLabError, match="induction"):
        training_trajectories(ModelRef.parse("dyn-a"), probe_spec("text", 8, 32))


def test_cross_seed_matrix_cells_are_engine_results_and_resume(fake_zoo, tmp_path, monkeypatch):
    import core.pipelines.dynamics as dynamics
    from core.ablation.study import AblationSettings, ablation_study
    from core.model.loading import load_model
    from core.model.refs import ModelRef

    refs = [ModelRef.parse("dyn-a"), ModelRef.parse("dyn-b")]
    circuits = {"dyn-a": HeadSet(((1, 0),)), "dyn-b": HeadSet(((1, 0), (1, 1), (1, 2)))}  # b: 3 of 4 heads
    matrix = dynamics.cross_seed_matrix(refs, _spec(), circuits, n_controls=3, store_dir=tmp_path)
    assert matrix.models == ("dyn-a", "dyn-b") and len(matrix.cells) == 2
    direct = ablation_study(load_model(refs[1]), _spec().build(), circuits["dyn-a"], AblationSettings(n_controls=3, seed=123))
    cell = matrix.cells[0][1]  # circuit of a in model b
    assert cell["loss"]["candidate_delta"] == pytest.approx(direct.stats["loss"]["candidate_delta"])
    assert cell["loss"]["z"] == pytest.approx(direct.stats["loss"]["z"])
    assert cell["jaccard_with_own"] == pytest.approx(1 / 3)
    # b's circuit holds more than half of layer 1: any-layer controls, said so
    assert matrix.cells[1][1]["control_kind"] == "any-layer"
    assert any("any-layer" in note for note in matrix.cells[1][1]["notes"])
    assert len(list(tmp_path.glob("*.json"))) == 4
    # a rerun reads every cell from disk: the engine is never called
    monkeypatch.setattr(dynamics, "ablate_with_controls", lambda *a, **k: pytest.fail("recomputed a stored cell"))
    again = dynamics.cross_seed_matrix(refs, _spec(), circuits, n_controls=3, store_dir=tmp_path)
    assert again.cells == matrix.cells
    assert dynamics.CrossSeedMatrix.from_json(again.to_json()).cells == matrix.cells
    (tmp_path / "dyn-a__in__dyn-b.json").unlink()
    with pytest.raises(pytest.fail.Exception, match="recomputed"):  # a cell no longer stored is measured again
        dynamics.cross_seed_matrix(refs, _spec(), circuits, n_controls=3, store_dir=tmp_path)


def test_cross_seed_matrix_empty_circuit_gives_a_reason(fake_zoo):
    from core.pipelines.dynamics import cross_seed_matrix
    from core.model.refs import ModelRef

    refs = [ModelRef.parse("dyn-a")]
    matrix = cross_seed_matrix(refs, _spec(), {"dyn-a": HeadSet()}, n_controls=3)
    assert matrix.cells == ((None,),) and "no circuit" in matrix.reasons[0][0]


def test_form_vs_function_per_checkpoint(fake_zoo):
    from core.pipelines.dynamics import form_vs_function, training_trajectories
    from core.model.refs import ModelRef

    ref = ModelRef.parse("dyn-a")
    circuit = HeadSet(((1, 0), (1, 3)))
    traj = training_trajectories(ref, _spec())
    ff = form_vs_function(ref, circuit, _spec(), traj, n_controls=3)
    assert len(ff.cells) == 3 and ff.revisions == traj.revisions
    np.testing.assert_allclose(ff.form_score, traj.membership[:, 1, [0, 3]].mean(axis=1))
    # two of layer 1's four heads leave one matched control set: no closure verdict can stand on it
    assert all(c["closure_verdict"] == "inconclusive" for c in ff.cells)
    assert len(ff.labels) == 3
    with pytest.raises(HeadLabError, match="empty"):
        form_vs_function(ref, HeadSet(), _spec(), traj)
    last = form_vs_function(ref, circuit, _spec(), traj, n_controls=3, revisions=[traj.revisions[-1]])
    assert last.revisions == traj.revisions[-1:] and last.tokens == traj.tokens[-1:]
    assert last.cells[0] == ff.cells[-1]  # the same seeded controls on the same checkpoint
    with pytest.raises(HeadLabError, match="no checkpoint"):
        form_vs_function(ref, circuit, _spec(), traj, revisions=["step9999999"])
