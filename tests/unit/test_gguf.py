"""GGUF import (issue 40) on a tiny GGUF written with GGUFWriter: the zoo model it writes computes what
transformers' own GGUF loader computes, its manifest says where it came from, and a `.gguf` path given as
a model names that zoo model (imported once, reused by SHA-256)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from core.model.gguf import QUANTIZED_NOTE, file_sha256, find_import, name_from_stem, read_gguf_header
from core.model.loading import load_model
from core.model.refs import ModelRef, checkpoint_path, list_checkpoints, read_manifest
from core.workspace import zoo_dir
from tests.fake_gguf import write_fake_gguf


@pytest.fixture(scope="module")
def fake_gguf(tmp_path_factory) -> Path:
    return write_fake_gguf(tmp_path_factory.mktemp("gguf") / "Tiny Llama.F32.gguf")


@pytest.fixture(scope="module")
def imported_home(fake_gguf, tmp_path_factory) -> tuple[Path, str]:
    """A fresh HEADLAB_HOME and the zoo name of the fake GGUF, imported there by naming it as a model, once."""
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HEADLAB_HOME", str(home))
        ref = ModelRef.parse(str(fake_gguf))
    return home, ref.name


@pytest.fixture
def imported(imported_home, monkeypatch) -> str:
    """The imported model's zoo name, with HEADLAB_HOME set to the home holding it."""
    home, name = imported_home
    monkeypatch.setenv("HEADLAB_HOME", str(home))
    return name


def test_header_facts_and_names():
    assert name_from_stem(Path("/x/SmolLM2-135M-Instruct.Q4_1.gguf")) == "SmolLM2-135M-Instruct.Q4_1"
    assert name_from_stem(Path("/x/my model (v2).gguf")) == "my-model-v2"
    assert name_from_stem(Path("/x/...gguf")) == "gguf-model"


def test_header_of_the_fake(fake_gguf):
    assert read_gguf_header(fake_gguf) == {"architecture": "llama", "quantization": "ALL_F32", "model_name": "fake",
                                           "licence": None}


def test_the_imported_model_computes_what_transformers_gguf_loader_computes(fake_gguf, imported):
    assert imported == "Tiny-Llama.F32"
    reference = AutoModelForCausalLM.from_pretrained(str(fake_gguf.parent), gguf_file=fake_gguf.name,
                                                     dtype=torch.float32).eval()
    bridge = load_model(ModelRef.parse(imported))
    tokens = torch.tensor([[4, 0, 1, 2, 3, 0, 2]])  # [1, T]: BOS then ordinary tokens
    with torch.no_grad():
        torch.testing.assert_close(bridge(tokens), reference(tokens).logits, atol=1e-5, rtol=1e-5)


def test_manifest_config_and_checkpoints(fake_gguf, imported):
    manifest = read_manifest(imported)
    assert manifest["kind"] == "imported" and manifest["complete"] is True and manifest["train_seconds"] is None
    assert manifest["source"]["sha256"] == file_sha256(fake_gguf) and manifest["source"]["quantization"] == "ALL_F32"
    assert manifest["source"]["dtype"] == "float32" and manifest["source"]["file"] == fake_gguf.name
    assert manifest["config"]["model"]["n_kv_heads"] == 1 and manifest["config"]["model"]["n_heads"] == 2
    assert "quantized model" in manifest["note"] and "quantized model" in QUANTIZED_NOTE
    ref = ModelRef.parse(imported)
    assert [(c.revision, c.step, c.tokens) for c in list_checkpoints(ref)] == [("main", 0, -1)]
    folder = checkpoint_path(ref)
    assert folder == zoo_dir() / imported / "checkpoints" / "main"
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    assert (folder / "tokenizer.json").is_file()


def test_the_same_file_again_reuses_the_import_and_says_so(fake_gguf, imported, tmp_path, capsys):
    copy = tmp_path / "another-name.gguf"
    copy.write_bytes(fake_gguf.read_bytes())  # same bytes, another name: the same model
    assert ModelRef.parse(str(copy)) == ModelRef(imported, "zoo")
    assert f"already imported as zoo model {imported} (same SHA-256" in capsys.readouterr().out
    assert find_import(file_sha256(copy)) == imported
    assert sorted(p.name for p in zoo_dir().iterdir()) == [imported]


def test_models_lists_the_import_with_its_source_sha256_and_the_quantization_note(fake_gguf, imported, capsys):
    from core.__main__ import main  # the command line, as a user runs it

    assert main(["models"]) == 0
    out = capsys.readouterr().out
    sha256 = file_sha256(fake_gguf)
    assert f"ALL_F32 from {fake_gguf.name}, SHA-256 {sha256}, licence not stated in the file" in out
    assert f"note: {QUANTIZED_NOTE}." in out
    assert main(["models", "import", str(fake_gguf), "--name", "second-copy"]) == 0  # same bytes: reused, not copied
    assert f"already imported as zoo model {imported}" in capsys.readouterr().out
    assert sorted(p.name for p in zoo_dir().iterdir()) == [imported]
