"""The accelerator check, one module per stage (`python benchmarks/accelerator_check`).

A package so that each stage reads on its own; importing it first starts the budget's
clock and sets what jax must see before it starts, in this process and in the probe
process it spawns.
"""

import os
import time

START = time.monotonic()  # The budget counts from here, imports included.

# Set before jax starts: jax preallocates this share of a GPU at its first use. The parent
# keeps most of it; the stage-3 child process gets a little beside it (cudnn.py).
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.85")
# The experiments refuse attention="cudnn" (wrong under vmap, measured): this check measures it.
os.environ["MPX_MEASURE_CUDNN"] = "1"
