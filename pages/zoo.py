"""Models & training: the zoo, each model's checkpoints and its training curves.

First launch with no zoo offers to train the quick zoo here, with visible progress.
"""

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from core.errors import HeadLabError
from core.model.gguf import QUANTIZED_NOTE, source_text
from core.model.refs import list_zoo, read_manifest
from core.zoo.presets import ZOO_PRESETS, train_zoo
from pages._cache import forget_data
from pages._state import current_workspace
from pages._widgets import format_tokens

st.title("Models & training")
st.markdown(
    "HeadLab finds the attention heads that carry a behaviour (such as induction) in a model's training "
    "checkpoints, and tests them causally. Pick a model and a checkpoint in the sidebar, then follow the recipe: "
    "**Spectral signal** ranks heads by how their attention changes over training, **Pattern screen** names "
    "induction and previous-token heads by their attention, and the **Ablation lab** knocks a group of heads out "
    "against random groups of the same size and gives a verdict with its rule.")
HEADLINE = ("induction_loss", "strong_induction_count", "marker_accuracy", "train_accuracy")  # one line per task


def _result(final: dict) -> str:
    """A model's final evaluation in a few words (the manifest's headline figures)."""
    shown = [f"{key.replace('_', ' ')} {final[key]:.3g}" for key in HEADLINE
             if isinstance(final.get(key), (int, float)) and not isinstance(final.get(key), bool)]
    return "; ".join(shown) or "not evaluated yet"


def train_quick_zoo() -> None:
    """Train every missing quick-zoo model, one progress bar per model (resumable if interrupted)."""
    entries = ZOO_PRESETS["quick"]
    for i, (name, _, _) in enumerate(entries):
        bar = st.progress(0.0, text=f"Training {name} ({i + 1}/{len(entries)})...")

        def progress(step: int, total: int, loss: float, bar=bar, name=name, i=i) -> None:
            bar.progress(min(step / max(total, 1), 1.0),
                         text=f"Training {name} ({i + 1}/{len(entries)}): step {step}/{total}, loss {loss:.3f}")

        train_zoo("quick", progress=progress, only=name)
        bar.progress(1.0, text=f"{name} trained.")


try:
    zoo_names = list_zoo()
except HeadLabError as exc:
    st.error(str(exc))
    st.stop()

if not zoo_names:
    st.info("The model zoo is empty. HeadLab trains its own small models (no downloads needed): "
            "a GPT-NeoX induction model, an [HHG] reversal model, an OLMoE-style mixture of experts and a "
            "small GPT-NeoX model with duplicate-token heads.")
    if st.button("Train the quick zoo (a few minutes)", type="primary"):
        try:
            train_quick_zoo()
        except HeadLabError as exc:
            st.error(str(exc))
        else:
            forget_data()
            st.rerun()
    st.caption("Or from a terminal: `python -m core zoo --preset quick`. Training resumes where it stopped.")
    st.stop()

workspace = current_workspace()

st.subheader("The zoo")
rows = []
for name in zoo_names:
    try:
        manifest = read_manifest(name)
    except HeadLabError as exc:
        st.error(str(exc))
        continue
    cfg = manifest.get("config", {}).get("model", {})
    final = manifest.get("final") or {}
    seconds = manifest.get("train_seconds")
    rows.append({
        "model": name,
        "task": manifest.get("task"),
        "result": _result(final),
        "trained on": format_tokens(int(final["tokens"])) if isinstance(final.get("tokens"), (int, float)) else "—",
        "layers x heads": f"{cfg.get('n_layers')} x {cfg.get('n_heads')}",
        "family": manifest.get("family"),
        "checkpoints": len(manifest.get("checkpoints", [])),
        "complete": bool(manifest.get("complete")),
        "training time": f"{seconds / 60:.1f} min" if isinstance(seconds, (int, float)) else "—",
        # an imported pretrained model (models import, zoo --preset real): where it came from
        "licence": (manifest.get("source") or {}).get("licence") or "—",
        "source": source_text(manifest["source"]) if manifest.get("source") else "trained here",
        "SHA-256": (manifest.get("source") or {}).get("sha256") or "—",
    })
st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
if any(r["source"] != "trained here" for r in rows):
    st.caption(f"Note: {QUANTIZED_NOTE}.")
st.caption("Start with induction-neox, the zoo's main model: its induction circuit is the one the papers describe.")

if workspace is None:
    st.stop()

if workspace.ref.kind == "zoo":
    try:
        manifest = read_manifest(workspace.model_name)
    except HeadLabError as exc:
        st.error(str(exc))
        st.stop()
    curves = manifest.get("curves", {})
    if curves.get("step"):
        fig = go.Figure(go.Scatter(x=curves["step"], y=curves["loss"], mode="lines", name="train loss"))
        for ckpt in manifest.get("checkpoints", []):
            fig.add_vline(x=ckpt["step"], line_width=1, line_dash="dot", line_color="rgba(0,0,0,0.25)")
        fig.add_vline(x=workspace.checkpoint.step, line_width=2, line_color="#D55E00")
        fig.update_layout(title=f"{workspace.model_name}: training loss (dotted: checkpoints; orange: selected)",
                          xaxis_title="step", yaxis_title="loss (nats)", height=380, template="simple_white")
        st.plotly_chart(fig, theme=None, key="zoo_curve")

st.subheader("Checkpoints")
st.dataframe(
    pd.DataFrame([{"revision": c.revision, "step": c.step, "tokens": format_tokens(c.tokens),
                   "selected": c.revision == workspace.revision} for c in workspace.checkpoints]),
    hide_index=True, width="stretch",
)
st.caption("Pick a checkpoint with the slider in the sidebar; every page follows it.")
