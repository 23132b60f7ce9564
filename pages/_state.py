"""What the user chose, where it lives, and how pages hand work to each other.

Choices live in `st.session_state` (they persist across pages) and the shareable ones in
`st.query_params` (a link reopens the same view). Every key that more than one page (or app.py)
reads is a named constant here. app.py draws the workspace sidebar once per run and publishes the
selection as a `Workspace` under WORKSPACE; pages read it with `require_workspace()`.

Hand-offs ("send to the ablation lab", "open in the head inspector") are button callbacks: they set
the target page's state and ask for the page; app.py follows the request before the sidebar is
drawn (`follow_hand_off`), because a callback cannot switch pages itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import streamlit as st
from streamlit.runtime.pages_manager import PagesManager

from core.errors import HeadLabError
from core.heads import Head, HeadSet, head_name, parse_heads
from core.model.loading import DEFAULT_DTYPE, DTYPES
from core.model.refs import Checkpoint, ModelRef
from core.tasks.probe_batch import PATTERNS
from core.tasks.probe_file import ProbeFile
from core.tasks.specs import TASKS, ProbeSpec

# ---------------------------------------------------------------------------------------------
# keys: the workspace (session and URL)

MODEL = "model"
REVISION = "revision"
TASK = "task"
N_EXAMPLES = "n"
SEQ_LEN = "seq_len"
SEED = "seed"
TOKEN_LOW = "token_low"
TOKEN_HIGH = "token_high"
HEAD = "head"  # the head chosen anywhere ("L1H3"): the inspector shows it
PATTERN = "pattern"  # the pattern screen's pattern
DTYPE = "dtype"  # the precision models are loaded in (core.model.loading.DTYPES)
URL_KEYS = (MODEL, REVISION, TASK, N_EXAMPLES, SEQ_LEN, SEED, TOKEN_LOW, TOKEN_HIGH, HEAD, PATTERN, DTYPE)
# what a URL may set: whole numbers in the sidebar's ranges (its widgets use these), names from their lists
INT_RANGES = {N_EXAMPLES: (8, 4096), SEQ_LEN: (8, 4096), SEED: (0, 2**31 - 1), TOKEN_LOW: (0, 10**6),
              TOKEN_HIGH: (1, 10**6)}
URL_CHOICES = {TASK: TASKS, DTYPE: tuple(DTYPES), PATTERN: PATTERNS}
PR_DEFINITION = "pr_definition"  # spectral signal and training dynamics
# where long runs go (core.executor.BACKENDS); not in the URL: a shared link must not start Ray on its reader's server
BACKEND = "backend"
DEFAULTS = {TASK: "induction", N_EXAMPLES: 256, SEQ_LEN: 64, SEED: 42, TOKEN_LOW: 0, TOKEN_HIGH: 256,
            PATTERN: "induction", PR_DEFINITION: "entropy", DTYPE: DEFAULT_DTYPE, BACKEND: "serial"}
DEFAULT_MODEL = "induction-neox"  # the zoo's main model: the one a first visit opens on
MODEL_FOLDER = "model_folder"  # the sidebar's text box when the zoo is empty

# keys: shared by several pages
HEADS_TEXT = "heads_text"  # the ablation lab's head box (its widget key)
ABLATION_HEADS = "ablation_heads"  # its copy that survives visits to other pages
HEADS_MODEL = "ablation_heads_model"  # the model those heads were picked on (another model's page clears them)
HEADS_URL = "heads"  # the ablation lab's heads in a shared link (checked against the model on that page)
ABLATION_HISTORY = "ablation_history"  # this session's ablation runs, latest first (the inspector reads it)
PROBE_FILE = "probe_file"  # the probe file last uploaded on the Patching page (a ProbeFile): the lab can ablate on it
LAB_PROBE = "lab_probe"  # the ablation lab's probe: LAB_ON_WORKSPACE or LAB_ON_FILE
LAB_ON_WORKSPACE, LAB_ON_FILE = "workspace", "file"

# keys: internal
WORKSPACE = "_workspace"  # the Workspace app.py's sidebar selected this run (None: none)
_INITIALISED = "_workspace_init"
_URL_NOTES = "_url_notes"  # what init_state ignored in the link, shown in the sidebar for the session
_FROM_URL = "_from_url"  # the values init_state took from the link and nothing has checked against the model yet
_GOTO = "_goto_page"  # a page a hand-off asked for
HAND_OFF_NOTE = "_hand_off_note"  # what a hand-off changed in the workspace, said once on the page it opened

# pages a hand-off opens
INSPECTOR = "pages/inspector.py"
ABLATION_LAB = "pages/ablation.py"


def widget_key(key: str) -> str:
    """The widget key of a persistent choice (see `bound`)."""
    return f"_w_{key}"


@dataclass(frozen=True)
class Workspace:
    """What the sidebar selected; pages read only this."""

    model_name: str
    ref: ModelRef
    checkpoints: tuple[Checkpoint, ...]
    revision: str
    spec: ProbeSpec
    stamp: str = ""  # changes when the model's files change (part of every cache key)
    dtype: str = DEFAULT_DTYPE  # the precision models run in (part of every cache key that loads a model)
    backend: str = "serial"  # where the ablation lab runs its conditions: this process, or Ray workers

    @property
    def checkpoint(self) -> Checkpoint:
        return next(c for c in self.checkpoints if c.revision == self.revision)

    @property
    def checkpoint_index(self) -> int:
        return [c.revision for c in self.checkpoints].index(self.revision)

    @property
    def task(self) -> str:
        return self.spec.task

    @property
    def spec_json(self) -> str:
        """The probe spec as canonical JSON: a hashable cache key that core.tasks.specs.spec_from_json rebuilds."""
        return json.dumps(self.spec.to_json(), sort_keys=True)


# ---------------------------------------------------------------------------------------------
# session <-> URL


def init_state() -> None:
    """Seed session_state from the URL once per session; a value the sidebar cannot take is ignored, and
    a warning at the top of the sidebar says which and what is used instead (never silently clamped)."""
    if not st.session_state.get(_INITIALISED):
        params = st.query_params
        notes = []
        for key in URL_KEYS:
            if key in params:
                value, problem = url_value(key, params[key])
                if problem:
                    used = f"the default {DEFAULTS[key]}" if key in DEFAULTS else "the default"
                    notes.append(f"{problem}, so {used} is used")
                else:
                    st.session_state[key] = value
                    st.session_state.setdefault(_FROM_URL, {})[key] = value
        for key, value in DEFAULTS.items():
            st.session_state.setdefault(key, value)
        st.session_state[_URL_NOTES] = notes
        st.session_state[_INITIALISED] = True
    notes = st.session_state.get(_URL_NOTES)
    if notes:
        st.sidebar.warning("This link's settings were not all usable: " + "; ".join(notes) + ".")


def url_fallback(key: str, value: Any, problem: str, used: str) -> None:
    """A value the link set that this model cannot take (a checkpoint it lacks, a head outside it): say so
    once, where the caller draws, and in the sidebar for the rest of the session. Silent when the value
    did not come from the link (e.g. the revision of the model chosen before)."""
    from_url = st.session_state.get(_FROM_URL, {})
    if key not in from_url or from_url.pop(key) != value:  # None is no link value: a first visit has no revision
        return
    note = f"{key}={value!r} {problem}, so {used} is used"
    st.session_state.setdefault(_URL_NOTES, []).append(note)
    st.warning(f"This link's {note}.")


def url_value(key: str, text: str) -> tuple[Any, str | None]:
    """(value, None) for a URL parameter the sidebar can take, else (None, what is wrong with it)."""
    if key in INT_RANGES:
        low, high = INT_RANGES[key]
        try:
            value = int(text)
        except ValueError:
            return None, f"{key}={text!r} is not a whole number"
        if not low <= value <= high:
            return None, f"{key}={value} is outside {low}..{high}"
        return value, None
    if key in URL_CHOICES and text not in URL_CHOICES[key]:
        return None, f"{key}={text!r} is not one of {', '.join(URL_CHOICES[key])}"
    return text, None


def int_limits(key: str) -> dict[str, int]:
    """min_value / max_value of a whole-number widget: the range the URL is checked against too."""
    low, high = INT_RANGES[key]
    return {"min_value": low, "max_value": high}


def sync_url() -> None:
    """Write the shareable choices into the URL."""
    for key in URL_KEYS:
        value = st.session_state.get(key)
        if value is not None and value != "":
            if st.query_params.get(key) != str(value):
                st.query_params[key] = str(value)


def bound(widget: Callable[..., Any], label: str, key: str, options: list | None = None, **kwargs) -> Any:
    """A widget whose value lives in st.session_state[key] beyond the page that draws it.

    Streamlit forgets a widget's own state when a run does not draw it (a page widget on another
    page), and a widget whose default changes between runs becomes a new widget (losing the user's
    next click). So the widget gets its own key, seeded from the persistent value only when missing
    or no longer valid; the persistent value is also what the URL and hand-offs set.
    """
    own = widget_key(key)
    valid = own in st.session_state
    if options is not None:
        kwargs["options"] = options
        if st.session_state.get(key) not in options:
            st.session_state[key] = options[0]
        valid = valid and st.session_state[own] in options
    st.session_state[own] = st.session_state[own] if valid else st.session_state[key]
    value = widget(label, key=own, **kwargs)
    st.session_state[key] = value
    return value


def set_choice(key: str, value: Any) -> None:
    """Set a persistent choice and its widget (in a button callback, before the widget is drawn)."""
    st.session_state[key] = value
    st.session_state[widget_key(key)] = value


# ---------------------------------------------------------------------------------------------
# the workspace


def publish_workspace(ws: Workspace | None) -> None:
    """app.py: the sidebar's selection for this run's page."""
    st.session_state[WORKSPACE] = ws


def current_workspace() -> Workspace | None:
    """The sidebar's selection, or None when there is none (the sidebar says why).

    Streamlit runs a page without app.py when it takes our pages/ folder for a legacy multipage app:
    on the first request after the server starts if it is a deep link, and in every AppTest run
    after switch_page. Such a run has no sidebar (and would read the last run's workspace), so it
    switches Streamlit to st.navigation and reruns: app.py then draws the sidebar before the page.
    """
    if PagesManager.uses_pages_directory:
        PagesManager.uses_pages_directory = False
        st.rerun()
    return st.session_state.get(WORKSPACE)


def require_workspace() -> Workspace:
    """The workspace, or stop the page (the sidebar already said why)."""
    ws = current_workspace()
    if ws is None:
        st.stop()
    return ws


def current_head(n_layers: int, n_heads: int, fallback: Head = (0, 0)) -> Head:
    """The head chosen anywhere in the app (session/URL), valid for this model; else `fallback`."""
    text = st.session_state.get(HEAD)
    if text:
        try:
            heads = parse_heads(str(text), n_layers, n_heads).heads
            if heads:
                return heads[0]
        except HeadLabError as exc:
            url_fallback(HEAD, text, f"names no head of this model ({str(exc).rstrip('.')})", head_name(fallback))
    return fallback


def ablation_history() -> list[dict]:
    """This session's ablation runs, latest first: {"result", "seconds", "model", "revision", "probe", "label"}."""
    return st.session_state.setdefault(ABLATION_HISTORY, [])


# ---------------------------------------------------------------------------------------------
# hand-offs between pages


def offer_inspect(picked: list[Head]) -> None:
    """After a click on a grid: remember the head and offer the head inspector."""
    if not picked:
        return
    head = picked[0]
    st.session_state[HEAD] = head_name(head)
    sync_url()
    label = f"Inspect {head_name(head)} in the head inspector" + (f" ({len(picked)} picked; first shown)" if len(picked) > 1 else "")
    st.page_link(INSPECTOR, label=label, icon=":material/search:")


def _readable(spec: ProbeSpec, vocab_size: int) -> bool:
    """Core's rule: can a model with `vocab_size` tokens read this probe."""
    try:
        spec.check_vocab(vocab_size)
    except HeadLabError:
        return False
    return True


def remember_probe_file(probe_file: ProbeFile) -> None:
    """Keep the probe file just read (the ablation lab offers its prompts)."""
    st.session_state[PROBE_FILE] = probe_file


def uploaded_probe_file() -> ProbeFile | None:
    """The probe file last uploaded this session, or None."""
    return st.session_state.get(PROBE_FILE)


def send_to_ablation_lab(heads: Iterable[Head], vocab_size: int | None = None,
                         token_range: tuple[int, int] | None = None, probe_file: ProbeFile | None = None) -> None:
    """Button callback: open the ablation lab with `heads` in its head box.

    vocab_size, token_range: for a model with a small vocabulary, when the workspace probe is not an
    induction probe the model can read, switch it to the induction probe over token_range [low, high).
    probe_file: the heads came from these prompts; the lab ablates on them (else on the workspace probe).
    """
    text = str(HeadSet(tuple(heads)))
    st.session_state[LAB_PROBE] = LAB_ON_WORKSPACE if probe_file is None else LAB_ON_FILE
    if probe_file is not None:
        remember_probe_file(probe_file)
    st.session_state[HEADS_TEXT] = text
    st.session_state[ABLATION_HEADS] = text
    ws = st.session_state.get(WORKSPACE)
    if ws is not None:
        st.session_state[HEADS_MODEL] = ws.model_name
    if vocab_size is not None:
        if ws is None or ws.task != "induction" or not _readable(ws.spec, vocab_size):
            low, high = token_range
            for key, value in ((TASK, "induction"), (TOKEN_LOW, low), (TOKEN_HIGH, high)):
                set_choice(key, value)
            st.session_state[HAND_OFF_NOTE] = (
                f"The probe was switched to induction over tokens {low}..{high - 1} so that this model can read it; "
                "the verdict measures the heads on that task, which may not be the one the model was trained on.")
    st.session_state[_GOTO] = ABLATION_LAB


def open_in_inspector(head: str) -> None:
    """Button callback: open the head inspector on `head` ("L1H3")."""
    st.session_state[HEAD] = head
    st.session_state[_GOTO] = INSPECTOR


def follow_hand_off() -> None:
    """app.py, after st.navigation: open the page a hand-off asked for."""
    page = st.session_state.pop(_GOTO, None)
    if page is not None:
        st.switch_page(page)
