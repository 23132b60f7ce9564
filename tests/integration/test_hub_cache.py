"""The hub path offline: a zoo model written into a real Hugging Face cache layout (core/zoo/hub_cache.py)
is listed with huggingface_hub's cache scan, loaded by revision, probed, screened and ablated with
exactly the numbers of the same weights read from the zoo folder.

Everything runs offline on tiny random-init models (tests/tiny_models.py), in a temporary
HEADLAB_HOME and hub cache. huggingface_hub reads HF_HUB_CACHE and HF_HUB_OFFLINE once at import,
so the tests patch those constants as well as the environment.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import huggingface_hub
import huggingface_hub.constants as hub_constants
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from core.__main__ import build_parser
from core.ablation.study import AblationSettings, summarize_ablation
from core.errors import HeadLabError
from core.heads import HeadSet
from core.model.loading import load_config, load_model
from core.model.refs import (
    PYTHIA_TOKENS_PER_STEP,
    Checkpoint,
    ModelRef,
    cached_revisions,
    list_checkpoints,
    parse_revision,
    read_manifest,
    resolve_checkpoint,
    weights_fingerprint,
)
from core.pipelines.recipe import ScreenSettings, ablate, screen
from core.probe import head_stats
from core.tasks.specs import probe_spec
from core.zoo.hub_cache import hub_revision, write_hub_cache
from tests.tiny_models import make_fake_zoo

ZOO_MODEL = "tiny-neox"
HUB = "headlab/pythia-tiny"
OLMO_HUB = "headlab/olmo-tiny"
STEPS = (0, 10, 100)
SPEC = probe_spec("induction", 16, 32, seed=7, token_low=0, token_high=256)


def use_hub_cache(monkeypatch: pytest.MonkeyPatch, home: Path) -> Path:
    """HEADLAB_HOME and HF_HOME under `home`, offline; returns the hub cache folder ($HF_HOME/hub)."""
    cache = home / "hf" / "hub"
    monkeypatch.setenv("HEADLAB_HOME", str(home / "headlab"))
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    return cache


@pytest.fixture(scope="module")
def fixture_home(tmp_path_factory) -> Path:
    """A fake zoo model and its hub-cache copies (Pythia and OLMo names), written once per module."""
    home = tmp_path_factory.mktemp("hub-home")
    with pytest.MonkeyPatch.context() as mp:
        use_hub_cache(mp, home)
        make_fake_zoo(home / "headlab" / "zoo", ZOO_MODEL, "gpt_neox", steps=STEPS, seed=5)
        write_hub_cache(ZOO_MODEL, HUB)
        write_hub_cache(ZOO_MODEL, OLMO_HUB, style="olmo")
    return home


@pytest.fixture
def hub(fixture_home, monkeypatch) -> Path:
    """The module's fixture, offline, for one test; returns the hub cache folder."""
    return use_hub_cache(monkeypatch, fixture_home)


def no_network(*args, **kwargs):
    raise AssertionError("the hub was asked while offline")


# ----------------------------------------------------------------------------- listing


def test_cache_listing_gives_the_zoo_checkpoints_with_pythia_tokens(hub, monkeypatch):
    monkeypatch.setattr(huggingface_hub, "list_repo_refs", no_network)
    ref = ModelRef.parse(HUB)
    assert ref.kind == "hub"
    assert list_checkpoints(ref) == [Checkpoint(f"step{s}", s, s * PYTHIA_TOKENS_PER_STEP) for s in STEPS]
    assert resolve_checkpoint(ref).revision == "step100"
    # the cache is one huggingface_hub itself reads: no warnings, main on the last checkpoint
    info = huggingface_hub.scan_cache_dir(hub)
    assert info.warnings == []
    (repo,) = [r for r in info.repos if r.repo_id == HUB]
    assert set(repo.refs) == {"main", "step0", "step10", "step100"}
    assert repo.refs["main"].commit_hash == repo.refs["step100"].commit_hash
    assert len(repo.revisions) == len(STEPS)
    for revision in repo.revisions:
        assert {f.file_name for f in revision.files} >= {"config.json", "model.safetensors"}
        assert all(f.file_path.is_symlink() and not os.path.isabs(os.readlink(f.file_path)) for f in revision.files)
    assert cached_revisions(HUB) == {name: rev.commit_hash for name, rev in repo.refs.items()}


