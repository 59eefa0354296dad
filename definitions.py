"""The laminar code location, loaded by ``workspace.yaml`` (``dagster dev -w workspace.yaml``).

Resources come from the environment: ``LAMINAR_STORE`` (default: the local
store under the working directory), ``AWS_ENDPOINT_URL`` / ``AWS_REGION`` for
S3 stores, ``LAMINAR_SPARK_MASTER`` (default ``local[*]``) and
``LAMINAR_FAILOVER_HEARTBEAT_TIMEOUT_S`` (default: each node's own timeout).
"""

import warnings

from dagster import BetaWarning, Definitions, PreviewWarning

# Dynamic partitions and sensor-reported asset events are marked beta/preview; we rely on them knowingly.
warnings.filterwarnings("ignore", category=BetaWarning)
warnings.filterwarnings("ignore", category=PreviewWarning)

from assets import ASSET_CHECKS, ASSETS  # noqa: E402
from assets.stream_output import stream_output  # noqa: E402
from jobs import failover_partition, migrate_partition, rebalance, worker_node  # noqa: E402
from jobs.table_maintenance import table_maintenance, table_maintenance_schedule  # noqa: E402
from resources import build_resources  # noqa: E402
from sensors import SCHEDULES, SENSORS  # noqa: E402

defs = Definitions(
    assets=[*ASSETS, stream_output],
    asset_checks=ASSET_CHECKS,
    jobs=[migrate_partition, failover_partition, rebalance, worker_node, table_maintenance],
    sensors=SENSORS,
    schedules=[*SCHEDULES, table_maintenance_schedule],
    resources=build_resources(),
)
