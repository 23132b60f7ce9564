"""The workspace sidebar shared by every page: model, checkpoint, probe task and size.

Choices live in `st.session_state` (so they persist across pages) and in `st.query_params`
(so a link reopens the same view). Models and checkpoint listings are cached here.
"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from core.errors import HeadLabError
from core.models import Checkpoint, ModelRef, list_checkpoints, list_zoo, load_model

STATE_KEYS = ("model", "revision", "task", "n", "seq_len")
DEFAULTS = {"task": "induction", "n": 256, "seq_len": 64}


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

    @property
    def checkpoint(self) -> Checkpoint:
        return next(c for c in self.checkpoints if c.revision == self.revision)


def format_tokens(tokens: int) -> str:
    """Token counts as researchers read them: 12.3k, 4.1M, 2.0B."""
    if tokens < 0:
        return "unknown tokens"
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if tokens >= scale:
            return f"{tokens / scale:.3g}{unit} tokens"
    return f"{tokens} tokens"


@st.cache_resource(show_spinner="Loading model...")
def cached_model(model_name: str, revision: str):
    return load_model(ModelRef.parse(model_name), revision)


@st.cache_data(show_spinner=False)
def cached_checkpoints(model_name: str) -> tuple[Checkpoint, ...]:
    return tuple(list_checkpoints(ModelRef.parse(model_name)))


def _init_state() -> None:
    """Seed session_state from the URL once per session."""
    if st.session_state.get("_workspace_init"):
        return
    params = st.query_params
    for key in STATE_KEYS:
        if key in params:
            value = params[key]
            st.session_state[key] = int(value) if key in ("n", "seq_len") and value.isdigit() else value
    for key, value in DEFAULTS.items():
        st.session_state.setdefault(key, value)
    st.session_state["_workspace_init"] = True


def _sync_url() -> None:
    for key in STATE_KEYS:
        if key in st.session_state and st.session_state[key] is not None:
            st.query_params[key] = str(st.session_state[key])


def workspace_sidebar() -> Workspace | None:
    """Draw the sidebar and return the selection, or None (with a message) when there is none."""
    _init_state()
    with st.sidebar:
        st.header("Workspace")
        zoo = list_zoo()
        if st.session_state.get("model") and st.session_state["model"] not in zoo:
            zoo = [*zoo, st.session_state["model"]]
        model_name = st.selectbox(
            "Model (zoo name or local Hugging Face folder)",
            options=zoo,
            index=zoo.index(st.session_state["model"]) if st.session_state.get("model") in zoo else 0,
            accept_new_options=True,
            key="model_select",
        ) if zoo else st.text_input("Local Hugging Face folder", key="model_select")
        if not model_name:
            st.info("No model yet: train the quick zoo with `make zoo` or give a local folder.")
            return None
        try:
            ref = ModelRef.parse(model_name)
            checkpoints = cached_checkpoints(model_name)
        except HeadLabError as exc:
            st.error(str(exc))
            return None
        st.session_state["model"] = model_name
        revisions = [c.revision for c in checkpoints]
        if st.session_state.get("revision") not in revisions:
            st.session_state["revision"] = revisions[-1]
        revision = st.select_slider(
            "Checkpoint",
            options=revisions,
            value=st.session_state["revision"],
            format_func=lambda r: format_tokens(next(c.tokens for c in checkpoints if c.revision == r)),
        )
        st.session_state["revision"] = revision
        st.caption(f"revision `{revision}`")
        task = st.radio("Probe task", ["induction", "text"], horizontal=True,
                        index=["induction", "text"].index(st.session_state.get("task", "induction")))
        st.session_state["task"] = task
        col_n, col_t = st.columns(2)
        st.session_state["n"] = col_n.number_input("N examples", 16, 4096, int(st.session_state["n"]), step=16)
        st.session_state["seq_len"] = col_t.number_input("Length T", 16, 4096, int(st.session_state["seq_len"]), step=8)
    _sync_url()
    return Workspace(model_name, ref, checkpoints, revision, task,
                     int(st.session_state["n"]), int(st.session_state["seq_len"]))
