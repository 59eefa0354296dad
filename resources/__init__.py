"""Dagster resources of the laminar code location: the ledger/store and Spark.

* ``laminar`` — `LaminarResource`: opens the object store named by
  ``LAMINAR_STORE`` (default: the embedded local store under the working
  directory) and hands out `Ledger`s, `MigrationCoordinator`s and manifest
  readers. For ``s3://`` stores the boto3 client comes from dagster-aws's
  `S3Resource` (endpoint and region from ``AWS_ENDPOINT_URL`` / ``AWS_REGION``)
  and the store is wrapped in `RetryingStore`.
* ``pyspark`` — dagster-pyspark's `PySparkResource` with the same Spark
  settings as ``laminar node run`` (`laminar_orchestration.dataplane.engine.spark_conf`;
  ``spark.master`` from ``LAMINAR_SPARK_MASTER``, default ``local[*]``; Spark UI
  off; bound to loopback unless ``SPARK_LOCAL_IP`` is set). The ``worker_node``
  job runs a node's partitions on its session and ``committed_state`` is
  materialized on it; no migration op needs it, so Dagster never starts a
  SparkSession for those runs.
"""

import os
from typing import Any

from dagster import ConfigurableResource, EnvVar, InitResourceContext
from dagster_aws.s3 import S3Resource
from dagster_pyspark import PySparkResource
from pydantic import Field, PrivateAttr

from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.dataplane.engine import spark_conf
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.tasks import MigrationConfig
from laminar_orchestration.store import ObjectStore, default_store_url, open_store, parse_s3_url

__all__ = [
    "LaminarResource",
    "LaminarSparkResource",
    "build_resources",
    "laminar_resource_from_env",
    "s3_resource_from_env",
    "spark_resource_from_env",
]


class LaminarResource(ConfigurableResource):  # type: ignore[type-arg]
    """The laminar object store (ledger, manifests) as a Dagster resource.

    `store_url` is ``file:///path`` or ``s3://bucket/prefix``. For S3 the
    client is built by the nested `s3` resource; botocore must not retry on
    its own (`RetryingStore` resolves every ambiguous conditional write by
    reading back), so build that resource with ``max_attempts=0``.
    """

    store_url: str = Field(description="file:///path or s3://bucket/prefix of the laminar store")
    s3: S3Resource | None = Field(
        default=None,
        description="S3 client settings (endpoint, region, credentials) for s3:// stores",
    )

    _store: ObjectStore | None = PrivateAttr(default=None)

    def store(self) -> ObjectStore:
        """The store, opened once per resource instance."""
        if self._store is None:
            self._store = self._open()
        return self._store

    def _open(self) -> ObjectStore:
        url = self.store_url
        if isinstance(url, EnvVar):
            # Called outside a run/sensor (Dagster resolves EnvVars only when it initializes
            # the resource): read the variable rather than open a store named "LAMINAR_STORE".
            url = url.get_value() or default_store_url()
        url = url.strip()
        if not url.lower().startswith("s3:") or self.s3 is None:
            # Local stores (and S3 without Dagster-side settings) open exactly as the CLI does.
            return open_store(url)
        from laminar_orchestration.store.retry import RetryingStore
        from laminar_orchestration.store.s3 import S3ObjectStore

        location = parse_s3_url(url)
        client: Any = self.s3.get_client()
        inner = S3ObjectStore(location.bucket, location.prefix, client=client)
        return RetryingStore(inner)

    def ledger(self) -> Ledger:
        """A ledger over the store."""
        return Ledger(self.store())

    def coordinator(self, config: MigrationConfig | None = None) -> MigrationCoordinator:
        """A migration coordinator with `config` (the default limits when None)."""
        return MigrationCoordinator(self.ledger(), config)

    def manifests(self) -> ManifestReader:
        """Read access to the per-partition commit manifests."""
        return ManifestReader(self.store())


def _env_or(names: tuple[str, ...], default: str | None) -> Any:
    """`EnvVar` of the first variable set (shown as such in the UI), else `default`.

    A bare ``EnvVar`` fails at run time when the variable is unset; these
    settings all have sensible defaults, so fall back instead.
    """
    for name in names:
        if os.environ.get(name, "").strip():
            return EnvVar(name)
    return default


def s3_resource_from_env() -> S3Resource:
    """dagster-aws's S3Resource with endpoint and region from the environment, botocore retries off."""
    return S3Resource(
        endpoint_url=_env_or(("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"), None),
        region_name=_env_or(("AWS_REGION", "AWS_DEFAULT_REGION"), None),
        # 0 retries: RetryingStore retries, reading back each write whose outcome is unknown.
        max_attempts=0,
    )


def laminar_resource_from_env() -> LaminarResource:
    """`LaminarResource` for ``LAMINAR_STORE`` (default: the local store under the working directory)."""
    return LaminarResource(
        store_url=_env_or(("LAMINAR_STORE",), default_store_url()),
        s3=s3_resource_from_env(),
    )


class LaminarSparkResource(PySparkResource):
    """`PySparkResource` that binds Spark to loopback (unless ``SPARK_LOCAL_IP`` is set) and keeps its log quiet.

    Spark reads ``SPARK_LOCAL_IP`` when the JVM starts, so it is set just before
    the session is built, as `laminar node run` does. A node on a remote
    cluster sets ``SPARK_LOCAL_IP`` to an address the executors can reach.
    """

    def setup_for_execution(self, context: InitResourceContext) -> None:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        super().setup_for_execution(context)
        self.spark_session.sparkContext.setLogLevel("ERROR")


def spark_resource_from_env() -> PySparkResource:
    """The ``pyspark`` resource: `spark_conf` for ``LAMINAR_SPARK_MASTER`` (default ``local[*]``)."""
    master = os.environ.get("LAMINAR_SPARK_MASTER", "").strip() or "local[*]"
    return LaminarSparkResource(spark_config=spark_conf(master, "laminar-dagster"))


def build_resources() -> dict[str, Any]:
    """The resources of the code location, keyed as the ops and sensors ask for them.

    Also serves the control plane's /metrics when ``LAMINAR_METRICS_PORT`` is set (`resources.metrics`).
    """
    from resources.metrics import start_control_plane_metrics

    start_control_plane_metrics()
    return {"laminar": laminar_resource_from_env(), "pyspark": spark_resource_from_env()}
