"""The names the Dagster code location imports from before the planner and the driving were split.

The planner is `planner` (pure), reading ownership from the ledger is
`ownership`, carrying moves out is `moves`, and the operations (plan a
rebalance, plan a node's failover) are `planning`. This module only
re-exports; nothing in the library imports it, so it closes no import cycle.
"""

from __future__ import annotations

from .moves import (
    FailoverDecision,
    MoveOutcome,
    NoFailoverTarget,
    drive,
    must_force,
    prepare_failover,
    record_failure,
    run_migration,
    run_moves,
    stranded,
)
from .ownership import WARM_STATES, live_node_ids, ownership_map, warm_copies
from .planner import (
    AssignmentError,
    AssignmentPlan,
    Move,
    NodeBounds,
    failover_target,
    least_loaded_node,
    node_loads,
    plan_assignment,
    schedule_waves,
    weighted_bounds,
)

__all__ = [
    "WARM_STATES",
    "AssignmentError",
    "AssignmentPlan",
    "FailoverDecision",
    "Move",
    "MoveOutcome",
    "NoFailoverTarget",
    "NodeBounds",
    "drive",
    "failover_target",
    "least_loaded_node",
    "live_node_ids",
    "must_force",
    "node_loads",
    "ownership_map",
    "plan_assignment",
    "prepare_failover",
    "record_failure",
    "run_migration",
    "run_moves",
    "schedule_waves",
    "stranded",
    "warm_copies",
    "weighted_bounds",
]
