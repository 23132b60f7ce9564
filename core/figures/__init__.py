"""Figure builders: results -> plotly figures, one module per view, the export bundle and the theme."""
