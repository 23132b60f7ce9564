"""Models & training: the zoo, each model's checkpoints and its training curves.

First launch with no zoo offers to train the quick zoo here, with visible progress.
"""

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from core.errors import HeadLabError
from core.model.refs import list_zoo, read_manifest
from core.zoo.presets import ZOO_PRESETS, train_zoo
from pages._cache import forget_data
from pages._state import current_workspace
from pages._widgets import format_tokens

st.title("Models & training")


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
    rows.append({
        "model": name,
        "family": manifest.get("family"),
        "task": manifest.get("task"),
        "layers x heads": f"{cfg.get('n_layers')} x {cfg.get('n_heads')}",
        "checkpoints": len(manifest.get("checkpoints", [])),
        "complete": manifest.get("complete"),
        "train seconds": manifest.get("train_seconds"),
        **{k: v for k, v in final.items() if isinstance(v, (int, float)) and not isinstance(v, bool)},
    })
st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")

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
