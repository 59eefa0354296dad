"""The ``worker_node`` job: a laminar worker node as one long-running Dagster run.

Its single op runs the node `laminar_orchestration.ops.node_builder.build_node`
builds, as `laminar node run` does — heartbeat, reconcile, the partitions'
micro-batches on the SparkSession of the ``pyspark`` resource, the output
table — for as long as the run lives. Terminating the run (Runs →
Terminate, or ``dagster run terminate``) stops the node gracefully: it drains
every partition, releases it after its last commit and leaves the cluster; the
run then ends Canceled. Launchpad config::

    node_id: 4
    heartbeat_timeout_s: 10     # optional; every default is `laminar node run`'s (`NodeConfig`)

`laminar node run` does the same without Dagster, with the same Spark settings
(`laminar_orchestration.dataplane.engine.spark_conf`).
"""

import threading
import time

from dagster import (
    Config,
    DagsterExecutionInterruptedError,
    Failure,
    OpExecutionContext,
    in_process_executor,
    job,
    op,
)
from dagster_pyspark import PySparkResource
from pydantic import Field

from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.ops.node_builder import build_node
from resources import LaminarResource

from .common import tag_run

#: Run tag naming the node a worker-node run runs (the UI can filter runs by it).
NODE_TAG = "laminar/node"
#: How long a terminated run waits for the node to drain and release its partitions.
DRAIN_TIMEOUT_S = 180.0


class WorkerNodeConfig(Config):
    """Launchpad config of `worker_node`: which node, and its timing (defaults as `laminar node run`)."""

    node_id: int = Field(ge=1, description="The node id (unique in the cluster).")
    heartbeat_interval_s: float = Field(
        default=NodeConfig.model_fields["heartbeat_interval_s"].default,
        gt=0,
        description="Seconds between heartbeats (each a billed PUT).",
    )
    heartbeat_timeout_s: float = Field(
        default=NodeConfig.model_fields["heartbeat_timeout_s"].default,
        gt=0,
        description="Seconds without a heartbeat after which the node counts as dead.",
    )
    refresh_interval_s: float = Field(
        default=NodeConfig.model_fields["refresh_interval_s"].default,
        gt=0,
        description="How often the node re-checks every partition's epoch against the ledger (and at once "
        "whenever the control plane changes what it asks of the node).",
    )
    standby_for: list[int] = Field(
        default_factory=list, description="Partitions to follow as a warm standby while others own them."
    )
    processor: str | None = Field(
        default=None,
        description="The processor to run (package.module:attribute or an installed name); left out, the one "
        "the cluster recorded at `laminar init`. Any other is refused unless its fingerprint matches the record.",
    )

    def node_config(self, store_url: str, spark_master: str) -> NodeConfig:
        """The `NodeConfig` of this node on `store_url`."""
        return NodeConfig(
            store_url=store_url,
            node_id=self.node_id,
            spark_master=spark_master,
            heartbeat_interval_s=self.heartbeat_interval_s,
            heartbeat_timeout_s=self.heartbeat_timeout_s,
            refresh_interval_s=self.refresh_interval_s,
            standby_for=tuple(self.standby_for),
            processor=self.processor,
        )


@op(
    name="run_node",
    description="Runs the worker node (heartbeat, reconcile, micro-batches on the pyspark resource's "
    "session) until the run is terminated; then drains and releases every partition.",
)
def run_node(
    context: OpExecutionContext, config: WorkerNodeConfig, laminar: LaminarResource, pyspark: PySparkResource
) -> None:
    """Run node `config.node_id` until the run is terminated (graceful) or the node fails."""
    spark = pyspark.spark_session
    node_config = config.node_config(laminar.store().url, str(spark.sparkContext.master))
    node = build_node(node_config, store=laminar.store(), spark=spark)
    failed: list[BaseException] = []
    # Waited on instead of Thread.join: an interrupt inside join() can mark a running thread stopped
    # (CPython before 3.13), and the run would end before the node left the cluster.
    finished = threading.Event()

    def serve() -> None:
        try:
            node.run(install_signals=False)  # signals belong to Dagster's run worker
        except BaseException as exc:  # handed to the op's thread, which fails the run with it
            failed.append(exc)
        finally:
            finished.set()

    thread = threading.Thread(target=serve, name=f"laminar-node-{config.node_id}", daemon=True)
    app = spark.sparkContext.appName
    context.log.info(
        f"node {config.node_id}: starting on the pyspark resource's session ({node_config.spark_master}, app {app}), "
        f"store {node_config.store_url}"
    )
    tag_run(context, {NODE_TAG: str(config.node_id)})
    thread.start()
    try:
        while not finished.wait(0.5):
            pass
    except (DagsterExecutionInterruptedError, KeyboardInterrupt):
        context.log.info(f"node {config.node_id}: run terminated, draining and releasing its partitions")
        node.stop()
        _drain(finished)
        context.log.info(f"node {config.node_id}: stopped")
        raise
    if failed:
        exc = failed[0]
        raise Failure(
            description=f"node {config.node_id} stopped: {type(exc).__name__}: {exc}",
            metadata={"node": config.node_id, "error_type": type(exc).__name__},
        ) from exc


def _drain(finished: threading.Event) -> None:
    """Wait for the stopping node, ignoring further interrupts: leaving mid-release would strand partitions."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while not finished.is_set() and time.monotonic() < deadline:
        try:
            finished.wait(0.5)
        except (DagsterExecutionInterruptedError, KeyboardInterrupt):
            continue


@job(
    name="worker_node",
    description="A laminar worker node as a long-running run: its partitions' micro-batches run on the "
    "pyspark resource's SparkSession. Terminate the run to drain and release its partitions.",
    executor_def=in_process_executor,
)
def worker_node() -> None:
    run_node()
