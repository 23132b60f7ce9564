"""The project's copy of the published reference files (tests/data/reference/): every file listed in its
README is there with its recorded size and SHA-256, and a clone with nothing beside it reproduces a
published figure (no test reads a folder outside the checkout)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reference_data import REFERENCE

REPO_ROOT = Path(__file__).resolve().parents[2]
# "### `path`" then "- size: N bytes; sha256 `hex`"
LISTED = re.compile(r"^### `([^`]+)`\n(?:- .*\n)*?- size: (\d+) bytes; sha256 `([0-9a-f]{64})`", re.MULTILINE)


def _listed_files() -> list[tuple[str, int, str]]:
    return [(path, int(size), digest) for path, size, digest in LISTED.findall((REFERENCE / "README.md").read_text())]


def test_every_reference_file_is_listed_with_its_size_and_sha256():
    listed = sorted(_listed_files())
    on_disk = sorted(str(p.relative_to(REFERENCE)) for p in REFERENCE.rglob("*") if p.is_file() and p.name != "README.md")
    assert sorted(path for path, _, _ in listed) == on_disk
    for path, size, digest in listed:
        data = (REFERENCE / path).read_bytes()
        assert len(data) == size, path
        assert hashlib.sha256(data).hexdigest() == digest, path


def test_both_licences_travel_with_the_data():
    for repo in ("coactivation-closure", "spectral-probe-circuits"):
        assert (REFERENCE / repo / "LICENSE").read_text().startswith("MIT License")


def test_no_project_file_reads_a_folder_beside_the_checkout():
    pattern = re.compile(r"\.\./shared|parent\s*/\s*[\"']shared[\"']")
    files = [REPO_ROOT / "README.md", *(p for top in ("core", "pages", "tests", "docs") for p in (REPO_ROOT / top).rglob("*"))]
    offenders = [str(path.relative_to(REPO_ROOT)) for path in files
                 if path.suffix in {".py", ".md"} and path != Path(__file__).resolve()
                 and pattern.search(path.read_text(errors="replace"))]
    assert offenders == []


@pytest.mark.skipif(shutil.which("git") is None or not (REPO_ROOT / ".git").exists(), reason="needs the git checkout")
def test_a_clone_with_no_sibling_folder_reproduces_a_published_figure(tmp_path):
    """Clone the committed tree alone into a temporary folder and run the published closure test there."""
    clone = tmp_path / "lonely" / "headlab"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO_ROOT), str(clone)], check=True)
    assert not (clone.parent / "shared").exists()
    env = {**os.environ, "PYTHONPATH": str(clone), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
         "tests/unit/test_inference.py", "-k", "reference"],
        cwd=clone, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "3 passed" in result.stdout
