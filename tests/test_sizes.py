"""Byte counts read the same wherever they are shown: a move's phase detail and its Dagster metadata."""

from __future__ import annotations

from laminar_orchestration.control.phase_waits import phase_detail
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.tasks import MigrationPhase, MigrationTask
from laminar_orchestration.sizes import human_size


def test_sizes_read_as_a_person_reads_them() -> None:
    sizes = (0, 1023, 1024, 1_258_291, 5 * 1024**3, 3 * 1024**4)
    assert [human_size(n) for n in sizes] == ["0 B", "1023 B", "1.0 KiB", "1.2 MiB", "5.0 GiB", "3.0 TiB"]


def test_a_phase_detail_names_the_bytes_moved_as_the_metadata_does() -> None:
    task = MigrationTask.model_construct(
        partition=PartitionId(0), from_node=NodeId(1), to_node=NodeId(2), from_epoch=3, to_epoch=4
    )
    detail = phase_detail(task, MigrationPhase.UPLOADING, 1, 3 * 1024**4, 10)
    assert human_size(3 * 1024**4) in detail
