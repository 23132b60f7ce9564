"""Drawing helpers every page shares: figures with their export buttons, head picks, errors as st.error.

They draw and read widgets; they compute nothing (figures come from core.figures, data from pages/_cache.py).
"""

from __future__ import annotations

from typing import Any, Callable

import streamlit as st

from core.errors import HeadLabError
from core.figures._style import heads_from_points, short_tokens
from core.figures.bundle import FigureBundle
from core.heads import Head
from core.tasks.ioi import CORRUPTIONS
from core.tasks.specs import PAIR_TASKS, built_in_counterfactual

IMAGE_MIME = (("png", "image/png"), ("svg", "image/svg+xml"), ("pdf", "application/pdf"))


def guarded(fn: Callable[[], Any], stop: bool = True) -> Any:
    """Run a data load; a user-fixable problem is shown with st.error (and the page stops drawing)."""
    try:
        return fn()
    except HeadLabError as exc:
        st.error(str(exc))
        if stop:
            st.stop()
        return None


def format_tokens(tokens: int) -> str:
    """Token counts as researchers read them: 12.3k, 4.1M, 2.0B."""
    return "unknown tokens" if tokens < 0 else f"{short_tokens(tokens)} tokens"


def export_buttons(bundle: FigureBundle, key: str) -> None:
    """Download buttons for one figure: paper-theme PNG (high resolution), SVG, PDF, and its data as CSV/JSON."""
    with st.popover(":material/download:", help="Export this figure for a paper, or its data"):
        st.caption("Paper theme (white, serif, print size); data with provenance.")
        for fmt, mime in IMAGE_MIME:
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


def chart_pick(chart_key: str) -> tuple[list[Head], bool]:
    """The heads picked on the pickable chart `chart_key` (read before it is redrawn), and whether by a box or lasso.

    A page that adds picks up draws a fresh chart (a new key) after each one, so that every click is an
    event of its own: Streamlit reports the chart's whole selection, and not whether shift was held.
    """
    state = st.session_state.get(chart_key)
    selection = state.get("selection", {}) if state else {}
    try:
        heads = heads_from_points(selection.get("points", []))
    except HeadLabError:
        return [], False
    return heads, bool(selection.get("box") or selection.get("lasso"))


def new_pick(chart_key: str) -> list[Head]:
    """Heads newly picked on the pickable chart `chart_key` since the last run, read before it is redrawn.

    A page that fills a widget from the pick reads it here, before that widget is drawn; an unchanged
    selection returns [] so it does not overwrite what the user typed since.
    """
    state = st.session_state.get(chart_key)
    try:
        picked = heads_from_points(state["selection"]["points"] if state else [])
    except (KeyError, TypeError, HeadLabError):
        picked = []
    last_key = f"_last_pick_{chart_key}"
    new = picked if picked and picked != st.session_state.get(last_key) else []
    st.session_state[last_key] = picked or None
    return new


def built_in_source(task: str) -> str:
    """The pair source's label for the sidebar's task: its own built-in counterfactual (induction or IOI)."""
    return {"induction": "built-in induction counterfactual", "ioi": "built-in IOI counterfactual"}.get(
        task, "built-in counterfactual")


def pair_source(ws, options: list[str], key: str) -> str:
    """The radio of pair sources (options in order); a choice another task's label left in the session is dropped."""
    if st.session_state.get(key) not in options:
        st.session_state.pop(key, None)
    return st.radio("Pairs", options, horizontal=True, key=key)


def built_in_pairs(ws, prefix: str):
    """The sidebar probe's own clean/corrupted pairs (core.tasks.specs.built_in_counterfactual): the induction
    sequences with their earlier A replaced, or the IOI prompts with their ABC or swapped-subject twins; a task
    without pairs is said, and the page stops."""
    if ws.task not in PAIR_TASKS:
        st.info(f"The {ws.task} task has no built-in counterfactual: choose the induction or ioi task in the sidebar, "
                "or upload a probe file.")
        st.stop()
    c1, c2 = st.columns(2)
    corruption = "abc"
    if ws.task == "ioi":
        corruption = c2.radio("Corruption", CORRUPTIONS, horizontal=True, key=f"{prefix}_corruption",
                              format_func={"abc": "ABC (three other names)", "swap": "swapped subject"}.get,
                              help="abc: IO, S1 and S2 replaced by three other names, so no name is the answer; "
                                   "swap: the subject's second mention replaced by IO, so the answer flips to S.")
    seed = int(c1.number_input("Corruption seed", 0, 2**31 - 1, 0, key=f"{prefix}_corrupt_seed",
                               help="Seeds the token that replaces each example's earlier A (induction), or the ABC "
                                    "names (ioi)."))
    pairs = guarded(lambda: built_in_counterfactual(ws.spec, seed, corruption))
    if ws.task == "ioi":
        what = ("IO, S1 and S2 replaced by three other names, so nothing says which name is the answer"
                if corruption == "abc" else "S2 replaced by IO, so the answer flips to S")
        st.caption(f"{ws.spec.n_examples} IOI prompts (the model's one-token names, {len(ws.spec.templates)} "
                   f"templates, padded on the right); metric logit[IO] - logit[S] at the last token; corrupted: {what}.")
    else:
        st.caption(f"{ws.spec.n_examples} induction sequences of {ws.spec.seq_len} tokens; corrupted: the earlier A "
                   "replaced, so the query has nothing to copy while the target B and every position stay.")
    return pairs
