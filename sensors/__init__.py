"""Dagster sensors and schedules of the laminar code location (one per module).

* ``node_failure_sensor`` (`sensors.node_failure`) — fails over each partition
  whose owner stopped heartbeating, within its own evaluation, and records each
  failover as a ``failover_partition`` run.
* ``migration_retry_sensor`` (`sensors.migration_retry`) — re-launches failed
  migration runs, or turns them into failovers when the old owner is dead.
* ``laminar_observation_sensor`` (`sensors.observation`) — reports the ledger
  assets as observations when the ledger changes (no runs).
* ``rebalance_schedule`` (`sensors.rebalance_schedule`) — hourly rebalance,
  stopped by default.

Each decision (which partitions to fail over, driving them within a budget,
whether to retry a failed run) is a library function of
`laminar_orchestration.control`; the sensors only translate it into run
requests, asset events and cursors.
"""

from dagster import ScheduleDefinition, SensorDefinition

from .migration_retry import decide_retry, migration_retry_sensor
from .node_failure import HEARTBEAT_TIMEOUT_ENV, build_node_failure_sensor, failover_run_key, node_failure_sensor
from .observation import laminar_observation_sensor
from .rebalance_schedule import rebalance_schedule

__all__ = [
    "HEARTBEAT_TIMEOUT_ENV",
    "SCHEDULES",
    "SENSORS",
    "build_node_failure_sensor",
    "decide_retry",
    "failover_run_key",
    "laminar_observation_sensor",
    "migration_retry_sensor",
    "node_failure_sensor",
    "rebalance_schedule",
]

SCHEDULES: list[ScheduleDefinition] = [rebalance_schedule]
SENSORS: list[SensorDefinition] = [node_failure_sensor, migration_retry_sensor, laminar_observation_sensor]
