"""AppTest runs the app the way a running server does: every run goes through app.py.

Streamlit treats a `pages/` folder next to the entry script as a legacy multipage app until the first
st.navigation call switches that off (for the whole server, once). AppTest resets the switch before
every run, so every run after `switch_page` would execute the page file alone, without app.py and its
sidebar. The fixture keeps the switch off after each reset, as on a server after its first run; the
test of a deep link as the first request asks for the legacy behaviour back (it is what app.py's
pages/_state.current_workspace recovers from).
"""

from __future__ import annotations

import pytest
from streamlit.runtime.pages_manager import PagesManager


@pytest.fixture(autouse=True)
def navigation_runs_app_py(monkeypatch):
    """Keep Streamlit's legacy pages/ mode off in AppTest; returns the unpatched PagesManager.__init__."""
    legacy_init = PagesManager.__init__

    def init(self, *args, **kwargs):
        legacy_init(self, *args, **kwargs)
        PagesManager.uses_pages_directory = False

    monkeypatch.setattr(PagesManager, "__init__", init)
    return legacy_init
