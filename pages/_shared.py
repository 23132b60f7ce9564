"""What every page shares: the workspace sidebar, cached data loads, figures with export buttons.

Choices live in `st.session_state` (so they persist across pages) and in `st.query_params`
(so a link reopens the same view). Data loads go through `st.cache_data` over core's disk cache;
models through `st.cache_resource`. Pages stay thin: read the workspace, call these, draw.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import streamlit as st

from core.errors import HeadLabError
from core.figures.bundle import FigureBundle, heads_from_points
from core.heads import Head, head_name, parse_heads
from core.model.loading import Checkpoint, ModelRef, list_checkpoints, list_zoo, load_model
from core.workspace import zoo_dir

STATE_KEYS = ("model", "revision", "task", "n", "seq_len", "seed", "token_low", "token_high", "head", "pattern")
INT_KEYS = ("n", "seq_len", "seed", "token_low", "token_high")
DEFAULTS = {"task": "induction", "n": 256, "seq_len": 64, "seed": 42, "token_low": 0, "token_high": 256,
            "pattern": "induction"}
INSPECTOR = "pages/inspector.py"
ABLATION_LAB = "pages/ablation.py"
NULL_DRAWS = 200  # draws of the induction null (the noise floor), both probes
DEFAULT_MODEL = "induction-neox"  # the zoo's main model: the one a first visit opens on


@dataclass(frozen=True)
class Workspace:
    """What the sidebar selected; pages read only this."""

    model_name: str
    ref: ModelRef
    checkpoints: tuple[Checkpoint, ...]
    revision: str
    task: str
    n_examples: int
    seq_len: int
    seed: int = 42
    token_low: int = 0
    token_high: int = 256
    stamp: str = ""

    @property
    def checkpoint(self) -> Checkpoint:
        return next(c for c in self.checkpoints if c.revision == self.revision)

    @property
    def checkpoint_index(self) -> int:
        return [c.revision for c in self.checkpoints].index(self.revision)

    @property
    def spec_json(self) -> str:
        """The probe spec as canonical JSON: a hashable cache key that rebuilds the spec."""
        return json.dumps({"task": self.task, "n": self.n_examples, "seq_len": self.seq_len, "seed": self.seed,
                           "token_low": self.token_low, "token_high": self.token_high}, sort_keys=True)


def format_tokens(tokens: int) -> str:
    """Token counts as researchers read them: 12.3k, 4.1M, 2.0B."""
    if tokens < 0:
        return "unknown tokens"
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if tokens >= scale:
            return f"{tokens / scale:.3g}{unit} tokens"
    return f"{tokens} tokens"


def spec_from_json(spec_json: str):
    from core.pipelines.recipe import probe_spec

    d = json.loads(spec_json)
    if d["task"] == "induction":
        return probe_spec("induction", d["n"], d["seq_len"], d["seed"], d["token_low"], d["token_high"])
    return probe_spec(d["task"], d["n"], d["seq_len"], d["seed"])


def model_stamp(model_name: str) -> str:
    """Changes when a model is retrained or a checkpoint folder appears or vanishes (cache key part)."""
    try:
        ref = ModelRef.parse(model_name)
    except HeadLabError:
        return ""
    if ref.kind == "hub":
        return ""
    root = zoo_dir() / ref.name if ref.kind == "zoo" else Path(ref.name)
    parts = []
    manifest = root / "manifest.json"
    if manifest.is_file():
        parts.append(str(manifest.stat().st_mtime_ns))
    checkpoints = root / "checkpoints"
    if checkpoints.is_dir():
        parts.append(",".join(sorted(os.listdir(checkpoints))))
    return "|".join(parts)


# ---------------------------------------------------------------------------------------------
# cached loads


@st.cache_resource(show_spinner="Loading model...", max_entries=4)
def cached_model(model_name: str, revision: str, stamp: str = ""):
    return load_model(ModelRef.parse(model_name), revision)


@st.cache_data(show_spinner=False)
def cached_checkpoints(model_name: str, stamp: str = "") -> tuple[Checkpoint, ...]:
    return tuple(list_checkpoints(ModelRef.parse(model_name)))


@st.cache_data(show_spinner=False, max_entries=16)
def cached_batch(spec_json: str):
    from core.pipelines.recipe import build_probe

    return build_probe(spec_from_json(spec_json))


def _check_fits(ws: Workspace) -> None:
    """Refuse a probe the model cannot read before any model is loaded."""
    from core.model.loading import load_config
    from core.store import check_spec_fits_config

    check_spec_fits_config(spec_from_json(ws.spec_json), load_config(ws.ref, ws.revision))


@st.cache_data(show_spinner="Measuring every head on the probe...", max_entries=32)
def cached_stats(model_name: str, revision: str, spec_json: str, stamp: str):
    """HeadStats of one checkpoint (core's disk cache, else one instrumented pass)."""
    from core.model.loading import resolve_checkpoint
    from core.pipelines.recipe import head_stats

    ref = ModelRef.parse(model_name)
    return head_stats(ref, resolve_checkpoint(ref, revision), cached_batch(spec_json))


@st.cache_data(show_spinner=False, max_entries=32)
def cached_checkpoint_screen(model_name: str, revision: str, spec_json: str, stamp: str):
    """Step 2 at one checkpoint, with the induction null (so every checkpoint has its null floor)."""
    from core.pipelines.recipe import screen_checkpoint

    return screen_checkpoint(cached_stats(model_name, revision, spec_json, stamp), n_null_draws=NULL_DRAWS)


@st.cache_data(show_spinner="Screening every checkpoint...", max_entries=16)
def cached_report(model_name: str, spec_json: str, definition: str, k: float, stamp: str):
    from core.pipelines.recipe import screen

    k_arg = int(k) if k >= 1 else float(k)
    return screen(ModelRef.parse(model_name), spec_from_json(spec_json), k=k_arg, definition=definition,
                  n_null_draws=NULL_DRAWS)


def checkpoint_stats(ws: Workspace):
    _check_fits(ws)
    return cached_stats(ws.model_name, ws.revision, ws.spec_json, ws.stamp)


def checkpoint_screen(ws: Workspace):
    _check_fits(ws)
    return cached_checkpoint_screen(ws.model_name, ws.revision, ws.spec_json, ws.stamp)


def screen_report(ws: Workspace, definition: str = "entropy", k: float = 0.18):
    """Steps 1-2 over every checkpoint; the first time, measures missing checkpoints with a progress bar."""
    from core.pipelines.recipe import head_stats
    from core.store import entry_path, head_stats_key

    _check_fits(ws)
    marker = ("warm", ws.model_name, ws.spec_json, ws.stamp)
    warmed = st.session_state.setdefault("_warm_reports", set())
    if marker not in warmed:
        batch = cached_batch(ws.spec_json)
        spec = dict(batch.spec)
        missing = [c for c in ws.checkpoints if not entry_path(head_stats_key(ws.ref, c.revision, spec)).is_dir()]
        if missing:
            bar = st.progress(0.0, text=f"Measuring {len(missing)} checkpoints (once; then cached on disk)...")
            for i, ckpt in enumerate(missing):
                head_stats(ws.ref, ckpt, batch)
                bar.progress((i + 1) / len(missing), text=f"Measured {ckpt.revision} ({i + 1}/{len(missing)})")
            bar.empty()
        warmed.add(marker)
    return cached_report(ws.model_name, ws.spec_json, definition, float(k), ws.stamp)


@st.cache_resource(show_spinner=False)
def ablation_store() -> dict:
    """Ablation results of this server process, keyed by everything that determines them."""
    return {}


@st.cache_data(show_spinner="Running the model once on the chosen examples...", max_entries=64)
def cached_full_pattern(model_name: str, revision: str, spec_json: str, layer: int, head: int,
                        examples: tuple[int, ...], stamp: str) -> np.ndarray:
    """One head's full attention pattern on a few probe examples: [example, query, key] (one run_with_cache)."""
    import torch

    model = cached_model(model_name, revision, stamp)
    tokens = cached_batch(spec_json).tokens[list(examples)]  # [example, pos]
    name = f"blocks.{layer}.attn.hook_pattern"
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n == name)
    return cache[name][:, head].float().cpu().numpy()  # [example, query, key]


