import json
import os
from pathlib import Path

import pytest

from core.errors import HeadLabError
from core.workspace import atomic_directory, atomic_write_json, headlab_home, json_text


def test_home_respects_env_and_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path / "hl"))
    assert headlab_home() == tmp_path / "hl"
    monkeypatch.delenv("HEADLAB_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert headlab_home() == tmp_path / "xdg" / "headlab"


def test_unwritable_home_is_a_clear_error(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("HEADLAB_HOME", str(blocker / "home"))
    with pytest.raises(HeadLabError, match="set HEADLAB_HOME"):
        headlab_home()


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write a read-only folder")
def test_readonly_home(monkeypatch, tmp_path):
    home = tmp_path / "ro"
    home.mkdir()
    home.chmod(0o500)
    monkeypatch.setenv("HEADLAB_HOME", str(home))
    with pytest.raises(HeadLabError, match="not writable"):
        headlab_home()


def test_atomic_directory_leaves_nothing_on_error(tmp_path):
    final = tmp_path / "entry"
    with pytest.raises(RuntimeError):
        with atomic_directory(final) as tmp:
            (tmp / "half.bin").write_bytes(b"x")
            raise RuntimeError("crash mid-write")
    assert not final.exists()
    assert list(tmp_path.iterdir()) == []
    with atomic_directory(final) as tmp:
        atomic_write_json(tmp / "meta.json", {"a": 1})
    assert (final / "meta.json").read_text().strip().startswith("{")
    assert [p.name for p in tmp_path.iterdir()] == ["entry"]


def test_json_text_puts_flat_lists_on_one_line_and_reads_back_equal(tmp_path):
    obj = {"a": [1, 2.5, None, "L0H1->L1H2.k"], "b": {"c": [[1, 2], {"d": []}], "e": {}}, "f": "x", "g": [True]}
    text = json_text(obj)
    assert json.loads(text) == obj
    assert '  "a": [1, 2.5, null, "L0H1->L1H2.k"],' in text.splitlines() and '      [1, 2],' in text.splitlines()
    atomic_write_json(tmp_path / "r.json", obj, flat_lists=True)
    assert (tmp_path / "r.json").read_text() == text + "\n"
