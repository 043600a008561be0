"""The environment's on/off switches of a Spark session (``CKPT_SPARK_UI``, ``CKPT_JVM_ARCHIVE``):
one spelling of "off" for all of them."""

from __future__ import annotations

import os

OFF_WORDS = frozenset({"0", "false", "no", "off"})
"""What turns a switch off (any case, surrounding blanks ignored); anything else, or unset, is on."""


def switched_on(variable: str) -> bool:
    """Whether the switch ``variable`` is on: unset, or set to anything but :data:`OFF_WORDS`."""
    return os.environ.get(variable, "1").strip().lower() not in OFF_WORDS
