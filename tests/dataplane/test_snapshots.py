"""When a partition worker snapshots its local store (`SnapshotSchedule`): once enough deltas follow the
last snapshot, or they weigh enough next to it, or enough time passed; uploaded off the batch's path,
and once ready, named by the next manifest in place of the deltas it covers.

The host's snapshot pool is a real thread pool; the upload and the local copy are stand-ins that
record what the schedule asks of them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from threading import Event
from typing import Any, cast

import pytest

from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.dataplane.errors import Fenced, SnapshotCancelled
from laminar_orchestration.dataplane.host import WorkerHost
from laminar_orchestration.dataplane.restore import StateReplica
from laminar_orchestration.dataplane.snapshots import SnapshotSchedule
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.fencing import PartitionGuard
from laminar_orchestration.protocol.manifest import (
    ArtifactRef,
    DeltaRef,
    PartitionManifest,
    SnapshotFile,
    SnapshotRef,
)

#: What the schedule passes on to the upload; it never looks inside.
GUARD = cast(PartitionGuard, object())
#: The files of a partition's snapshot lineage, by name.
Known = Mapping[str, SnapshotFile]


def _ref(key: str, size: int) -> ArtifactRef:
    return ArtifactRef(key=key, size=size, sha256="0" * 64)


def _delta(start: int, end: int, size: int = 10) -> DeltaRef:
    return DeltaRef(ref=_ref(f"checkpoints/00000/d-{start}", size), start_offset=start, end_offset=end, rows=1)


def _snapshot(offset: int, size: int = 100) -> SnapshotRef:
    return SnapshotRef(source_offset=offset, files=[SnapshotFile(name="000001.sst", ref=_ref(f"s-{offset}", size))])


@dataclass
class Published:
    """The part of a manifest the schedule reads: its checkpoint."""

    snapshot: SnapshotRef | None
    deltas: list[DeltaRef]


def _manifest(snapshot: SnapshotRef | None, deltas: Sequence[DeltaRef]) -> PartitionManifest:
    return cast(PartitionManifest, Published(snapshot, list(deltas)))


class Uploads:
    """Snapshot uploads that wait until `release` (or their cancel), then fail with `error` if it is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.error: Exception | None = None
        self.started: list[tuple[list[Path], int, dict[str, SnapshotFile]]] = []
        self.cancels: list[threading.Event] = []

    def upload_snapshot(self, _: object, files: Iterable[Path], at: int, known: Known, cancel: Event) -> SnapshotRef:
        """`CheckpointStore.upload_snapshot`'s part: the snapshot of `files` (at offset `at`) once released."""
        self.started.append((list(files), at, dict(known)))
        self.cancels.append(cancel)
        while not self.release.wait(0.01):
            if cancel.is_set():
                raise SnapshotCancelled(0)
        if self.error is not None:
            raise self.error
        return _snapshot(at)


@dataclass
class LocalCopy:
    """A partition's local store as the schedule sees it: a consistent copy of its files on demand."""

    root: Path
    source_offset: int = 0
    lineage_files: dict[str, SnapshotFile] = field(default_factory=dict)
    adopted: list[SnapshotRef] = field(default_factory=list)
    copies: list[Path] = field(default_factory=list)

    def snapshot_files(self) -> tuple[list[Path], int, Path]:
        copy = self.root / f"snap-{len(self.copies)}"
        copy.mkdir(parents=True)
        (copy / "000001.sst").write_bytes(b"sst")
        self.copies.append(copy)
        return [copy / "000001.sst"], self.source_offset, copy

    def adopt_snapshot(self, snapshot: SnapshotRef) -> None:
        self.adopted.append(snapshot)


@dataclass
class Host:
    """What the schedule uses of the node: its config, its snapshot pool and the checkpoint uploads."""

    config: NodeConfig
    snapshot_pool: ThreadPoolExecutor
    checkpoints: Uploads
    id: NodeId = field(default_factory=lambda: NodeId(1))


@dataclass
class Scheduled:
    schedule: SnapshotSchedule
    uploads: Uploads
    copy: LocalCopy


MakeSchedule = Callable[..., Scheduled]


