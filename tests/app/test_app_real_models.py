"""The Real models page (AppTest): it draws the committed `study` reports of docs/real-models/ from their JSON and
Markdown alone (no model runs), and leaves out the report's links to PNG files since it draws the figures itself."""

from __future__ import annotations

import base64
import json

import numpy as np
from streamlit.testing.v1 import AppTest

from pages.real_models import REPORT_CHOICE, committed_reports, without_figure_links
from tests.app.test_app import APP, chart, errors

REPORTS = committed_reports()


def plotly_array(value) -> np.ndarray:
    """A plotly JSON array: a list, or its typed-array form {"dtype", "bdata" (base64), "shape"}."""
    if isinstance(value, dict):
        shape = tuple(int(x) for x in str(value.get("shape", "-1")).split(","))
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"]).reshape(shape)
    return np.asarray(value, dtype=float)


def real_models_page() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.switch_page("pages/real_models.py")
    at.run()
    assert not at.exception, at.exception
    return at


def test_page_draws_each_committed_report():
    at = real_models_page()
    assert errors(at) == []
    choice = at.selectbox(key=REPORT_CHOICE)
    assert list(choice.options) == list(REPORTS)
    ioi_name = next(name for name in REPORTS if name.endswith("-ioi"))
    choice.set_value(ioi_name).run()
    assert not at.exception, at.exception
    report = json.loads((REPORTS[ioi_name] / "report.json").read_text())
    ioi = report["ioi"]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Logit difference (IO - S)"] == f"{ioi['logit_diff']['clean_mean']:.3f}"
    assert metrics["IO beats S"] == f"{100 * ioi['logit_diff']['share_io_beats_s']:.1f}%"
    heat = chart(at, f"real_{ioi_name}_study-ioi-patching")["data"][0]
    np.testing.assert_allclose(plotly_array(heat["z"]), np.asarray(ioi["patching"]["scores"]), atol=1e-9)
    text = "\n".join(m.value for m in at.markdown)
    assert "| method | edges | CPR (higher better) | CMD (lower better)" in text
    assert f"{ioi['edges_eap']['curve']['cpr']:.3f}" in text
    assert "## Figures" not in text and ".png)" not in text


def test_report_helpers_on_hand_made_inputs(tmp_path):
    assert committed_reports(tmp_path / "absent") == {}
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "report.json").write_text("{}")
    (tmp_path / "a").mkdir()  # no report.json: not a report
    assert list(committed_reports(tmp_path)) == ["b"]
    text = "# T\n\n## IOI\nrow\n\n## Figures\n\n- [x](x.png)\n\n## Not measured\n\n- y"
    assert without_figure_links(text) == "# T\n\n## IOI\nrow\n\n## Not measured\n\n- y"
