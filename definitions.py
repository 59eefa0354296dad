"""The laminar code location, loaded by ``workspace.yaml`` (``dagster dev -w workspace.yaml``).

Resources come from the environment: ``LAMINAR_STORE`` (default: the local
store under the working directory), ``AWS_ENDPOINT_URL`` / ``AWS_REGION`` for
S3 stores, ``LAMINAR_SPARK_MASTER`` (default ``local[*]``) and
``LAMINAR_FAILOVER_HEARTBEAT_TIMEOUT_S`` (default: each node's own timeout).
"""

from dagster import Definitions

from assets import ASSETS, observe_laminar_state
from jobs import failover_partition, migrate_partition, rebalance
from resources import build_resources
from sensors import SCHEDULES, SENSORS

defs = Definitions(
    assets=ASSETS,
    jobs=[migrate_partition, failover_partition, rebalance, observe_laminar_state],
    sensors=SENSORS,
    schedules=SCHEDULES,
    resources=build_resources(),
)
