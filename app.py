"""HeadLab: find attention-head circuits across training and test them causally.

Run with `make app` (http://127.0.0.1:8501). This entry script runs on every page: it sets up the
navigation, follows a pending hand-off between pages, draws the workspace sidebar once (model,
checkpoint, probe; kept in the session and the URL, see pages/_state.py) and then runs the page,
which reads the workspace, asks core (through pages/_cache.py) and draws.
"""

import huggingface_hub.constants as hub_constants
import streamlit as st

from core.errors import HeadLabError
from core.executor import BACKENDS
from core.model.loading import DTYPES
from core.model.refs import ModelRef, list_zoo
from core.tasks.specs import TASKS, probe_spec, spec_from_json
from core.threads import apply_thread_policy
from pages._cache import cached_checkpoints, cached_hub_revisions, cached_tokenizer_spec, model_stamp
from pages._state import (BACKEND, DEFAULT_MODEL, DTYPE, MODEL, MODEL_FOLDER, N_EXAMPLES, REVISION, SEED, SEQ_LEN,
                          TASK, TOKEN_HIGH, TOKEN_LOW, Workspace, bound, follow_hand_off, init_state,
                          int_limits, publish_workspace, sync_url, url_fallback, widget_key)
from pages._widgets import format_tokens

PAGES = [
    st.Page("pages/zoo.py", title="Models & training", icon=":material/model_training:", default=True),
    st.Page("pages/spectral.py", title="Spectral signal", icon=":material/show_chart:", url_path="spectral"),
    st.Page("pages/screen.py", title="Pattern screen", icon=":material/grid_on:", url_path="screen"),
    st.Page("pages/ablation.py", title="Ablation lab", icon=":material/science:", url_path="ablation"),
    st.Page("pages/inspector.py", title="Head inspector", icon=":material/search:", url_path="inspector"),
    st.Page("pages/coactivation.py", title="Co-activation", icon=":material/hub:", url_path="coactivation"),
    st.Page("pages/proposers.py", title="Proposers vs disposer", icon=":material/gavel:", url_path="proposers"),
    st.Page("pages/attribution.py", title="Gradient vs causal", icon=":material/compare_arrows:", url_path="attribution"),
    st.Page("pages/patching.py", title="Patching", icon=":material/swap_horiz:", url_path="patching"),
    st.Page("pages/graph.py", title="Circuit graph", icon=":material/account_tree:", url_path="graph"),
    st.Page("pages/dynamics.py", title="Training dynamics", icon=":material/timeline:", url_path="dynamics"),
    st.Page("pages/benchmark.py", title="Benchmark", icon=":material/leaderboard:", url_path="benchmark"),
    st.Page("pages/real_models.py", title="Real models", icon=":material/public:", url_path="real-models"),
]


def _choose_model() -> str | None:
    """The model picker: a zoo model or a local folder typed in (a text box when the zoo is empty)."""
    zoo = list_zoo()
    current = st.session_state.get(MODEL)
    typed = st.session_state.get(widget_key(MODEL))  # a folder or hub name typed into the box ("Add: ...")
    options = zoo + [name for name in dict.fromkeys((current, typed)) if name and name not in zoo]
    if not options:
        st.text_input("Local Hugging Face folder", key=MODEL_FOLDER)
        model_name = st.session_state.get(MODEL_FOLDER)
        if model_name:
            st.session_state[MODEL] = model_name
        return model_name
    if not current:
        st.session_state[MODEL] = DEFAULT_MODEL if DEFAULT_MODEL in options else options[0]
    return bound(st.selectbox, "Model (zoo name, local folder or hub name)", MODEL, options, accept_new_options=True,
                 help="Pick a zoo model, or type the path of a local Hugging Face folder or a hub name such as "
                      "EleutherAI/pythia-160m (offline, with HF_HUB_OFFLINE=1, its checkpoints are the revisions in "
                      "the local Hugging Face cache).")


def _hub_caption(model_name: str) -> None:
    """Where a hub model's checkpoints come from, and what the local Hugging Face cache holds."""
    cached = list(cached_hub_revisions(model_name))
    shown = ", ".join(cached if len(cached) <= 6 else cached[:3] + ["..."] + cached[-3:])
    source = "the local Hugging Face cache (offline)" if hub_constants.is_offline_mode() else "the hub's branches"
    st.caption(f"hub model · checkpoints from {source} · the cache (`{hub_constants.HF_HUB_CACHE}`) holds "
               f"{len(cached)} revisions: {shown or 'none'}")