# ---------------------------------------------------------------------------------------------
# the sidebar


def _init_state() -> None:
    """Seed session_state from the URL once per session."""
    if st.session_state.get("_workspace_init"):
        return
    params = st.query_params
    for key in STATE_KEYS:
        if key in params:
            value = params[key]
            if key in INT_KEYS:
                try:
                    value = int(value)
                except ValueError:
                    continue
            st.session_state[key] = value
    for key, value in DEFAULTS.items():
        st.session_state.setdefault(key, value)
    st.session_state["_workspace_init"] = True


def sync_url() -> None:
    """Write the shareable choices into the URL."""
    for key in STATE_KEYS:
        value = st.session_state.get(key)
        if value is not None and value != "":
            if st.query_params.get(key) != str(value):
                st.query_params[key] = str(value)


def bound(widget: Callable[..., Any], label: str, key: str, options: list | None = None, **kwargs) -> Any:
    """A widget whose value lives in st.session_state[key] beyond the page that draws it.

    Streamlit forgets a widget's own state when a run does not draw it, and a widget whose default
    changes between runs becomes a new widget (losing the user's next click). So the widget gets its
    own key, seeded from the persistent value only when missing or no longer valid.
    """
    widget_key = f"_w_{key}"
    valid = widget_key in st.session_state
    if options is not None:
        kwargs["options"] = options
        if st.session_state.get(key) not in options:
            st.session_state[key] = options[0]
        valid = valid and st.session_state[widget_key] in options
    # Re-assigning through the Session State API binds the value to the key, not to the widget's
    # page-specific id, so the sidebar keeps its values when the page changes.
    st.session_state[widget_key] = st.session_state[widget_key] if valid else st.session_state[key]
    value = widget(label, key=widget_key, **kwargs)
    st.session_state[key] = value
    return value


