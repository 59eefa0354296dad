"""Dagster jobs of the laminar code location: migrate, fail over, rebalance."""

from .common import (
    ATTEMPT_TAG,
    MIGRATION_ID_TAG,
    NOT_BEFORE_TAG,
    PARTITION_TAG,
    RETRY_OF_TAG,
    MigrationHandle,
    MigrationLimits,
    limits_from_run_config,
)
from .migration import (
    GRACEFUL_OPS,
    RISING_OPS,
    FailoverPartitionConfig,
    MigratePartitionConfig,
    failover_partition,
    migrate_partition,
)
from .rebalance import RebalanceConfig, Wave, rebalance

__all__ = [
    "ATTEMPT_TAG",
    "GRACEFUL_OPS",
    "MIGRATION_ID_TAG",
    "NOT_BEFORE_TAG",
    "PARTITION_TAG",
    "RETRY_OF_TAG",
    "RISING_OPS",
    "FailoverPartitionConfig",
    "MigratePartitionConfig",
    "MigrationHandle",
    "MigrationLimits",
    "RebalanceConfig",
    "Wave",
    "failover_partition",
    "limits_from_run_config",
    "migrate_partition",
    "rebalance",
]
