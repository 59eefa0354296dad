"""``committed_state``: each stream partition's committed keyed state, materialized on Spark.

One Dagster partition per laminar partition (``"0"`` … ``"P-1"``; the
observation sensor adds them once it sees the cluster, so loading the code
location never reads the store). Materializing partition *p* restores *p*'s
committed state from its last manifest (snapshot + deltas, exactly what a new
owner would restore), hands it to Spark through the ``pyspark`` resource and
writes it as Parquet under ``output_dir``. The metadata tells what was
materialized: keys, events, the committed offset and the manifest it came from.
"""

import os
from pathlib import Path

from dagster import (
    AssetExecutionContext,
    Config,
    DataVersion,
    DynamicPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    asset,
)
from dagster_pyspark import PySparkResource
from pydantic import Field

from laminar_orchestration.dataplane.restore import committed_state as read_committed_state
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.protocol.chain import ManifestReader
from resources import LaminarResource

#: The stream partitions as Dagster partitions (keys "0", "1", ...).
LAMINAR_PARTITIONS = DynamicPartitionsDefinition(name="laminar_partitions")
#: Where materializations go unless configured: ``LAMINAR_ASSET_DIR``, else under the working directory.
ASSET_DIR_ENV = "LAMINAR_ASSET_DIR"


class CommittedStateConfig(Config):
    """Launchpad config of a `committed_state` materialization."""

    output_dir: str | None = Field(
        default=None,
        description=f"Directory of the Parquet copies (default: ${ASSET_DIR_ENV}, else ./.laminar/assets).",
    )

    def directory(self) -> Path:
        """The configured directory, else the default."""
        raw = self.output_dir or os.environ.get(ASSET_DIR_ENV, "").strip() or ".laminar/assets"
        return Path(raw).expanduser().resolve() / "committed_state"


@asset(
    partitions_def=LAMINAR_PARTITIONS,
    group_name="laminar",
    description="Committed keyed state of each stream partition (count, sum, min, max, last per key), "
    "restored from its last manifest and written as Parquet by Spark.",
)
def committed_state(
    context: AssetExecutionContext, config: CommittedStateConfig, laminar: LaminarResource, pyspark: PySparkResource
) -> MaterializeResult[None]:
    """Restore partition `context.partition_key`'s committed state and write it with Spark."""
    from pyspark.sql import functions as F

    p = int(context.partition_key)
    store = laminar.store()
    manifest = ManifestReader(store).current(PartitionId(p))
    table, offset = read_committed_state(store, p)
    spark = pyspark.spark_session
    frame = spark.createDataFrame(table)  # Arrow in, no row-by-row conversion
    target = config.directory() / f"partition={p:05d}"
    frame.write.mode("overwrite").parquet(str(target))
    totals = frame.agg(F.count("*").alias("keys"), F.sum("count").alias("events"), F.sum("sum").alias("total")).first()
    keys = int(totals["keys"]) if totals is not None else 0
    events = int(totals["events"] or 0) if totals is not None else 0
    top = frame.orderBy(F.desc("count"), "key").limit(5).toArrow()
    preview = "\n".join(
        ["| key | count | sum | last |", "|---|---|---|---|"]
        + [f"| {r['key']} | {r['count']} | {r['sum']:g} | {r['last']:g} |" for r in top.to_pylist()]
    )
    commit = manifest.manifest.commit_ulid if manifest is not None else "none"
    context.log.info(f"partition {p}: {keys} keys, {events} events up to offset {offset} -> {target}")
    return MaterializeResult(
        metadata={
            "keys": keys,
            "events": events,
            "committed_offset": offset,
            "epoch": manifest.manifest.fencing_token if manifest is not None else 0,
            "manifest_seq": manifest.manifest.seq if manifest is not None else 0,
            "path": MetadataValue.path(str(target)),
            "top_keys": MetadataValue.md(preview),
        },
        # The same commit gives the same state: unchanged partitions show no new version.
        data_version=DataVersion(commit),
    )
