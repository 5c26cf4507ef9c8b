"""A value as an error message shows it: its repr, cut short. Standard library only; imports nothing of gpubox.

Every validator that echoes an input in a message (state_checks, capacity_planner) goes through short(): an
input may be a long string or a 5000-digit integer, whose repr() raises ValueError past Python's 4300-digit
limit, so a huge integer is described by its size instead.
"""

from __future__ import annotations

from typing import Any

LIMIT = 60


def short(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= LIMIT else text[: LIMIT - 3] + "..."
