"""The vision family: ViT groups (`task`, re-exported here), image datasets (`data`) and
augmentation (`augment`).
"""

from mpx.tasks.vision.task import *  # noqa: F401,F403
