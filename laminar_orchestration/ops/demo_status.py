"""What the demo prints between its tables: a partition's status in words, a line per migration phase."""

from __future__ import annotations

import socket
from collections.abc import Collection
from datetime import datetime

from laminar_orchestration.control.snapshot import PartitionSnapshot
from laminar_orchestration.identity import UNASSIGNED
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.records import PartitionStatus
from laminar_orchestration.protocol.tasks import DesiredStates, MigrationPhase, MigrationTask, phase_sequence


def move_name(task: MigrationTask) -> str:
    """``graceful 1→2``, ``forced 2→3``, or ``placement on 1`` (a partition nobody owned)."""
    if task.from_node == UNASSIGNED:
        return f"placement on {task.to_node}"
    return f"{task.migration_kind} {task.from_node}→{task.to_node}"


def partition_status(p: PartitionSnapshot, gone: Collection[int]) -> str:
    """The partition's status for the table, true at this moment.

    `gone` are the nodes whose process the demo saw exit: their partitions are
    "owner dead" at once, not only once the heartbeat timeout says so. A
    partition its owner released (a clean stop) is released, not waiting for a
    failover.
    """
    task = p.migration
    if task is not None:
        return f"{move_name(task)} ({task.phase})"
    if p.owner == UNASSIGNED:
        return "unassigned"
    if p.status == PartitionStatus.RELEASED:
        return f"released by node {p.owner}"
    if not p.owner_alive or p.owner in gone:
        return "owner dead: failover pending"
    return p.status


def passed_phases(task: MigrationTask, before: MigrationPhase | None) -> list[MigrationPhase]:
    """The phases `task` went through since `before` (None: since it began), in order, ending at its phase."""
    sequence = phase_sequence(task.migration_kind)
    if task.phase not in sequence:  # failed or cancelled: off the sequence
        return [task.phase]
    end = sequence.index(task.phase)
    start = 0 if before is None or before not in sequence else sequence.index(before) + 1
    return list(sequence[start : end + 1])


class PhaseWatch:
    """A line per migration phase the ledger shows, each time the demo looks (a few times a second).

    A phase that began and ended between two looks is still named, in order,
    on the line of the next phase seen.
    """

    def __init__(self) -> None:
        self._seen: dict[int, tuple[str, MigrationPhase]] = {}
        self._primed = False

    def poll(self, ledger: Ledger) -> list[str]:
        """Lines for the phases reached since the previous poll (the first poll only remembers)."""
        lines = []
        for p, state in sorted(DesiredStates(ledger).all().items()):
            task = state.migration
            if task is None:
                continue
            seen = self._seen.get(int(p))
            before = seen[1] if seen is not None and seen[0] == task.migration_id else None
            if before == task.phase:
                continue
            self._seen[int(p)] = (task.migration_id, task.phase)
            if not self._primed:
                continue  # under way or over before the demo looked: only remembered
            phases = " → ".join(str(ph) for ph in passed_phases(task, before))
            line = f"partition {int(p)}: {move_name(task)}: {phases}"
            if task.is_terminal:
                line += f" in {_seconds(task.started_at, task.completed_at or task.updated_at)}"
                if task.error:
                    line += f" ({task.error})"
            lines.append(line)
        self._primed = True
        return lines


def _seconds(start: datetime, end: datetime) -> str:
    return f"{(end - start).total_seconds():.1f}s"


def port_or_free(preferred: int, host: str = "127.0.0.1") -> int:
    """`preferred` if nothing listens there, else a free port."""
    for port in (preferred, 0):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise OSError(f"no free port on {host}")