def workspace_sidebar() -> Workspace | None:
    """Draw the sidebar and return the selection, or None (with a message) when there is none."""
    _init_state()
    with st.sidebar:
        st.header("Workspace")
        try:
            zoo = list_zoo()
        except HeadLabError as exc:
            st.error(str(exc))
            return None
        current = st.session_state.get("model")
        options = zoo + ([current] if current and current not in zoo else [])
        if not options:
            st.text_input("Local Hugging Face folder", key="model_folder")
            model_name = st.session_state.get("model_folder")
            if model_name:
                st.session_state["model"] = model_name
        else:
            if not current:
                st.session_state["model"] = DEFAULT_MODEL if DEFAULT_MODEL in options else options[0]
            model_name = bound(st.selectbox, "Model (zoo name or local Hugging Face folder)", "model", options,
                               accept_new_options=True,
                               help="Pick a zoo model, or type the path of a local Hugging Face folder.")
        if not model_name:
            st.info("No model yet: train the quick zoo on the Models & training page or give a local folder.")
            return None
        try:
            ref = ModelRef.parse(model_name)
            stamp = model_stamp(model_name)
            checkpoints = cached_checkpoints(model_name, stamp)
        except HeadLabError as exc:
            st.error(str(exc))
            sync_url()
            return None
        revisions = [c.revision for c in checkpoints]
        if st.session_state.get("revision") not in revisions:
            st.session_state["revision"] = revisions[-1]
        if len(revisions) > 1:
            tokens_of = {c.revision: c.tokens for c in checkpoints}
            revision = bound(st.select_slider, "Checkpoint (training tokens)", "revision", revisions,
                             format_func=lambda r: format_tokens(tokens_of[r]))
        else:
            revision = revisions[0]
        st.session_state["revision"] = revision
        st.caption(f"revision `{revision}` · {len(revisions)} checkpoints")
        task = bound(st.radio, "Probe task", "task", ["induction", "text"], horizontal=True)
        col_n, col_t = st.columns(2)
        with col_n:
            bound(st.number_input, "N examples", "n", min_value=8, max_value=4096, step=8)
        with col_t:
            bound(st.number_input, "Length T", "seq_len", min_value=8, max_value=4096, step=8)
        with st.expander("Probe details"):
            bound(st.number_input, "Probe seed", "seed", min_value=0, max_value=2**31 - 1)
            if task == "induction":
                c1, c2 = st.columns(2)
                with c1:
                    bound(st.number_input, "Tokens from", "token_low", min_value=0, max_value=10**6)
                with c2:
                    bound(st.number_input, "Tokens below", "token_high", min_value=1, max_value=10**6)
    sync_url()
    return Workspace(model_name, ref, tuple(checkpoints), revision, task, int(st.session_state["n"]),
                     int(st.session_state["seq_len"]), int(st.session_state["seed"]), int(st.session_state["token_low"]),
                     int(st.session_state["token_high"]), stamp)


