"""Pattern screen (Step 2): per-pattern selectivity heatmaps, the class map and the specialized fraction."""

import streamlit as st

from core.figures.screen import (ScreenMarks, class_fractions_over_training, class_map, selectivity_animation,
                                 selectivity_heatmap, selectivity_strip)
from core.stats.selectivity import classify
from pages._cache import checkpoint_screen, screen_report
from pages._state import PATTERN, bound, offer_inspect, require_workspace, sync_url
from pages._widgets import guarded, show_figure

st.title("Pattern screen")
ws = require_workspace()
report = guarded(lambda: screen_report(ws))
here = guarded(lambda: checkpoint_screen(ws))
patterns = list(report.final.patterns)
pattern = bound(st.radio, "Pattern", PATTERN, patterns, horizontal=True)
sync_url()

index = ws.checkpoint_index
ckpt = report.checkpoints[index]
sel = report.selectivity_by_checkpoint[index]  # [pattern, layer, head]
floor = here.noise_floor
floor = float(floor) if floor is not None else None

m1, m2, m3, m4 = st.columns(4)
fractions = here.fractions()
spec_frac = fractions["specialized_fraction_above_null_p99"]
m1.metric("specialized fraction (induction > null p99)", "—" if spec_frac is None else f"{spec_frac:.1%}")
m2.metric(f"best pattern ≥ {here.threshold:g}x", f"{here.fraction_at_threshold:.1%}")
m3.metric("null floor (induction)", "—" if floor is None else f"{floor:.3g}x")
circuit = here.induction_heads
m4.metric("induction circuit", f"{len(circuit)} heads",
          help=f"induction selectivity against the {here.membership_baseline} baseline ≥ {here.induction_threshold:.3g}x")
st.caption(f"Induction circuit at {ws.revision}: **{circuit or 'none'}** (≥ {here.induction_threshold:.3g}x against "
           f"the {here.membership_baseline} baseline; 50x at T = 256, scaled to this probe length).")

left, right = st.columns(2)
with left:
    heat = selectivity_heatmap(sel[patterns.index(pattern)], pattern, report.model, report.probe_spec, ckpt.revision,
                               ckpt.tokens, ScreenMarks.of(here))
    picked = show_figure(heat, "screen_heatmap", pickable=True)
with right:
    classes = classify(sel, patterns, here.threshold)
    picked_classes = show_figure(class_map(classes, report.model, report.probe_spec, ckpt.revision, here.threshold),
                                 "screen_classes", pickable=True)
offer_inspect(picked or picked_classes)

left, right = st.columns(2)
with left:
    show_figure(selectivity_strip(sel[patterns.index(pattern)], pattern, report.model, report.probe_spec, ckpt.revision,
                                  here.threshold, floor), "screen_strip")
with right:
    if len(report.checkpoints) < 2:  # one checkpoint (an imported model): no course over training to draw
        st.info(f"{report.model} has one checkpoint ({ckpt.revision}), so the share of heads per class over "
                "training and its animation need a model with several checkpoints (a zoo model trained here, or "
                "a hub model's revisions).")
    else:
        show_figure(class_fractions_over_training(report.selectivity_by_checkpoint, patterns,
                                                  [c.tokens for c in report.checkpoints],
                                                  [c.revision for c in report.checkpoints], report.model,
                                                  report.probe_spec, here.threshold, ckpt.tokens), "screen_fractions")

if len(report.checkpoints) > 1 and st.toggle("Animate over training", key="screen_animate",
                                             help="A play button steps the heatmap through every checkpoint; the sidebar slider picks one."):
    show_figure(selectivity_animation(report.selectivity_by_checkpoint, patterns, pattern,
                                      [c.tokens for c in report.checkpoints], [c.revision for c in report.checkpoints],
                                      report.model, report.probe_spec), "screen_animation")
