"""Make this machine's Spark class archive now: ``python -m laminar_orchestration.ops.class_archive``.

Run before a test suite or in a container image's build (with ``LAMINAR_SPARK_CLASS_ARCHIVE_DIR`` set
where the nodes will look), so that no node pays for recording it
(`laminar_orchestration.dataplane.class_archive`).
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from laminar_orchestration.dataplane.class_archive import class_archive, seal_a_recording
from laminar_orchestration.dataplane.engine import SparkBatchEngine, build_spark_session, synthetic_events
from laminar_orchestration.processing.schema import DEFAULT_STREAM_SCHEMA

__all__ = ["prepare"]


def prepare(directory: Path | None = None) -> Path | None:
    """Make this machine's archive now, if there is none: a Spark driver records while it runs a batch,
    exits, and its recording is sealed. The archive's path (None: off, or another process records)."""
    archive = class_archive(directory)
    if archive is None or archive.recording is None:
        return None if archive is None else archive.path
    spark = build_spark_session("local[1]", "laminar-class-archive", archive=archive)
    proc = spark.sparkContext._gateway.proc  # the JVM itself: spark-submit execs java
    with tempfile.TemporaryDirectory(prefix="laminar-class-archive-") as tmp:
        engine = SparkBatchEngine(spark, workdir=tmp)
        for generation in range(3):  # the classes of a node's batches, not only of its start
            engine.aggregate(synthetic_events(DEFAULT_STREAM_SCHEMA, 4_000), epoch=1, generation=generation)
    spark.stop()
    proc.stdin.close()  # the gateway JVM exits at the end of its stdin, writing the recording
    proc.wait()
    return archive.path if seal_a_recording(archive.path) else None


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    made = prepare()
    print(f"Spark class archive: {made}" if made else "Spark class archive: none (off, or another process records)")