def require_workspace() -> Workspace:
    """The workspace, or stop the page (the sidebar already said why)."""
    ws = workspace_sidebar()
    if ws is None:
        st.stop()
    return ws


def guarded(fn: Callable[[], Any], stop: bool = True) -> Any:
    """Run a data load; a user-fixable problem is shown with st.error (and the page stops drawing)."""
    try:
        return fn()
    except HeadLabError as exc:
        st.error(str(exc))
        if stop:
            st.stop()
        return None


# ---------------------------------------------------------------------------------------------
# figures, exports, clicking heads


def export_buttons(bundle: FigureBundle, key: str) -> None:
    """Download buttons for one figure: paper-theme PNG (high resolution), SVG, PDF, and its data as CSV/JSON."""
    with st.popover(":material/download:", help="Export this figure for a paper, or its data"):
        st.caption("Paper theme (white, serif, print size); data with provenance.")
        for fmt, mime in (("png", "image/png"), ("svg", "image/svg+xml"), ("pdf", "application/pdf")):
            st.download_button(f"{fmt.upper()}", data=lambda b=bundle, f=fmt: b.image_bytes(f),
                               file_name=f"{bundle.name}.{fmt}", mime=mime, key=f"{key}-dl-{fmt}", on_click="ignore")
        st.download_button("CSV (data)", data=bundle.csv_bytes(), file_name=f"{bundle.name}.csv", mime="text/csv",
                           key=f"{key}-dl-csv", on_click="ignore")
        st.download_button("JSON (data + provenance)", data=bundle.json_bytes(), file_name=f"{bundle.name}.json",
                           mime="application/json", key=f"{key}-dl-json", on_click="ignore")


def show_figure(bundle: FigureBundle, key: str, pickable: bool = False, stretch: bool = True) -> list[Head]:
    """Draw a figure with its caption and export buttons; returns the heads the user picked on it."""
    kwargs: dict[str, Any] = {}
    if pickable:
        kwargs = {"on_select": "rerun", "selection_mode": ("points", "box", "lasso")}
    event = st.plotly_chart(bundle.figure, key=key, theme=None, width="stretch" if stretch else "content",
                            config={"displaylogo": False}, **kwargs)
    caption, export = st.columns([5, 1])
    if bundle.caption:
        caption.caption(bundle.caption)
    with export:
        export_buttons(bundle, key)
    if not pickable or event is None:
        return []
    try:
        return heads_from_points(event.get("selection", {}).get("points", []))
    except (HeadLabError, AttributeError):
        return []


def offer_inspect(picked: list[Head], key: str) -> None:
    """After a click on a grid: remember the head and offer the head inspector."""
    if not picked:
        return
    head = picked[0]
    st.session_state["head"] = head_name(head)
    sync_url()
    label = f"Inspect {head_name(head)} in the head inspector" + (f" ({len(picked)} picked; first shown)" if len(picked) > 1 else "")
    st.page_link(INSPECTOR, label=label, icon=":material/search:")


def send_to_ablation_lab(heads) -> None:
    """Open the ablation lab with `heads` in its head box (any page can hand a head set over)."""
    text = ", ".join(head_name(h) for h in heads)
    st.session_state["heads_text"] = text  # the lab's text box
    st.session_state["ablation_heads"] = text  # its copy that survives other pages
    st.switch_page(ABLATION_LAB)


def current_head(n_layers: int, n_heads: int, fallback: Head = (0, 0)) -> Head:
    """The head chosen anywhere in the app (session/URL), valid for this model; else `fallback`."""
    text = st.session_state.get("head")
    if text:
        try:
            heads = parse_heads(str(text), n_layers, n_heads).heads
            if heads:
                return heads[0]
        except HeadLabError:
            pass
    return fallback
