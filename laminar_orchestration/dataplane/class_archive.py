"""A class-data archive for a node's Spark JVM: the classes Spark loads at start, mapped instead of loaded.

A fresh Spark driver JVM loads and verifies about ten thousand classes before its first batch: most
of a node's start-up CPU. The JVM can record the classes an application loaded into an archive at
exit (``-XX:ArchiveClassesAtExit``) and map that archive at the next start
(``-XX:SharedArchiveFile``): on a 2-core machine the JVM's CPU to its first batch halves
(``python -m benchmarks.bench_spark_jvm``). That is a node restarted in a rolling
update, a failover target starting cold, and every test that starts a node.

One node process on a machine records at a time (it holds the claim); the next one that starts
finds the recording whole and renames it to the archive, and it and every later one map it
(``python -m laminar_orchestration.ops.class_archive`` makes it at once: the test script, an image
build). The JVM writes a recording as it exits, its header last, so a recording whose header is
written is whole; one cut short (its JVM was killed while writing) never becomes the archive, where a
JVM mapping it would crash. The rename is atomic: nodes starting side by side see no archive or a
whole one. An archive is named by the JDK and Spark it was made with; one that no longer matches the
class path is refused by the JVM itself, which then starts as without one.

``LAMINAR_SPARK_CLASS_ARCHIVE=0`` turns this off; ``LAMINAR_SPARK_CLASS_ARCHIVE_DIR`` puts the archives
elsewhere (default ``~/.cache/laminar/spark-class-archive``).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

#: The first bytes of a JDK dynamic class-data archive (``CDS_DYNAMIC_ARCHIVE_MAGIC``, little-endian).
ARCHIVE_MAGIC = bytes.fromhex("a8ab0bf0")
#: Recording needs ``-XX:ArchiveClassesAtExit``: JDK 13 and later.
MIN_JAVA_MAJOR = 13
#: Recordings cut short (their JVM was killed while writing) are removed once this old.
STALE_RECORDING_S = 3600.0
#: A claim to record older than this is void: its recorder died, or runs on and records at its exit.
CLAIM_TTL_S = 600.0
#: The JVM's own messages about the archive (classes it skips, a mismatch it refuses) stay out of node logs.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


@dataclass(frozen=True)
class ClassArchive:
    """The archive a JVM maps (`recording` None), or records into `recording` for `path`."""

    path: Path
    recording: Path | None = None

    def java_options(self) -> str:
        """The driver JVM's options for this archive."""
        if self.recording is not None:
            return f"-XX:ArchiveClassesAtExit={self.recording} {QUIET}"
        return f"-XX:SharedArchiveFile={self.path} {QUIET}"


def whole_archive(path: Path) -> bool:
    """Whether the JVM finished writing `path`: it writes the header, with its magic number, last."""
    try:
        with path.open("rb") as fh:
            return fh.read(4) == ARCHIVE_MAGIC and path.stat().st_size > 1 << 20
    except OSError:
        return False


def class_archive(directory: Path | None = None) -> ClassArchive | None:
    """The archive this machine's Spark driver should map, or record (None: off, or the JDK cannot)."""
    if os.environ.get("LAMINAR_SPARK_CLASS_ARCHIVE", "1") in ("0", "false", "no", "off"):
        return None
    java = _java_release()
    if java is None:
        return None
    directory = directory or Path(
        os.environ.get("LAMINAR_SPARK_CLASS_ARCHIVE_DIR", Path.home() / ".cache" / "laminar" / "spark-class-archive")
    )
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    path = directory / f"spark-{_fingerprint(java)}.jsa"
    if path.is_file() or seal_a_recording(path):
        return ClassArchive(path)
    # One recorder at a time: recording costs its JVM about half again the CPU of a plain start.
    token = _claim(path)
    return None if token is None else ClassArchive(path, directory / f"{path.stem}.{token}.recording")


def _claim(path: Path) -> str | None:
    """This process's token to record `path`, or None while another process holds a fresh claim."""
    claim = path.with_suffix(".claim")
    try:
        lock = os.open(path.with_suffix(".lock"), os.O_CREAT | os.O_RDWR, 0o644)
    except OSError:  # a read-only folder: nobody records here
        return None
    try:
        # Looking at the claim and replacing a void one is one step: without the lock, a process that
        # found it void could remove the claim another just made, and both would record.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _mtime(claim) > time.time() - CLAIM_TTL_S:
            return None
        claim.unlink(missing_ok=True)
        token = uuid.uuid4().hex[:12]
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except OSError:
            return None
        with os.fdopen(fd, "w") as fh:
            fh.write(token)
        return token
    finally:
        os.close(lock)  # closing the last descriptor releases the lock


def seal_a_recording(path: Path) -> bool:
    """Rename the newest whole recording for `path` to it (atomic: a JVM maps the old file or the new);
    remove recordings cut short long ago. True if `path` is there now."""
    recordings = sorted(path.parent.glob(f"{path.stem}.*.recording"), key=_mtime, reverse=True)
    for recording in recordings:
        if whole_archive(recording):
            try:
                os.replace(recording, path)
            except OSError:
                continue
            log.info("Spark class archive ready: %s", path)
            path.with_suffix(".claim").unlink(missing_ok=True)
            return True
        if _mtime(recording) < time.time() - STALE_RECORDING_S:
            recording.unlink(missing_ok=True)
    return path.is_file()


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _java_release() -> str | None:
    """The `release` file of the JDK Spark will run (JAVA_HOME's, else the `java` on PATH), if it is 13+."""
    home = os.environ.get("JAVA_HOME")
    java = Path(home) / "bin" / "java" if home else (Path(found) if (found := shutil.which("java")) else None)
    if java is None or not java.exists():
        return None
    release = java.resolve().parent.parent / "release"
    try:
        text = release.read_text()
    except OSError:
        return None
    version = next(
        (line.split("=", 1)[1].strip('"') for line in text.splitlines() if line.startswith("JAVA_VERSION=")), ""
    )
    major = version.split(".")[0]
    if not major.isdigit() or int(major) < MIN_JAVA_MAJOR:
        return None
    return f"{java.resolve()}\n{text}"


def _fingerprint(java: str) -> str:
    """The JDK and the Spark jars: an archive made with others would not match the class path."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    listing = sorted(f"{p.name}:{p.stat().st_size}" for p in jars.glob("*.jar")) if jars.is_dir() else []
    material = "\n".join([java, pyspark.__version__, str(jars), *listing])
    return hashlib.sha256(material.encode()).hexdigest()[:16]
