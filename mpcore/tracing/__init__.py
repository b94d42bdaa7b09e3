"""Traced steps (``mp.function``, ``Model.compile(jit_compile=...)``): a step's first call is
recorded as a program of kernel calls that later calls replay. What a replay takes from each
call, and what it refuses: ``docs/tracing.md``."""
