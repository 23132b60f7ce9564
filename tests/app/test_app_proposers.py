"""The Proposers vs disposer page on the quick zoo (AppTest): it shows core's report and hands a
proposal to the ablation lab. At N = 32 (fewer examples than the 36 heads) co-activation cannot fit
an Ising model, so that proposal must be listed as not tested, with the reason, not dropped."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from core.heads import HeadSet
from core.model.refs import ModelRef
from core.pipelines.proposers import DISPOSER, proposers_vs_disposer
from core.tasks.specs import probe_spec
from tests.app.test_app import N, T, chart, errors, make_app, open_page

pytestmark = pytest.mark.zoo


def test_page_runs_all_proposers_and_sends_one_to_the_lab(quick_zoo):
    torch.set_num_threads(1)
    expected = proposers_vs_disposer(ModelRef.parse("induction-neox"), None, probe_spec("induction", N, T),
                                     disposer=replace(DISPOSER, n_controls=5))
    at = open_page(make_app(), "proposers")
    assert not at.exception, at.exception
    at.number_input(key="pvd_controls").set_value(5)
    at.button(key="pvd_run").click().run()
    assert not at.exception, at.exception
    assert errors(at) == []
    table = at.dataframe[0].value
    assert list(table["method"]) == ["spectral", "pattern screen", "co-activation", "gradient"]
    assert list(table["verdict (paper)"]) == [d.verdict_paper for d in expected.disposals]
    coact = expected.disposals[2]
    assert coact.verdict_paper == "not tested" and "32 examples for 36 heads" in coact.proposal.rationale
    bars = [t for t in chart(at, "pvd_fig")["data"] if t["type"] == "bar"]
    assert len(bars) == 3 * 4
    screen = expected.disposals[1].proposal.heads
    at.button(key="pvd_send_pattern screen").click().run()
    assert not at.exception, at.exception
    assert at.text_input(key="heads_text").value == str(HeadSet(screen))  # core's one text form of a head set
