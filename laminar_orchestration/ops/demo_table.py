"""The demo's status table: per partition the owner, epoch, status, committed offset, lag and throughput.

Printed every few seconds while the demo runs and once more at its end: a title
with the totals, a line per ownership change since the last table (with how the
epoch began: placement, migration or failover), a row per partition, the nodes'
liveness and the output table's line. The rows read what the phase lines read
(the demo's one `ClusterWatch`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from laminar_orchestration.control.snapshot import ClusterSnapshot
from laminar_orchestration.identity import UNASSIGNED, PartitionId
from laminar_orchestration.metrics import LagClock
from laminar_orchestration.ops.demo_processes import Child, Producer
from laminar_orchestration.ops.demo_status import PhaseWatch, partition_status
from laminar_orchestration.ops.demo_walkthrough import TableWatch
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.records import GrantKind

__all__ = ["StatusTable"]


@dataclass
class _Sample:
    at: float
    committed: dict[int, int]


@dataclass
class _PartitionRow:
    partition: int
    owner: int
    epoch: int
    status: str
    committed: int
    end: int
    rate: float | None
    lag_s: float = 0.0

    @property
    def lag(self) -> int:
        return max(0, self.end - self.committed)


class StatusTable:
    """The status tables of one demo run: throughput, lag in seconds and ownership changes are
    measured against the table before."""

    def __init__(self, phases: PhaseWatch) -> None:
        self._phases = phases
        self._lag_clock = LagClock()
        self._last_sample: _Sample | None = None
        self._last_owners: dict[int, tuple[int, int]] = {}
        self._last_snapshot: ClusterSnapshot | None = None

    def render(
        self,
        ledger: Ledger,
        nodes: Mapping[int, Child],
        producer: Producer | None,
        *,
        elapsed: Callable[[], str],
        kill_hint: Callable[[dict[int, int]], list[str]],
        table: TableWatch | None,
        final: bool = False,
    ) -> str:
        """The table as the ledger shows the cluster now, `nodes` the demo's node processes; after an
        ownership change (but in the final table) the `kill_hint` lines for the new owners."""
        rows = self._rows(ledger, nodes)
        changes = self._ownership_changes(ledger, rows)
        committed = sum(r.committed for r in rows)
        lag = sum(r.lag for r in rows)
        rates = [r.rate for r in rows if r.rate is not None]
        rate = f"{sum(rates):,.0f} events/s committed" if rates else "throughput from the next table on"
        produced = producer.produced if producer else 0
        clock = datetime.now().strftime("%H:%M:%S")
        title = "final status" if final else "status"
        out = [f"── {title} {clock} ({elapsed()}) · produced {produced:,} · committed {committed:,} · "
               f"lag {lag:,} · {rate} ──"]  # fmt: skip
        out.extend(changes)
        if changes and not final:
            out.extend(kill_hint({r.partition: r.owner for r in rows}))  # the last hint is stale now
        out.append(f"{'PARTITION':>9}  {'OWNER':>5}  {'EPOCH':>5}  {'STATUS':<34} {'COMMITTED':>10} {'LAG':>8} "
                   f"{'LAG S':>6} {'EVENTS/S':>9}")  # fmt: skip
        for r in rows:
            owner = str(r.owner) if r.owner != UNASSIGNED else "-"
            ev = f"{r.rate:,.1f}" if r.rate is not None else "-"
            out.append(
                f"{r.partition:>9}  {owner:>5}  {r.epoch:>5}  {r.status:<34} {r.committed:>10,} {r.lag:>8,} "
                f"{r.lag_s:>6.0f} {ev:>9}"
            )
        live = {n.node: n for n in (self._last_snapshot.nodes if self._last_snapshot else ())}
        states = []
        for n, child in sorted(nodes.items()):
            view = live.get(n)
            if not child.running():
                state = f"stopped ({child.describe_exit()})"
            elif view is None:
                state = "starting"
            elif view.alive:
                state = "alive"
            else:
                state = f"NO HEARTBEAT for {view.heartbeat_age_s:.0f}s"
            held = sum(1 for r in rows if r.owner == n and not r.status.startswith("released"))
            states.append(f"node {n} {state} ({_plural(held, 'partition')})")
        out.append("nodes: " + " · ".join(states))
        if table is not None:
            out.append(table.status_line())
        return "\n".join(out) + "\n"

    def _rows(self, ledger: Ledger, nodes: Mapping[int, Child]) -> list[_PartitionRow]:
        at = time.monotonic()
        snapshot = self._phases.watch(ledger).snapshot()  # the table reads what the phase lines read
        self._last_snapshot = snapshot
        committed = {p.partition: p.committed_offset or 0 for p in snapshot.partitions}
        prev = self._last_sample
        gone = {n for n, child in nodes.items() if not child.running()}
        rows = []
        for p in snapshot.partitions:
            rate = None
            if prev is not None and p.partition in prev.committed and at > prev.at:
                rate = (committed[p.partition] - prev.committed[p.partition]) / (at - prev.at)
            rows.append(
                _PartitionRow(
                    partition=p.partition,
                    owner=p.owner,
                    epoch=p.epoch,
                    status=partition_status(p, gone),
                    committed=committed[p.partition],
                    end=p.log_end or 0,
                    rate=rate,
                    lag_s=self._lag_clock.observe(p.partition, p.log_end or 0, committed[p.partition], at),
                )
            )
        self._last_sample = _Sample(at, committed)
        return rows

    def _ownership_changes(self, ledger: Ledger, rows: list[_PartitionRow]) -> list[str]:
        lines = []
        for r in rows:
            before = self._last_owners.get(r.partition)
            now_ = (r.owner, r.epoch)
            if before is not None and before != now_ and r.epoch > before[1]:
                grant = ledger.grant(PartitionId(r.partition), r.epoch)
                how = "migration"
                if grant is not None and grant.grant_kind == GrantKind.FENCE:
                    how = "placement" if grant.previous_owner == UNASSIGNED else "failover: fenced"
                lines.append(
                    f"  ownership: partition {r.partition} node {before[0] or '-'} -> {r.owner or '-'}, "
                    f"epoch {before[1]} -> {r.epoch} ({how})"
                )
            self._last_owners[r.partition] = now_
        return lines


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
