"""A worker node's background loops: the heartbeat (with each partition's progress), the move
reports, the guards' refresh against the ledger, the output table's catch-up and the recorded log ends."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping

import pyarrow as pa

from laminar_orchestration.dataplane.node_core import NodeCore
from laminar_orchestration.errors import CorruptDataError
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.protocol.chain import ManifestVersion
from laminar_orchestration.protocol.fencing import (
    StaleEpoch,
)
from laminar_orchestration.protocol.ledger import NodeIdentityConflict
from laminar_orchestration.protocol.records import PartitionProgress, RequestReport
from laminar_orchestration.store import StoreError

log = logging.getLogger("laminar.node")


#: How long the report of a move stays in the node's move report after the node saw it Active; a
#: driver that looks later finds it in the heartbeat.
MOVE_REPORT_LINGER_S = 10.0
#: While more than one move involves this node, how long a move report waits for the other workers'
#: changes before it is written (one write for a burst, not one per phase per partition).
MOVE_REPORT_COALESCE_S = 0.02
#: The shortest time between two heartbeats when workers report more often than the interval.
HEARTBEAT_MIN_GAP_S = 1.0


class NodeLoops(NodeCore):
    """The node's background loops, each in a thread `Node.run` starts."""

    def report_now(self) -> None:
        """A worker changed phase, ended or failed: its report goes out now, and the reconcile loop
        reaps it if it ended (no read: what the control plane asks next comes by nudge)."""
        self._moves_changed.set()
        self._report_now.set()
        self._worker_reported.set()
        self._wake.set()

    def _move_progress(self) -> dict[int, PartitionProgress]:
        """The reports on the partitions in a move this node takes part in (the move it last read)."""
        at = time.monotonic()
        with self._lock:
            for p, (_, ended) in list(self._in_flight.items()):
                if ended is not None and at - ended > MOVE_REPORT_LINGER_S:
                    del self._in_flight[p]
            in_flight = dict(self._in_flight)
        progress = self._progress()
        return {
            int(p): report
            for p, (migration_id, _) in in_flight.items()
            if (report := progress.get(int(p))) is not None and report.migration_id == migration_id
        }

    def _move_reports_loop(self) -> None:
        """Write the move report as soon as a worker reports (and look again every heartbeat interval,
        for the moves that ended): a move's driver polls this small record, not the heartbeat."""
        assert self._move_reporter is not None
        while not self._stop.is_set():
            self._moves_changed.wait(self.config.heartbeat_interval_s)
            with self._lock:
                moving = sum(1 for _, ended in self._in_flight.values() if ended is None)
            if moving > 1:
                # Several moves at once (a failover's burst): their reports go out together.
                self._stop.wait(MOVE_REPORT_COALESCE_S)
            self._moves_changed.clear()
            try:
                self._move_reporter.report(self._move_progress())
            except NodeIdentityConflict as exc:
                log.error("node %s: %s (its heartbeat stops the node)", self.id, exc)
                return
            except StoreError as exc:
                log.warning("node %s: move report failed: %s", self.id, exc)
                self._moves_changed.set()  # try again at the next look
                self._stop.wait(0.1)

    def _progress(self) -> dict[int, PartitionProgress]:
        with self._lock:
            report: dict[int, PartitionProgress] = {int(p): pr for p, pr in self._finished.items()}
            for p, f in self.standbys.items():
                report[int(p)] = PartitionProgress(
                    partition=int(p),
                    epoch=0,
                    state="standby",
                    source_offset=f.replica.source_offset,
                    lag=f.lag,
                    error=f.error,
                )
            for p, w in self.workers.items():
                report[int(p)] = w.progress()
            for p, b in self._backoff.items():
                if int(p) in report:
                    failing = {"consecutive_failures": b.failures, "last_failure": b.reason, "retry_delay_s": b.delay_s}
                    report[int(p)] = report[int(p)].model_copy(update=failing)
        return report

    def _requests_report(self) -> RequestReport:
        """The store requests this process sent since the previous report (and in all)."""
        current = self._meter.snapshot()
        previous, self._last_requests = self._last_requests, current
        return RequestReport(
            total=dict(current.by_method),
            per_s={m: round(r, 3) for m, r in current.rates_since(previous).items()},
            top_families=current.family_rates_since(previous),
            interval_s=round(current.at - previous.at, 3),
        )

    def _heartbeat_loop(self) -> None:
        assert self.handle is not None
        while not self._stop.is_set():
            # The interval counts from the start of a write: a slow store must not space beats by
            # interval + write time, which against a short timeout makes a live node look dead.
            started = time.monotonic()
            try:
                self.handle.heartbeat(partitions=self._progress(), requests=self._requests_report())
            except NodeIdentityConflict as exc:
                log.error("node %s: %s; fencing every partition and stopping", self.id, exc)
                for w in list(self.workers.values()):
                    w.tracker.fence(str(exc))
                self.stop()
                return
            except StoreError as exc:
                log.warning("node %s: heartbeat failed: %s", self.id, exc)
            except Exception:
                # The heartbeat is what keeps this node alive in the ledger: it never dies of one bad report.
                log.exception("node %s: heartbeat failed unexpectedly", self.id)
            written = time.monotonic()
            reported = self._report_now.wait(max(0.0, started + self.config.heartbeat_interval_s - written))
            if reported and not any(w.finished for w in list(self.workers.values())):
                # A worker's report: sooner than the interval, but a node moving many partitions at once
                # does not rewrite its whole record per phase (the drivers read the move report). A
                # worker that failed or was revoked is reported at once.
                gap = min(HEARTBEAT_MIN_GAP_S, self.config.heartbeat_interval_s)
                self._stop.wait(max(0.0, written + gap - time.monotonic()))
            self._report_now.clear()

    def _refresh_loop(self) -> None:
        """The cluster epoch every `refresh_interval_s`; every guard once per full pass. A fence
        reaches this node sooner through its assignment (`_check_revoked`), and a committing
        partition looks for a successor's grant itself: this pass is the repair path."""
        next_guard_pass = time.monotonic() + self.config.full_reconcile_interval_s
        while not self._stop.wait(self.config.refresh_interval_s):
            if time.monotonic() >= next_guard_pass:
                next_guard_pass = time.monotonic() + self.config.full_reconcile_interval_s
                self.refresh_guards()
            try:
                self.observe_cluster_epoch(self.ledger.members.record().cluster_epoch)
            except StoreError as exc:
                log.warning("node %s: cluster epoch refresh failed: %s", self.id, exc)

    def note_committed(self, version: ManifestVersion, outputs: Mapping[str, pa.Table]) -> None:
        """A worker committed a batch: the output table's next sync takes it from memory."""
        if self.table_feed is not None:
            self.table_feed.committed(version, outputs)

    def _table_loop(self) -> None:
        """One output-table sync per `table_sync_interval_s` for the partitions that committed."""
        assert self.table_feed is not None
        # Nodes started together would commit to the table together, and all but one retry: spread them.
        if self._stop.wait(self.config.table_sync_interval_s * random.random()):
            return
        while not self._stop.wait(self.config.table_sync_interval_s):
            self.table_feed.note(self.workers)
            self.table_feed.flush(self.id)

    def _log_ends_loop(self) -> None:
        """Read the log ends producers record (one GET) and hand each worker its partition's: at
        once, then every `log_ends_poll_s`."""
        while not self._stop.is_set():
            read_at = time.monotonic()
            try:
                # None: no producer appended yet (every append records its end), so every log is empty.
                ends = self.source.log_ends() or {}
            except (StoreError, CorruptDataError) as exc:
                log.warning("node %s: could not read the log ends (its partitions poll their logs): %s", self.id, exc)
            else:
                self._log_ends, self._log_ends_at = ends, read_at
                for p, worker in list(self.workers.items()):
                    worker.source_advanced(ends.get(int(p), 0), from_log_ends=True, read_at=read_at)
            self._stop.wait(self.config.log_ends_poll_s)

    def observe_cluster_epoch(self, epoch: int) -> None:
        """Slide the acceptance window to a newer cluster epoch (waits for commits in flight)."""
        if epoch > self.cluster_epoch:
            with self.epoch_window.fence(epoch):
                self.cluster_epoch = epoch

    def refresh_guards(self, partitions: set[PartitionId] | None = None) -> list[PartitionId]:
        """The kill-switch check of `partitions`' guards (default: all): fence the tracker of every
        revoked partition."""
        try:
            revoked = self.guards.refresh_all(self.ledger, partitions)
        except StoreError as exc:
            log.warning("node %s: guard refresh failed: %s", self.id, exc)
            return []
        for p in revoked:
            worker = self.workers.get(p)
            guard = self.guards.get(p)
            # Only the guard the refresh judged carries the newer epoch; a successor guard
            # installed meanwhile (a new epoch for this node) is not revoked.
            if worker is not None and guard is not None and guard.cached_current_epoch > guard.epoch:
                worker.tracker.fence(str(StaleEpoch(p, guard.epoch, guard.cached_current_epoch)))
                worker.abandon_batch()
        return revoked
