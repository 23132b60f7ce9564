"""Models & training: the zoo, each model's checkpoints and its training curves."""

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from core.errors import HeadLabError
from core.models import list_zoo, read_manifest
from pages._shared import format_tokens, workspace_sidebar

st.title("Models & training")

if not list_zoo():
    st.info("The model zoo is empty. HeadLab trains its own small models (no downloads needed).")
    if st.button("Train the quick zoo (about 5 minutes)", type="primary"):
        from core.train import train_zoo

        bar = st.progress(0.0, text="Training the quick zoo...")
        try:
            train_zoo("quick", progress=lambda frac, text: bar.progress(min(frac, 1.0), text=text))
        except HeadLabError as exc:
            st.error(str(exc))
        else:
            st.cache_data.clear()
            st.rerun()
    st.stop()

workspace = workspace_sidebar()
if workspace is None:
    st.stop()

st.subheader("The zoo")
rows = []
for name in list_zoo():
    try:
        manifest = read_manifest(name)
    except HeadLabError as exc:
        st.error(str(exc))
        continue
    cfg = manifest.get("config", {}).get("model", {})
    rows.append({
        "model": name,
        "family": manifest.get("family"),
        "task": manifest.get("task"),
        "layers x heads": f"{cfg.get('n_layers')} x {cfg.get('n_heads')}",
        "checkpoints": len(manifest.get("checkpoints", [])),
        "train seconds": manifest.get("train_seconds"),
        **{k: v for k, v in manifest.get("final", {}).items() if isinstance(v, (int, float))},
    })
st.dataframe(pd.DataFrame(rows), hide_index=True, use_container_width=True)

if workspace.ref.kind == "zoo":
    manifest = read_manifest(workspace.model_name)
    curves = manifest.get("curves", {})
    if curves.get("step"):
        fig = go.Figure(go.Scatter(x=curves["step"], y=curves["loss"], mode="lines", name="train loss"))
        for ckpt in manifest.get("checkpoints", []):
            fig.add_vline(x=ckpt["step"], line_width=1, line_dash="dot", line_color="rgba(0,0,0,0.25)")
        fig.update_layout(title=f"{workspace.model_name}: training loss (dotted: checkpoints)",
                          xaxis_title="step", yaxis_title="loss (nats)", height=380)
        st.plotly_chart(fig, use_container_width=True)

st.subheader("Checkpoints")
st.dataframe(
    pd.DataFrame([{"revision": c.revision, "step": c.step, "tokens": format_tokens(c.tokens)}
                  for c in workspace.checkpoints]),
    hide_index=True, use_container_width=True,
)
