"""The Boolean family: the tasks, the cube and its splits (`registry`, re-exported here),
the Fourier view and the MDI (`fourier`), the GOTU experiments' model and groups (`gotu`),
the coverage study's tasks (`coverage`), interaction graphs read from training
(`graphs`), discovery's two stages (`discover`) and the planted benchmark's tasks
(`planted`).
"""

from mpx.tasks.boolean.registry import *  # noqa: F401,F403
