"""Make this machine's Spark class archive now: ``python -m laminar_orchestration.ops.class_archive``.

Run before a test suite or in a container image's build (with ``LAMINAR_SPARK_CLASS_ARCHIVE_DIR`` set
where the nodes will look), so that no node pays for recording it
(`laminar_orchestration.dataplane.class_archive`).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
from pathlib import Path

from laminar_orchestration.dataplane.class_archive import ClassArchive, class_archive, seal_a_recording
from laminar_orchestration.dataplane.engine import SparkBatchEngine, build_spark_session, synthetic_events
from laminar_orchestration.processing.schema import DEFAULT_STREAM_SCHEMA

log = logging.getLogger(__name__)

__all__ = ["prepare", "record"]


def prepare(directory: Path | None = None) -> Path | None:
    """Make this machine's archive now, if there is none: a Spark driver in a fresh interpreter records
    while it runs a few batches and exits, then its recording is sealed. The archive's path (None: off,
    the JDK cannot, another process records, or the recording failed: logged)."""
    archive = class_archive(directory)
    if archive is None or archive.recording is None:
        return None if archive is None else archive.path
    # A fresh interpreter: the recording JVM must be one this call starts and stops, never a session
    # this process already runs (stopping it would end its owner's work).
    done = subprocess.run(
        [sys.executable, "-m", "laminar_orchestration.ops.class_archive",
         "--record", str(archive.path), str(archive.recording)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        log.warning("recording the Spark class archive failed (exit %s): %s", done.returncode, done.stderr[-2000:])
        archive.recording.unlink(missing_ok=True)
        return None
    return archive.path if seal_a_recording(archive.path) else None


def record(archive: ClassArchive) -> None:
    """In a fresh interpreter: a driver JVM that records `archive` while it runs a node's batches, then exits."""
    spark = build_spark_session("local[1]", "laminar-class-archive", archive=archive)
    proc = spark.sparkContext._gateway.proc  # the JVM itself: spark-submit execs java
    with tempfile.TemporaryDirectory(prefix="laminar-class-archive-") as tmp:
        engine = SparkBatchEngine(spark, workdir=tmp)
        for generation in range(3):  # the classes of a node's batches, not only of its start
            engine.aggregate(synthetic_events(DEFAULT_STREAM_SCHEMA, 4_000), epoch=1, generation=generation)
    spark.stop()
    proc.stdin.close()  # the gateway JVM exits at the end of its stdin, writing the recording
    proc.wait()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--record"]:
        record(ClassArchive(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        made = prepare()
        print(f"Spark class archive: {made}" if made else "Spark class archive: none (off, or another process records)")
