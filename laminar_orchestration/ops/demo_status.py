"""What the demo prints between its tables: a partition's status in words, a line per migration phase."""

from __future__ import annotations

import socket
import time
from collections.abc import Collection
from datetime import datetime

from laminar_orchestration.control.snapshot import PartitionSnapshot
from laminar_orchestration.control.watch import ClusterWatch
from laminar_orchestration.identity import UNASSIGNED
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.records import PartitionStatus
from laminar_orchestration.protocol.tasks import MigrationPhase, MigrationTask, phase_sequence


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
    """A line per migration phase the ledger shows, each time the demo looks (a few times a second
    while a move is in flight).

    It reads through a `ClusterWatch`: the nodes' assignments, and a partition's desired state only
    when its listed revision moved or a move of it is in flight. A phase that began and ended
    between two looks is still named, in order, on the line of the next phase seen.
    """

    #: Seconds between two looks while a move is in flight, and while none is: every look reads each
    #: node's assignment, so an idle demo's phase lines cost one read a node per 5 s (a move's first
    #: phases are then named together on its first line, up to 5 s late).
    busy_every_s = 0.25
    idle_every_s = 5.0

    def __init__(self, watch: ClusterWatch | None = None) -> None:
        self._watch = watch
        self._next_look = 0.0
        self._seen: dict[int, tuple[str, MigrationPhase]] = {}
        self._primed = False

    def watch(self, ledger: Ledger) -> ClusterWatch:
        """The `ClusterWatch` this reads through, made on first use: the demo's table shares it."""
        if self._watch is None:
            self._watch = ClusterWatch(ledger)
        return self._watch

    def due(self) -> bool:
        """Whether the next look is due (`busy_every_s` while a move is in flight, else `idle_every_s`)."""
        return time.monotonic() >= self._next_look

    def poll(self, ledger: Ledger) -> list[str]:
        """Lines for the phases reached since the previous poll (the first poll only remembers)."""
        watch = self.watch(ledger)
        changed = watch.poll()
        self._next_look = time.monotonic() + (self.busy_every_s if watch.moving() else self.idle_every_s)
        lines = []
        for p in sorted(changed if self._primed else watch.states):
            task = watch.states[p].migration
            if task is None:
                continue
            seen = self._seen.get(p)
            before = seen[1] if seen is not None and seen[0] == task.migration_id else None
            if before == task.phase:
                continue
            self._seen[p] = (task.migration_id, task.phase)
            if not self._primed:
                continue  # under way or over before the demo looked: only remembered
            phases = " → ".join(str(ph) for ph in passed_phases(task, before))
            line = f"partition {p}: {move_name(task)}: {phases}"
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
