"""Plotly themes: `screen` for the app, `paper` for exported figures (white, print sizes, no clutter)."""

import plotly.graph_objects as go

# A colour per layer that stays readable in print and for colour-blind readers (Okabe-Ito + extras).
LAYER_COLORS = [
    "#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000",
    "#999999", "#882255", "#44AA99", "#117733", "#332288", "#AA4499", "#88CCEE", "#DDCC77",
]

# One colour per head class of the pattern screen (same order as core.tasks.probe_batch.PATTERNS).
CLASS_COLORS = {
    "induction": "#D55E00",
    "duplicate-token": "#CC79A7",
    "previous-token": "#0072B2",
    "self": "#009E73",
    "first-token": "#E69F00",
    "local": "#56B4E9",
    "unspecialized": "#E8E8E8",
}
CLASS_SHORT = {
    "induction": "ind", "duplicate-token": "dup", "previous-token": "prev", "self": "self",
    "first-token": "first", "local": "local", "unspecialized": "",
}

# Sequential scale for log selectivity, readable in greyscale print.
SELECTIVITY_SCALE = "Viridis"
CANDIDATE_COLOR = "#D55E00"
CONTROL_COLOR = "#7F7F7F"
UPPER_BOUND_COLOR = "#000000"
FADED = "rgba(150,150,150,0.35)"

SCREEN = go.layout.Template(
    layout=dict(
        font=dict(family="Inter, Helvetica, Arial, sans-serif", size=13),
        paper_bgcolor="white",
        plot_bgcolor="white",
        xaxis=dict(showgrid=True, gridcolor="#eeeeee", zeroline=False, linecolor="#444", ticks="outside"),
        yaxis=dict(showgrid=True, gridcolor="#eeeeee", zeroline=False, linecolor="#444", ticks="outside"),
        colorway=LAYER_COLORS,
        margin=dict(l=60, r=20, t=50, b=50),
    )
)

PAPER = go.layout.Template(
    layout=dict(
        font=dict(family="Times New Roman, DejaVu Serif, serif", size=11, color="black"),
        title=dict(font=dict(size=12)),
        paper_bgcolor="white",
        plot_bgcolor="white",
        xaxis=dict(showgrid=False, zeroline=False, showline=True, linecolor="black", linewidth=1,
                   ticks="outside", tickcolor="black", mirror=False),
        yaxis=dict(showgrid=False, zeroline=False, showline=True, linecolor="black", linewidth=1,
                   ticks="outside", tickcolor="black", mirror=False),
        colorway=LAYER_COLORS,
        legend=dict(bgcolor="rgba(0,0,0,0)", borderwidth=0, font=dict(size=9)),
        margin=dict(l=55, r=10, t=35, b=45),
    )
)

THEMES = {"screen": SCREEN, "paper": PAPER}

# Print sizes in pixels at 1x (a one-column figure is about 3.4 in wide; scale 4 gives ~ 400 dpi).
PAPER_WIDTH = 520
PAPER_HEIGHT = 360
PAPER_SCALE = 4
