"""Deterministic simulation of the ownership protocol (development only, not shipped in the wheel).

Run ``python -m laminar_dev.sim simulate --seed S --steps N`` for one scenario
(its trace and verdict) or ``python -m laminar_dev.sim soak --minutes M`` for
many. See `world` for the scheduler and the scenario, `actors` for the
simulated processes, `store` for the simulated object store and `invariants`
for the promises checked after every step.
"""

from __future__ import annotations

from .invariants import InvariantViolation
from .reverts import Knobs
from .world import ScenarioCounts, ScenarioResult, SimConfig, run_scenario

__all__ = ["InvariantViolation", "Knobs", "ScenarioCounts", "ScenarioResult", "SimConfig", "run_scenario"]
