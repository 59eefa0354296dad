"""The Spark driver's class archive: one recorder at a time, only a whole recording mapped, a real JVM mapping it."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from laminar_orchestration.dataplane import class_archive as archives
from laminar_orchestration.dataplane.class_archive import ARCHIVE_MAGIC, CLAIM_TTL_S, class_archive
from laminar_orchestration.ops.class_archive import prepare

JDK = '/usr/lib/jvm/test/bin/java\nJAVA_VERSION="17.0.1"\n'


@pytest.fixture(autouse=True)
def _a_jdk_17(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAMINAR_SPARK_CLASS_ARCHIVE", raising=False)
    monkeypatch.setattr(archives, "_java_release", lambda: JDK)


def _recording(directory: Path, name: str, *, whole: bool) -> Path:
    """What a JVM leaves: the header (magic first) is written last, so a JVM killed while writing leaves zeros."""
    path = directory / name
    path.write_bytes((ARCHIVE_MAGIC if whole else bytes(4)) + bytes(2 << 20))
    return path


def test_the_first_process_records_and_the_next_finds_no_archive_until_the_recording_is_whole(tmp_path: Path) -> None:
    first = class_archive(tmp_path)
    assert first is not None and first.recording is not None
    assert f"-XX:ArchiveClassesAtExit={first.recording}" in first.java_options()
    # The first JVM still runs (or writes its recording): the next one records nothing, maps nothing.
    assert class_archive(tmp_path) is None
    _recording(tmp_path, first.recording.name, whole=True)
    mapped = class_archive(tmp_path)
    assert mapped is not None and mapped.recording is None and mapped.path == first.path
    assert mapped.path.read_bytes()[:4] == ARCHIVE_MAGIC and not first.recording.exists()
    assert f"-XX:SharedArchiveFile={mapped.path}" in mapped.java_options()


def test_a_recording_cut_short_is_never_mapped_and_a_void_claim_is_taken_over(tmp_path: Path) -> None:
    first = class_archive(tmp_path)
    assert first is not None and first.recording is not None
    # Its JVM was killed while writing: the header (and its magic) never came.
    _recording(tmp_path, first.recording.name, whole=False)
    assert class_archive(tmp_path) is None, "a cut-short recording must never become the archive"
    assert not first.path.exists()
    claim = first.path.with_suffix(".claim")
    old = time.time() - CLAIM_TTL_S - 1
    os.utime(claim, (old, old))
    second = class_archive(tmp_path)
    assert second is not None and second.recording is not None and second.recording != first.recording
    assert not first.path.exists()


def _race(directory: str, start: float, out: multiprocessing.Queue[str]) -> None:
    archives._java_release = lambda: JDK  # a forked process: the fixture's patch is inherited, set again to be sure
    unlink = Path.unlink

    def slow_unlink(self: Path, missing_ok: bool = False) -> None:
        time.sleep(0.05)  # widens the gap between finding a claim void and replacing it
        unlink(self, missing_ok=missing_ok)

    Path.unlink = slow_unlink  # type: ignore[method-assign]
    time.sleep(max(0.0, start - time.time()))
    got = class_archive(Path(directory))
    out.put("none" if got is None else ("record" if got.recording else "map"))


def test_processes_starting_at_once_record_one_at_a_time(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue[str] = ctx.Queue()
    start = time.time() + 0.5
    procs = [ctx.Process(target=_race, args=(str(tmp_path), start, out)) for _ in range(6)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(30)
    results = sorted(out.get(timeout=5) for _ in procs)
    assert results == ["none"] * 5 + ["record"], results


def test_off_or_an_old_jdk_means_no_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAMINAR_SPARK_CLASS_ARCHIVE", "0")
    assert class_archive(tmp_path) is None
    monkeypatch.undo()  # the setting gone, and the real `_java_release`, reading a JDK 11's release file
    jdk = tmp_path / "jdk-11"
    (jdk / "bin").mkdir(parents=True)
    (jdk / "bin" / "java").write_text("")
    (jdk / "release").write_text('JAVA_VERSION="11.0.2"\n')
    monkeypatch.setenv("JAVA_HOME", str(jdk))
    assert class_archive(tmp_path / "archives") is None
    (jdk / "release").write_text('JAVA_VERSION="17.0.9"\n')
    assert class_archive(tmp_path / "archives") is not None


MAPS_OF_THE_JVM = """
from laminar_orchestration.dataplane.engine import build_spark_session
spark = build_spark_session("local[1]", "laminar-test-class-archive")
pid = spark._jvm.java.lang.ProcessHandle.current().pid()
print(open(f"/proc/{pid}/maps").read())
"""


@pytest.mark.spark
def test_a_driver_jvm_maps_the_archive_prepare_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()  # the machine's own JDK
    monkeypatch.setenv("LAMINAR_SPARK_CLASS_ARCHIVE_DIR", str(tmp_path))  # not the machine's: nobody else records here
    made = prepare()
    assert made is not None, "this machine's JDK could not record a class archive"
    assert made.read_bytes()[:4] == ARCHIVE_MAGIC and not list(tmp_path.glob("*.recording"))
    maps = subprocess.run(
        [sys.executable, "-c", MAPS_OF_THE_JVM], capture_output=True, text=True, timeout=300, check=True
    ).stdout
    assert str(made) in maps, "the driver JVM did not map the class archive"
