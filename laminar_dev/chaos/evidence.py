"""What the chaos suite counts: audits of the store before and after a scenario, and node-log evidence.

Stale writes are counted from evidence, never assumed: objects written under an
epoch after the manifest chain was fenced above it (the history audit finds
them; rejected = no manifest names them), and manifest publishes rejected by
fencing (node logs: "REVOKED ... stale fencing token").
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from laminar_orchestration.dataplane.restore import committed_state
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.ops.verify import AuditIssue, audit_history, audit_store
from laminar_orchestration.protocol.desired_states import DesiredStates
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.store import ObjectStore

from .results import ScenarioResult

P = PartitionId


@dataclass(frozen=True)
class Measure:
    """Cumulative audit figures of one store at one moment."""

    produced: int = 0
    committed: int = 0
    epochs: int = 0
    duplicates: int = 0
    losses: int = 0
    stale_writes: int = 0
    stale_rejected: int = 0
    max_owners: int = 0
    double_grants: int = 0
    #: Migration records not in a terminal phase (at this moment, not cumulative).
    wedged: int = 0
    issues: tuple[str, ...] = ()


def issue_text(issue: AuditIssue) -> str:
    where = f" [{issue.start_offset}, {issue.end_offset})" if issue.start_offset is not None else ""
    return f"p{issue.partition} {issue.kind}{where}: {issue.detail}"


def expected_counts(tables: Iterable[pa.Table]) -> dict[str, int]:
    """Events produced per key, computed from the produced tables alone."""
    counts: dict[str, int] = {}
    for table in tables:
        for key in table["key"].to_pylist():
            counts[key] = counts.get(key, 0) + 1
    return counts


def measure(store: ObjectStore, expected: Mapping[str, int] | None = None) -> Measure:
    """Run every audit on `store`: exactly-once, the epoch history, and (with `expected`) per-key counts.

    `expected` (events produced per key) must only be given once everything
    produced is committed: then each key's committed count must equal it, an
    independent check of the library's own audit. Duplicates and losses are
    the larger of the two measures.
    """
    audits = audit_store(store)
    history = audit_history(store)
    issues: dict[str, None] = {}  # an ordered set: the two audits both report ledger issues
    for a in audits:
        issues.update((issue_text(i), None) for i in a.issues)
    for h in history:
        issues.update((issue_text(i), None) for i in h.issues)
    duplicates = sum(a.duplicates for a in audits)
    losses = sum(a.losses for a in audits)
    wedged = 0
    for p, state in DesiredStates(Ledger(store)).all().items():
        task = state.migration
        if task is not None and not task.is_terminal:
            wedged += 1
            issues[f"p{p} wedged: migration {task.migration_id} left in phase {task.phase}"] = None
    if expected is not None:
        committed: dict[str, int] = {}
        for a in audits:
            state, _ = committed_state(store, P(a.partition))
            committed.update(zip(state["key"].to_pylist(), state["count"].to_pylist(), strict=True))
        excess = deficit = 0
        for key in sorted(set(committed) | set(expected)):
            diff = committed.get(key, 0) - expected.get(key, 0)
            if diff:
                text = (
                    f"independent check: key {key!r} committed {committed.get(key, 0)}, produced {expected.get(key, 0)}"
                )
                issues[text] = None
            excess += max(diff, 0)
            deficit += max(-diff, 0)
        duplicates, losses = max(duplicates, excess), max(losses, deficit)
    return Measure(
        produced=sum(a.events_in_source for a in audits),
        committed=sum(a.committed_offset for a in audits),
        epochs=sum(h.epochs_granted for h in history),
        duplicates=duplicates,
        losses=losses,
        stale_writes=sum(h.stale_writes for h in history),
        stale_rejected=sum(h.stale_writes_rejected for h in history),
        max_owners=max((h.max_owners_per_epoch for h in history), default=0),
        double_grants=sum(h.double_grants for h in history),
        wedged=wedged,
        issues=tuple(issues),
    )


def apply_difference(result: ScenarioResult, before: Measure, after: Measure) -> None:
    """Fill `result` with the difference the scenario made between two measures."""
    result.events_produced = after.produced - before.produced
    result.events_committed = after.committed - before.committed
    result.duplicates = max(0, after.duplicates - before.duplicates)
    result.losses = max(0, after.losses - before.losses)
    result.stale_writes_attempted += after.stale_writes - before.stale_writes
    result.stale_writes_rejected += after.stale_rejected - before.stale_rejected
    result.epochs_granted = after.epochs - before.epochs
    result.max_owners_per_epoch = after.max_owners
    result.double_grants = max(0, after.double_grants - before.double_grants)
    result.wedged_migrations = after.wedged
    seen = set(before.issues)
    result.issues.extend(i for i in after.issues if i not in seen)


# --- node logs -------------------------------------------------------------------------

#: dataplane.worker.PartitionWorker._revoked: "node N: partition P REVOKED at epoch E: <reason>; local state discarded".
REVOKED_RE = re.compile(r"node (\d+): partition (\d+) REVOKED at epoch (\d+): (.*); local state discarded")
#: Reasons that mean a manifest publish reached the store's fencing and was rejected there.
_PUBLISH_REJECTED = ("stale fencing token", "conditional PUT failed")


@dataclass(frozen=True)
class LogCounts:
    """Revocations found in node logs, and how many of them were a rejected manifest publish."""

    revoked: int = 0
    rejected_publishes: int = 0

    def __sub__(self, other: LogCounts) -> LogCounts:
        return LogCounts(self.revoked - other.revoked, self.rejected_publishes - other.rejected_publishes)


def count_revocations(lines: Iterable[str]) -> LogCounts:
    """Count "REVOKED" lines; those whose reason is a fencing rejection of a publish are stale writes."""
    revoked = rejected = 0
    for line in lines:
        m = REVOKED_RE.search(line)
        if m is None:
            continue
        revoked += 1
        if any(r in m.group(4) for r in _PUBLISH_REJECTED):
            rejected += 1
    return LogCounts(revoked, rejected)


class LogCounter(logging.Handler):
    """Counts the REVOKED records of in-process nodes (and keeps their log in a file)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self._lock_lines = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "REVOKED" in message:
            with self._lock_lines:
                self.lines.append(message)

    def counts(self) -> LogCounts:
        with self._lock_lines:
            return count_revocations(list(self.lines))

    @contextlib.contextmanager
    def attached(self, log_file: Path) -> Iterator[None]:
        """Route the node loggers here and to `log_file` (not to stderr) while inside."""
        logger = logging.getLogger("laminar")
        file_handler = logging.FileHandler(log_file)
        file_handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(levelname)s %(message)s"))
        saved = (logger.level, logger.propagate)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        logger.addHandler(self)
        logger.addHandler(file_handler)
        try:
            yield
        finally:
            logger.removeHandler(self)
            logger.removeHandler(file_handler)
            file_handler.close()
            logger.setLevel(saved[0])
            logger.propagate = saved[1]
