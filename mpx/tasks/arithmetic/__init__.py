"""The arithmetic family: the tasks, their tokens, splits and groups (here), and discovered
attention patterns (`discover`).
"""

from mpx.tasks.arithmetic.task import *  # noqa: F401,F403
