"""The language family: decoder groups (`task`, re-exported here) and the text corpora
and tokenizers (`text`).
"""

from mpx.tasks.language.task import *  # noqa: F401,F403
