"""The arithmetic family: the tasks, their tokens, splits and groups (`task`, re-exported
here), attention patterns read from learned masks (`patterns`) and discovery's two stages
(`discover`).
"""

from mpx.tasks.arithmetic.task import *  # noqa: F401,F403