@pytest.fixture
def make(tmp_path: Path) -> Iterator[MakeSchedule]:
    """Schedules of partition 0 on one snapshot pool, with checkpoint settings that override the test's."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="snapshots")
    made: list[Scheduled] = []

    def schedule(**settings: Any) -> Scheduled:
        checkpoints = {
            "checkpoint_every_batches": 3,
            "checkpoint_delta_fraction": 0.25,
            "checkpoint_min_delta_bytes": 1000,
            "checkpoint_every_s": 3600.0,
        }
        config = NodeConfig(store_url="file:///unused", node_id=1, **{**checkpoints, **settings})
        uploads, copy = Uploads(), LocalCopy(tmp_path / f"copy-{len(made)}")
        host = Host(config, pool, uploads)
        made.append(
            Scheduled(SnapshotSchedule(cast(WorkerHost, host), PartitionId(0), cast(StateReplica, copy)), uploads, copy)
        )
        return made[-1]

    yield schedule
    for scheduled in made:  # an upload a test left waiting ends, so the pool can stop
        scheduled.uploads.release.set()
    pool.shutdown(wait=True)


def _until_uploaded(schedule: SnapshotSchedule) -> None:
    deadline = time.monotonic() + 10
    while not schedule.uploaded:
        assert time.monotonic() < deadline, "the upload never finished"
        time.sleep(0.005)


def _uploaded_snapshot(s: Scheduled, deltas: Sequence[DeltaRef]) -> SnapshotRef:
    """Commit `deltas`, let the snapshot they make due upload, and collect it: the ready snapshot."""
    s.copy.source_offset = deltas[-1].end_offset
    s.schedule.committed(_manifest(None, deltas))
    s.schedule.step(GUARD, idle=False)
    s.uploads.release.set()
    _until_uploaded(s.schedule)
    s.schedule.step(GUARD, idle=False)
    assert s.schedule.ready is not None
    return s.schedule.ready


def test_a_snapshot_is_due_once_enough_deltas_follow_the_last_one(make: MakeSchedule) -> None:
    s = make()
    s.schedule.committed(_manifest(None, [_delta(0, 10), _delta(10, 20)]))
    assert s.schedule.step(GUARD, idle=False) is False
    assert s.uploads.started == [] and s.schedule.settled
    s.schedule.committed(_manifest(None, [_delta(0, 10), _delta(10, 20), _delta(20, 30)]))
    s.schedule.step(None, idle=False)  # a worker holding no guard takes no snapshot
    assert s.uploads.started == []
    s.schedule.step(GUARD, idle=False)
    assert len(s.uploads.started) == 1 and not s.schedule.settled


@pytest.mark.parametrize(
    ("snapshot_size", "delta_sizes", "due"),
    [
        (8000, [1999], False),  # a quarter of the snapshot is 2000 bytes
        (8000, [1000, 1000], True),
        (2000, [999], False),  # a quarter is 500, but never below 1000 bytes
        (2000, [1000], True),
    ],
)
def test_a_snapshot_is_due_once_the_deltas_weigh_enough_next_to_it(
    make: MakeSchedule, snapshot_size: int, delta_sizes: list[int], due: bool
) -> None:
    s = make()
    deltas = [_delta(100 + i, 101 + i, size) for i, size in enumerate(delta_sizes)]
    s.schedule.committed(_manifest(_snapshot(100, snapshot_size), deltas))
    s.schedule.step(GUARD, idle=False)
    assert bool(s.uploads.started) is due


def test_a_snapshot_is_due_after_its_interval_only_with_a_delta_to_cover(make: MakeSchedule) -> None:
    s = make(checkpoint_every_s=0.05)
    s.schedule.committed(_manifest(_snapshot(10), []))
    time.sleep(0.06)
    s.schedule.step(GUARD, idle=True)
    assert s.uploads.started == []  # nothing since the snapshot: nothing to cover
    s.schedule.committed(_manifest(_snapshot(10), [_delta(10, 11)]))
    s.schedule.step(GUARD, idle=False)
    assert len(s.uploads.started) == 1


def test_the_upload_runs_off_the_batch_path_and_its_snapshot_replaces_the_deltas_it_covers(make: MakeSchedule) -> None:
    s = make()
    deltas = [_delta(0, 10), _delta(10, 20), _delta(20, 30)]
    s.copy.source_offset = 30
    s.schedule.committed(_manifest(None, deltas))
    s.schedule.step(GUARD, idle=False)  # returns while the upload waits: it runs on the pool
    assert len(s.uploads.started) == 1 and not s.schedule.uploaded
    s.schedule.committed(_manifest(None, [*deltas, _delta(30, 40)]))
    s.schedule.step(GUARD, idle=False)
    assert len(s.uploads.started) == 1  # one snapshot at a time
    s.uploads.release.set()
    _until_uploaded(s.schedule)

    assert s.schedule.step(GUARD, idle=False) is False  # a batch's commit will name it soon
    ready = s.schedule.ready
    assert ready is not None and ready.source_offset == 30
    assert not s.copy.copies[0].exists()  # the local copy it was read from is gone
    new = _delta(40, 50)
    assert s.schedule.next_checkpoint(new) == (ready, [_delta(30, 40), new])
    assert s.schedule.step(GUARD, idle=True) is True  # idle: publish it now

    s.schedule.committed(_manifest(None, [*deltas, _delta(30, 40), new]))  # a manifest not naming it
    assert s.schedule.ready == ready and s.copy.adopted == []
    s.schedule.committed(_manifest(ready, [new]))
    assert s.copy.adopted == [ready] and s.schedule.ready is None and s.schedule.settled
    assert (s.schedule.snapshot, s.schedule.deltas) == (ready, [new])


def test_a_failed_upload_is_logged_and_the_deltas_stay_the_checkpoint(
    make: MakeSchedule, caplog: pytest.LogCaptureFixture
) -> None:
    s = make()
    s.uploads.error = ConnectionResetError("the store hung up")
    deltas = [_delta(0, 10), _delta(10, 20), _delta(20, 30)]
    s.schedule.committed(_manifest(None, deltas))
    s.schedule.step(GUARD, idle=False)
    s.uploads.release.set()
    _until_uploaded(s.schedule)
    with caplog.at_level(logging.WARNING, logger="laminar.node"):
        assert s.schedule.step(None, idle=True) is False
    assert "snapshot upload failed: the store hung up" in caplog.text
    assert s.schedule.ready is None and s.schedule.settled
    assert s.schedule.next_checkpoint() == (None, deltas)
    assert not s.copy.copies[0].exists()


def test_a_fence_met_by_the_upload_ends_the_worker(make: MakeSchedule) -> None:
    s = make()
    s.uploads.error = Fenced("stale epoch 3 (current 4)")
    s.schedule.committed(_manifest(None, [_delta(0, 10), _delta(10, 20), _delta(20, 30)]))
    s.schedule.step(GUARD, idle=False)
    s.uploads.release.set()
    _until_uploaded(s.schedule)
    with pytest.raises(Fenced):
        s.schedule.step(GUARD, idle=False)


def test_abandon_stops_the_upload_and_removes_its_copy(make: MakeSchedule) -> None:
    s = make()
    s.schedule.committed(_manifest(None, [_delta(0, 10), _delta(10, 20), _delta(20, 30)]))
    s.schedule.step(GUARD, idle=False)
    s.schedule.abandon()  # the partition moves: the upload stops without its release
    assert s.uploads.cancels[0].is_set() and s.schedule.settled
    assert not s.copy.copies[0].exists()


def test_a_ready_snapshot_outlives_abandon_but_not_a_restore(make: MakeSchedule) -> None:
    s = make()
    ready = _uploaded_snapshot(s, [_delta(0, 10), _delta(10, 20), _delta(20, 30)])
    s.schedule.abandon()
    assert s.schedule.ready == ready
    restored_to = _manifest(_snapshot(50), [_delta(50, 60)])
    s.schedule.restored(restored_to)
    assert s.schedule.ready is None
    assert s.schedule.next_checkpoint() == (_snapshot(50), [_delta(50, 60)])
    s.schedule.restored(None)  # an empty partition: nothing committed yet
    assert s.schedule.next_checkpoint() == (None, [])


def test_the_next_snapshot_names_the_files_its_lineage_already_holds(make: MakeSchedule) -> None:
    s = make()
    known = _snapshot(0).files[0]
    s.copy.lineage_files = {known.name: known}
    _uploaded_snapshot(s, [_delta(0, 10), _delta(10, 20), _delta(20, 30)])
    [(files, offset, lineage)] = s.uploads.started
    assert ([f.name for f in files], offset, lineage) == (["000001.sst"], 30, {known.name: known})