def test_olmo_style_names_carry_the_zoo_token_counts(hub):
    zoo = [(c["step"], c["tokens"]) for c in read_manifest(ZOO_MODEL)["checkpoints"]]
    listed = list_checkpoints(ModelRef.parse(OLMO_HUB))
    assert [(c.step, c.tokens) for c in listed] == sorted(zoo)
    assert [c.revision for c in listed] == ["step0-tokens0B", "step10-tokens0.00002048B", "step100-tokens0.0002048B"]
    assert hub_revision(20000, 84 * 10**9, "olmo") == "step20000-tokens84B"
    assert parse_revision("allenai/OLMo-1B-hf", "step20000-tokens84B") == (20000, 84 * 10**9)
    assert parse_revision("allenai/OLMo-1B-hf", "step738020-tokens3095B") == (738020, 3095 * 10**9)


def test_without_network_the_listing_falls_back_to_the_cache(hub, monkeypatch):
    def unreachable(name):
        raise ConnectionError("no network")

    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "list_repo_refs", unreachable)
    assert [c.revision for c in list_checkpoints(ModelRef.parse(HUB))] == [f"step{s}" for s in STEPS]
    with pytest.raises(HeadLabError, match="cannot list the revisions of hub model EleutherAI/pythia-14m"):
        list_checkpoints(ModelRef("EleutherAI/pythia-14m", "hub"))


def test_online_the_listing_is_the_hubs_branches(hub, monkeypatch):
    class Refs:
        branches = [type("Branch", (), {"name": n})() for n in ("main", "step143000", "step1")]

    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "list_repo_refs", lambda name: Refs())
    assert [c.revision for c in list_checkpoints(ModelRef.parse(HUB))] == ["step1", "step143000"]


# ----------------------------------------------------------------------------- loading


def test_from_pretrained_reads_the_cache_by_revision(hub):
    for step in STEPS:
        zoo_folder = hub.parent.parent / "headlab" / "zoo" / ZOO_MODEL / "checkpoints" / f"step{step:06d}"
        from_zoo = AutoModelForCausalLM.from_pretrained(str(zoo_folder))
        from_hub = AutoModelForCausalLM.from_pretrained(HUB, revision=f"step{step}", local_files_only=True,
                                                        cache_dir=str(hub))
        for (name, a), (_, b) in zip(from_zoo.state_dict().items(), from_hub.state_dict().items()):
            assert torch.equal(a, b), (step, name)
    assert AutoConfig.from_pretrained(HUB, revision="main", local_files_only=True).num_hidden_layers == 2


def test_probe_by_revision_is_identical_to_the_zoo_folder(hub):
    hub_ref, zoo_ref = ModelRef.parse(HUB), ModelRef.parse(ZOO_MODEL)
    batch = SPEC.build()
    for step in (10, 100):
        from_hub = head_stats(hub_ref, resolve_checkpoint(hub_ref, f"step{step}"), batch).to_tensors()
        from_zoo = head_stats(zoo_ref, resolve_checkpoint(zoo_ref, f"step{step:06d}"), batch).to_tensors()
        assert from_hub.keys() == from_zoo.keys()
        for name in from_zoo:
            assert torch.equal(from_hub[name], from_zoo[name]), (step, name)
    other = head_stats(zoo_ref, resolve_checkpoint(zoo_ref, "step000000"), batch).to_tensors()
    assert not torch.equal(other["z_query"], from_hub["z_query"])  # the revision picks the weights


def test_a_revision_not_in_the_cache_is_a_clear_error(hub):
    ref = ModelRef.parse(HUB)
    expected = (f"{HUB} revision step7 is not in the local cache; download it with "
                f"`huggingface-cli download {HUB} --revision step7` (or `hf download {HUB} --revision step7`) "
                "or drop HF_HUB_OFFLINE")
    for call in (lambda: resolve_checkpoint(ref, "step7"), lambda: load_config(ref, "step7"),
                 lambda: load_model(ref, "step7")):
        with pytest.raises(HeadLabError) as info:
            call()
        assert expected in str(info.value)
    with pytest.raises(HeadLabError, match="EleutherAI/pythia-14m revision step1000 is not in the local cache"):
        load_config(ModelRef("EleutherAI/pythia-14m", "hub"), "step1000")


def test_weights_fingerprint_of_a_hub_revision_is_its_cached_commit(hub):
    ref = ModelRef.parse(HUB)
    commits = cached_revisions(HUB)
    assert weights_fingerprint(ref, "step10") == commits["step10"]
    assert weights_fingerprint(ref, "main") == commits["step100"]
    assert weights_fingerprint(ref, "step7") is None


# ----------------------------------------------------------------------------- screen and ablation