def _choose_probe(model_name: str, revision: str, stamp: str):
    """The probe widgets; returns the probe spec they describe (HeadLabError when it is invalid). ioi, and induction
    at the default token range, are built from the model's own tokenizer (its ordinary tokens; bytes on zoo models)."""
    task = bound(st.radio, "Probe task", TASK, list(TASKS), horizontal=True)
    col_n, col_t = st.columns(2)
    with col_n:
        n = bound(st.number_input, "N examples", N_EXAMPLES, step=8, **int_limits(N_EXAMPLES))
    with col_t:
        seq_len = bound(st.number_input, "Length T", SEQ_LEN, step=8, **int_limits(SEQ_LEN))
    with st.expander("Probe details"):
        seed = bound(st.number_input, "Probe seed", SEED, **int_limits(SEED))
        if task in ("induction", "induction-repeat"):
            st.caption("0 and 256 (the default): the model's ordinary tokens, bytes on zoo models")
            c1, c2 = st.columns(2)
            with c1:
                bound(st.number_input, "Tokens from", TOKEN_LOW, **int_limits(TOKEN_LOW))
            with c2:
                bound(st.number_input, "Tokens below", TOKEN_HIGH, **int_limits(TOKEN_HIGH))
    low, high = int(st.session_state[TOKEN_LOW]), int(st.session_state[TOKEN_HIGH])
    if task == "ioi" or (task in ("induction", "induction-repeat") and (low, high) == (0, 256)):
        return spec_from_json(cached_tokenizer_spec(model_name, revision, stamp, task, int(n), int(seq_len), int(seed)))
    return probe_spec(task, int(n), int(seq_len), int(seed), low, high)


def apply_threads_once() -> None:
    """Once per browser session: torch's thread count for the CPU load now (core/threads.py; a 0.1 s sample)."""
    if "torch_threads" in st.session_state:
        return
    try:
        st.session_state["torch_threads"] = apply_thread_policy().threads
    except HeadLabError as exc:  # a malformed HEADLAB_THREADS: say what to set, keep the app usable
        st.error(str(exc))


def workspace_sidebar() -> Workspace | None:
    """Draw the sidebar and return the selection, or None (with a message) when there is none."""
    init_state()
    with st.sidebar:
        st.header("Workspace")
        try:
            model_name = _choose_model()
        except HeadLabError as exc:
            st.error(str(exc))
            return None
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
        if st.session_state.get(REVISION) not in revisions:
            url_fallback(REVISION, st.session_state.get(REVISION), f"is not a checkpoint of {model_name}",
                         f"its last checkpoint, {revisions[-1]},")
            st.session_state[REVISION] = revisions[-1]
        if len(revisions) > 1:
            tokens_of = {c.revision: c.tokens for c in checkpoints}
            revision = bound(st.select_slider, "Checkpoint (training tokens)", REVISION, revisions,
                             format_func=lambda r: format_tokens(tokens_of[r]))
        else:
            revision = revisions[0]
        st.session_state[REVISION] = revision
        st.caption(f"revision `{revision}` · {len(revisions)} checkpoints")
        if ref.kind == "hub":
            _hub_caption(model_name)
        try:
            spec = _choose_probe(model_name, revision, stamp)
        except HeadLabError as exc:
            st.error(str(exc))
            sync_url()
            return None
        dtype = bound(st.selectbox, "Precision", DTYPE, list(DTYPES),
                      help="The dtype models run in. float32 is exact and the default; bfloat16 and float16 halve "
                           "the memory (the reference probe ran in float16 on GPUs). Statistics are accumulated in "
                           "float32 either way, and each dtype has its own cached results.")
        backend = bound(st.selectbox, "Backend", BACKEND, list(BACKENDS),
                        help="Where the ablation lab runs its conditions. serial: here, one after another. ray: "
                             "spread over Ray workers, one per core of a local Ray instance (started on first use, "
                             "then kept warm between runs, each holding the checkpoint it ran last).")
    sync_url()
    return Workspace(model_name, ref, tuple(checkpoints), revision, spec, stamp, dtype, backend)


st.set_page_config(page_title="HeadLab", page_icon=":material/hub:", layout="wide")
navigation = st.navigation(PAGES)
follow_hand_off()
apply_threads_once()
publish_workspace(workspace_sidebar())
navigation.run()
