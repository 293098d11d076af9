"""The Boolean family: the task registry, the cube and its splits (here), the Fourier
view (`fourier`), the GOTU experiments' groups (`gotu`), the coverage study's tasks
(`coverage`) and interaction graphs for discovery (`discover`).
"""

from mpx.tasks.boolean.registry import *  # noqa: F401,F403