def test_screen_and_ablation_on_the_hub_model_match_the_zoo_folder(hub):
    hub_ref, zoo_ref = ModelRef.parse(HUB), ModelRef.parse(ZOO_MODEL)
    settings = ScreenSettings(n_null_draws=20)
    from_hub, from_zoo = screen(hub_ref, SPEC, settings), screen(zoo_ref, SPEC, settings)
    assert (from_hub.spectral.pr == from_zoo.spectral.pr).all()
    assert (from_hub.selectivity_by_checkpoint == from_zoo.selectivity_by_checkpoint).all()
    assert from_hub.final.to_json() == from_zoo.final.to_json()
    # the tokens differ (Pythia's 2,097,152 per step vs the zoo's 2,048), in proportion: same ranking
    assert from_hub.spectral.top_heads == from_zoo.spectral.top_heads
    selection = HeadSet(((1, 0), (1, 2)))
    ablation = AblationSettings(n_controls=3, n_boot=50, min_controls=3)
    hub_result = ablate(hub_ref, "step100", selection, SPEC, ablation)
    zoo_result = ablate(zoo_ref, "step000100", selection, SPEC, ablation)
    assert summarize_ablation(hub_result) == summarize_ablation(zoo_result)
    assert hub_result.stats == zoo_result.stats
    assert hub_result.provenance["model"] == HUB and hub_result.provenance["revision"] == "step100"


# ----------------------------------------------------------------------------- the command


def test_cli_zoo_as_hub_writes_the_cache_and_is_idempotent(hub, capsys):
    args = build_parser().parse_args(["zoo", "--as-hub", "someone/pythia-cli", "--model", ZOO_MODEL])
    first = args.run(args)
    assert "someone/pythia-cli" in capsys.readouterr().out
    assert [c["revision"] for c in first["checkpoints"]] == [f"step{s}" for s in STEPS]
    assert cached_revisions("someone/pythia-cli")["main"] == first["checkpoints"][-1]["commit"]
    again = args.run(args)
    assert again["checkpoints"] == first["checkpoints"]  # content-addressed: same blobs, same commits
    commits = cached_revisions(HUB)  # the same weights as the module's fixture: the same commits
    assert [c["commit"] for c in first["checkpoints"]] == [commits[f"step{s}"] for s in STEPS]
    with pytest.raises(HeadLabError, match="has no 'pythia' in it"):
        write_hub_cache(ZOO_MODEL, "someone/induction")
    with pytest.raises(HeadLabError, match="unknown zoo model 'no-such-model'"):
        write_hub_cache("no-such-model", "someone/pythia-x")


def test_export_from_the_hub_cache_writes_the_zoo_folders_numbers(hub, tmp_path):
    """`export` on the hub name: the same screen and ablation tables as the zoo folder (data files only)."""
    def export(model: str, revision: str, out: Path) -> dict:
        argv = ["export", model, "--figure", "spectral", "--figure", "screen", "--figure", "ablation", "--out", str(out),
                "--heads", "L1H0,L1H2", "--controls", "3", "--formats", "", "--revision", revision,
                "--n", "16", "--seq-len", "32", "--seed", "7"]
        args = build_parser().parse_args(argv)
        return args.run(args)

    from_hub = export(HUB, "step100", tmp_path / "hub")
    from_zoo = export(ZOO_MODEL, "step000100", tmp_path / "zoo")
    assert from_hub["ablation"]["verdicts"] == from_zoo["ablation"]["verdicts"]
    hub_files = sorted(Path(p).name.replace("pythia-tiny-", "") for p in from_hub["files"])
    assert hub_files == sorted(Path(p).name.replace(f"{ZOO_MODEL}-", "") for p in from_zoo["files"])
    compared = 0
    for name in hub_files:
        if "spectral" in name:
            continue  # its token axis is Pythia's 2,097,152 per step on the hub, the zoo's own count in the folder
        hub_path, zoo_path = tmp_path / "hub" / f"pythia-tiny-{name}", tmp_path / "zoo" / f"{ZOO_MODEL}-{name}"
        if name.endswith(".json"):
            assert _without_names(json.loads(hub_path.read_text())) == _without_names(json.loads(zoo_path.read_text())), name
        else:
            with open(hub_path) as hub_file, open(zoo_path) as zoo_file:
                hub_rows, zoo_rows = list(csv.DictReader(hub_file)), list(csv.DictReader(zoo_file))
            assert [_without_names(r) for r in hub_rows] == [_without_names(r) for r in zoo_rows], name
        compared += 1
    assert compared >= 10


def _without_names(data):
    """`data` less what names the source rather than measures it: provenance, model, revision and
    token counts (Pythia's 2,097,152 per step on the hub, the zoo's own count in the folder)."""
    if isinstance(data, dict):
        return {k: _without_names(v) for k, v in data.items() if k not in ("provenance", "model", "revision", "tokens")}
    if isinstance(data, list):
        return [_without_names(v) for v in data]
    return data
