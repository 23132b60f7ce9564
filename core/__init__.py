"""HeadLab's compute layer: models, probes, statistics, ablation. Never imports streamlit.

OpenMP threads that finish their share of an operation early sleep instead of spinning
(OMP_WAIT_POLICY=PASSIVE): spinning threads take the cores a competing process needs. Measured on
2 shared cores, quick induction model at 2 threads: 20 training steps beside other work took
22-51 s spinning and 4.3-7.6 s sleeping; 40 steps on free cores 5.85 s vs 5.90 s (medians of 3),
no cost measurable. OpenMP reads the variable once, when torch loads, so it is set here, before
any HeadLab module imports torch; a value the user set is kept. Weights stay bit-identical: the
work is split the same way (checked after 8 training steps at 2 threads).
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
