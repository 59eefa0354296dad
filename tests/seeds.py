"""Fresh base seeds for the tests that search new seeds each run, printed so a failure can be replayed."""

from __future__ import annotations

import os
import time


def fresh_base_seed(env_var: str, what: str) -> int:
    """`$env_var` if set (a replay), else a new seed; printed with the line that replays it."""
    base = int(os.environ.get(env_var, str(time.time_ns() % 1_000_000_007)))
    print(f"\n{what} base seed {base} (replay: {env_var}={base})")
    return base
