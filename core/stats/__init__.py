"""Pure array statistics: no model, no torch module hooks, no plotly. Tested on arrays alone."""
