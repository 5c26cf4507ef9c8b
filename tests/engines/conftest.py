"""tests/engines' fixtures (stack_engines.py): ``engine``, one stack's installed vLLM release, parametrized over the
stack table, and ``every_engine``."""

from __future__ import annotations

from stack_engines import engine, every_engine  # noqa: F401
