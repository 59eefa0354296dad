"""`laminar chaos`: the chaos suite. Faults on purpose, then an audit of every promise.

Scenarios run on one local cluster (3 node processes, 4 partitions, loopback
only) that is started once, because a node's Spark start-up costs ~20 s:

* ``store-faults`` - in-process nodes (the real runtime with a pyarrow fold
  instead of Spark), the coordinator, a producer and a deliberately stale
  writer, all through `FaultInjectingStore` -> `RetryingStore` (5xx and
  throttling bursts, added latency, responses lost after an applied write), on
  the local store and on a real S3 protocol server (moto, started here on
  loopback). Runs while the node processes boot.
* ``kill9-mid-batch`` - SIGKILL a node while Spark is running one of its
  batches (seen by the batch's staging directory), then a forced failover.
* ``zombie`` - SIGSTOP a node mid-batch past its heartbeat timeout, fail it
  over, SIGCONT it: it must not commit anything for what it lost.
* ``kill9-mid-release`` - a graceful migration whose old owner is SIGKILLed
  as soon as the recorded phase becomes Uploading/Released; then the forced path.
* ``orchestrator-killed`` - ``laminar migrate`` as a subprocess, SIGKILLed
  mid-migration, then resumed from the recorded phase.
* ``migrations-rebalance`` - concurrent migrations and weighted rebalances
  (cluster epoch bumped) while load runs.
* ``rolling-restart`` - SIGTERM, restart and take back, node after node.

After each scenario, with everything produced committed, `verify.audit_store`
(exactly-once of output and state), `verify.audit_history` (the immutable
epoch history cross-checked against every manifest and fenced object) and an
independent per-key count against what was produced are run. Each row reports
the scenario's own figures (differences of cumulative audits): events produced
and committed, duplicates and losses (must be 0), stale writes attempted and
rejected, stale writes accepted after the fence (must be 0), revocations,
epochs granted, double grants (epochs acted on by two nodes; must be 0), the
most owners seen in any epoch (must be 1), and wedged migrations (migration
records left non-terminal at the end; must be 0).

Stale writes are counted from evidence, never assumed: objects written under an
epoch after the manifest chain was fenced above it (the audit finds them;
rejected = no manifest names them), manifest publishes rejected by fencing (node logs:
"REVOKED ... stale fencing token"), and the deterministic stale writer of
``store-faults`` (publish and release with a superseded token).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq

from .assignment import (
    Move,
    MoveOutcome,
    drive,
    failover_target,
    live_node_ids,
    node_loads,
    ownership_map,
    plan_assignment,
    prepare_failover,
    record_failure,
    run_migration,
    run_moves,
    warm_copies,
)
from .capabilities import CheckpointWriter, OutputCommitter
from .checkpoint import CheckpointStore, OutputWriter
from .fencing import EpochError, PartitionGuard
from .identity import NodeId, PartitionId
from .ledger import Ledger
from .localcluster import Cluster, NodeProcess, wait_until
from .manifest import ManifestPublisher, ManifestReader, ManifestUpdate
from .migration import (
    DesiredStates,
    MigrationConfig,
    MigrationCoordinator,
    MigrationError,
    MigrationKind,
    MigrationPhase,
    MigrationTask,
    phase_sequence,
)
from .processing import empty_state, keyed_aggregation
from .records import PartitionStatus
from .replica import committed_state
from .runtime import Node, NodeConfig, PartitionWorker, WorkerState
from .source import SourceLog, generate_events
from .store import LocalObjectStore, ObjectStore, StoreError
from .store.faults import FaultInjectingStore
from .store.retry import RetryingStore, RetryPolicy
from .verify import AuditIssue, audit_history, audit_store

__all__ = [
    "PROFILES",
    "SCENARIOS",
    "ArrowBatchEngine",
    "ArrowNode",
    "LogCounts",
    "Measure",
    "Profile",
    "ScenarioResult",
    "count_revocations",
    "format_table",
    "measure",
    "moto_server",
    "report_json",
    "run_chaos",
    "run_store_faults",
]

T = TypeVar("T")
P, N = PartitionId, NodeId

NODE_IDS = (1, 2, 3)
PARTITIONS = 4
KEYS = 40

#: Every scenario, in the order they run (node availability is planned for this order).
SCENARIOS: tuple[str, ...] = (
    "store-faults",
    "kill9-mid-batch",
    "zombie",
    "kill9-mid-release",
    "orchestrator-killed",
    "migrations-rebalance",
    "rolling-restart",
)


@dataclass(frozen=True)
class Profile:
    """How much each scenario does."""

    name: str
    #: Events of the big batch a node is killed or paused in the middle of.
    batch_events: int
    #: Background load: events per chunk, and the pause between chunks.
    load_events: int
    load_interval_s: float
    #: Repetitions of the kill, zombie and orchestrator scenarios.
    repetitions: int
    rebalance_rounds: int
    #: How many nodes the rolling restart restarts.
    rolling_nodes: int
    #: store-faults: events produced through the faulty store, rounds of migrations, fault rate.
    fault_events: int
    fault_rounds: int
    fault_rate: float
    #: The whole run: scenarios that would start after it are skipped.
    budget_s: float
    #: After each scenario: how long everything produced may take to be committed.
    commit_timeout_s: float


PROFILES: dict[str, Profile] = {
    "short": Profile(
        name="short",
        batch_events=160_000,
        load_events=12_000,
        load_interval_s=0.5,
        repetitions=1,
        rebalance_rounds=1,
        rolling_nodes=1,
        fault_events=24_000,
        fault_rounds=2,
        fault_rate=0.03,
        budget_s=480.0,
        commit_timeout_s=90.0,
    ),
    "long": Profile(
        name="long",
        batch_events=400_000,
        load_events=40_000,
        load_interval_s=0.3,
        repetitions=2,
        rebalance_rounds=3,
        rolling_nodes=3,
        fault_events=120_000,
        fault_rounds=4,
        fault_rate=0.05,
        budget_s=1500.0,
        commit_timeout_s=180.0,
    ),
}

#: Coordinator limits for the chaos runs: generous, the machine is busy with Spark.
MIGRATION_CONFIG = MigrationConfig(
    migration_timeout_s=90.0, release_wait_timeout_s=30.0, checkpoint_transfer_timeout_s=90.0
)


# --- results --------------------------------------------------------------------------


@dataclass
class ScenarioResult:
    """The figures of one scenario (its own: differences of the audits before and after it)."""

    name: str
    backend: str
    events_produced: int = 0
    events_committed: int = 0
    duplicates: int = 0
    losses: int = 0
    stale_writes_attempted: int = 0
    stale_writes_rejected: int = 0
    #: Partitions a fenced node's kill-switch revoked (node logs "REVOKED").
    revoked: int = 0
    epochs_granted: int = 0
    #: Epochs acted on by more than one node.
    double_grants: int = 0
    max_owners_per_epoch: int = 0
    #: Migration records left non-terminal (neither active, failed nor cancelled) at the end.
    wedged_migrations: int = 0
    duration_s: float = 0.0
    #: Whether the scenario creates a zombie whose stale writes are attempted deterministically.
    deterministic_stale_writes: bool = False
    issues: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    skipped: str | None = None

    @property
    def ok(self) -> bool:
        """Ran, and every promise held."""
        return (
            self.skipped is None
            and self.error is None
            and not self.issues
            and self.duplicates == 0
            and self.losses == 0
            and self.max_owners_per_epoch <= 1
            and self.double_grants == 0
            and self.wedged_migrations == 0
            and self.stale_writes_accepted == 0
        )

    @property
    def stale_writes_accepted(self) -> int:
        """Stale writes that became visible after the fence: must be 0."""
        return self.stale_writes_attempted - self.stale_writes_rejected

    @property
    def verdict(self) -> str:
        if self.skipped is not None:
            return "skipped"
        return "ok" if self.ok else "FAILED"

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "stale_writes_accepted": self.stale_writes_accepted,
            "ok": self.ok,
            "verdict": self.verdict,
            "duration_s": round(self.duration_s, 3),
        }


_COLUMNS = (
    ("scenario", "<"),
    ("backend", "<"),
    ("produced", ">"),
    ("committed", ">"),
    ("dup", ">"),
    ("loss", ">"),
    ("stale att/rej", ">"),
    ("stale acc", ">"),
    ("revoked", ">"),
    ("epochs", ">"),
    ("dbl grant", ">"),
    ("max own", ">"),
    ("wedged", ">"),
    ("time", ">"),
    ("verdict", "<"),
)


def format_table(results: Sequence[ScenarioResult], *, title: str = "", notes: bool = True) -> str:
    """A fixed-width table, one row per scenario, then each scenario's notes, issues and error."""
    rows = [
        [
            r.name,
            r.backend,
            str(r.events_produced),
            str(r.events_committed),
            str(r.duplicates),
            str(r.losses),
            f"{r.stale_writes_attempted}/{r.stale_writes_rejected}",
            str(r.stale_writes_accepted),
            str(r.revoked),
            str(r.epochs_granted),
            str(r.double_grants),
            str(r.max_owners_per_epoch),
            str(r.wedged_migrations),
            f"{r.duration_s:.1f}s",
            r.verdict if r.skipped is None else f"skipped: {r.skipped}",
        ]
        for r in results
    ]
    header = [name for name, _ in _COLUMNS]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        out = []
        for (_, align), cell, width in zip(_COLUMNS, cells, widths, strict=True):
            out.append(cell.rjust(width) if align == ">" else cell.ljust(width))
        return "  ".join(out).rstrip()

    rule = "-" * len(line(header))
    text = ([title] if title else []) + [rule, line(header), rule, *(line(r) for r in rows), rule]
    if notes:
        for r in results:
            extra = [*r.notes, *(f"ISSUE: {i}" for i in r.issues)]
            if r.error:
                extra.append(f"ERROR: {r.error}")
            if extra:
                text.append(f"{r.name} [{r.backend}]:")
                text.extend(f"  - {e}" for e in extra)
    return "\n".join(text)


def report_json(results: Sequence[ScenarioResult], **meta: Any) -> dict[str, Any]:
    """The machine-readable report: run metadata, overall verdict and every scenario."""
    ran = [r for r in results if r.skipped is None]
    return {**meta, "ok": bool(ran) and all(r.ok for r in ran), "scenarios": [r.to_json() for r in results]}


# --- measuring -------------------------------------------------------------------------


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


def _issue_text(issue: AuditIssue) -> str:
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
        issues.update((_issue_text(i), None) for i in a.issues)
    for h in history:
        issues.update((_issue_text(i), None) for i in h.issues)
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


def _apply(result: ScenarioResult, before: Measure, after: Measure) -> None:
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

#: runtime.PartitionWorker._revoked: "node N: partition P REVOKED at epoch E: <reason>; local state discarded".
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


class _LogCounter(logging.Handler):
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


# --- in-process nodes without Spark -------------------------------------------------------------


class ArrowBatchEngine:
    """The default keyed aggregation of a batch, computed in plain Python: the real node runtime without Spark.

    Used for in-process nodes (store-fault scenarios, where what is under test is
    everything around the aggregate: merge, local store, deltas, commits). Written
    independently of the audit's reference fold so the two can disagree.
    """

    processor = keyed_aggregation

    def warm_up(self) -> float:
        return 0.0

    def aggregate(
        self, event_files: Sequence[Path], *, epoch: int, generation: int, job_group: str | None = None
    ) -> pa.Table:
        events = pa.concat_tables([pq.read_table(f) for f in event_files]).sort_by("offset")
        rows: dict[str, list[Any]] = {}
        for key, value, offset in zip(
            events["key"].to_pylist(), events["value"].to_pylist(), events["offset"].to_pylist(), strict=True
        ):
            row = rows.get(key)
            if row is None:
                rows[key] = [1, value, value, value, value, offset]
            else:
                row[0] += 1
                row[1] += value
                row[2], row[3] = min(row[2], value), max(row[3], value)
                row[4], row[5] = value, offset
        keys = sorted(rows)
        column = list(zip(*(rows[k] for k in keys), strict=True)) if keys else [()] * 6
        return pa.table(
            {
                "key": pa.array(keys, pa.string()),
                "batch_count": pa.array(column[0], pa.int64()),
                "batch_sum": pa.array(column[1], pa.float64()),
                "batch_min": pa.array(column[2], pa.float64()),
                "batch_max": pa.array(column[3], pa.float64()),
                "batch_last": pa.array(column[4], pa.float64()),
                "batch_last_offset": pa.array(column[5], pa.int64()),
            }
        )

    def cancel(self, job_group: str) -> None:
        """Nothing to cancel: an aggregate takes milliseconds; the runtime drops an abandoned batch's result."""


class ArrowNode(Node):
    """A node whose batches are aggregated by `ArrowBatchEngine` instead of a SparkSession."""

    def start_spark(self) -> None:
        self.engine = ArrowBatchEngine()


# --- a moto S3 server on loopback -------------------------------------------------------------

# The same server as tests/s3server.py (which the installed package cannot import):
# single-threaded, because moto checks If-None-Match/If-Match and stores the object in
# two Python steps, which a threaded server would let two racing conditional PUTs
# interleave. It exits when the process that started it is gone.
_MOTO_SERVER = """
import os, sys, threading, time
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server
port_file, parent = sys.argv[1], int(sys.argv[2])
server = make_server("127.0.0.1", 0, DomainDispatcherApplication(create_backend_app), threaded=False,
                     processes=1, request_handler=MotoRequestHandler)
with open(port_file + ".tmp", "w") as fh:
    fh.write(str(server.server_port))
os.replace(port_file + ".tmp", port_file)
def watch():
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)
threading.Thread(target=watch, daemon=True).start()
server.serve_forever()
"""

#: Fake credentials for the moto server: a chaos run can never reach a real AWS account.
_FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


@contextlib.contextmanager
def _environ(changes: Mapping[str, str | None]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in changes}
    try:
        for k, v in changes.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, old in saved.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old


@contextlib.contextmanager
def moto_server(workdir: Path) -> Iterator[str]:
    """Run moto's S3 server on a free loopback port; yield its endpoint URL, with fake credentials set.

    Raises RuntimeError if moto is not installed or the server does not come up.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    port_file, log_path = workdir / "moto.port", workdir / "moto.log"
    no_aws = {
        **_FAKE_AWS_ENV,
        "AWS_PROFILE": None,
        "AWS_ENDPOINT_URL": None,
        "AWS_ENDPOINT_URL_S3": None,
        "AWS_CONFIG_FILE": str(workdir / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(workdir / "no-aws-credentials"),
    }
    with _environ(no_aws), open(log_path, "wb") as log_fh:
        proc = subprocess.Popen(
            [sys.executable, "-c", _MOTO_SERVER, str(port_file), str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=log_fh,  # a file, never an undrained pipe
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 30.0
            url: str | None = None
            while url is None:
                if proc.poll() is not None:
                    raise RuntimeError(f"moto server exited: {log_path.read_text(errors='replace')[-2000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError("moto server did not answer within 30s")
                if port_file.exists():
                    candidate = f"http://127.0.0.1:{int(port_file.read_text())}"
                    try:
                        with urllib.request.urlopen(candidate + "/", timeout=5):
                            url = candidate
                    except urllib.error.HTTPError:
                        url = candidate  # any HTTP answer means it is serving
                    except OSError:
                        pass
                if url is None:
                    time.sleep(0.05)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _check_loopback(store_url: str) -> None:
    """Chaos runs on loopback only: an S3 store must be reached through a local endpoint."""
    if not store_url.startswith("s3://"):
        return
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    host = urlparse(endpoint).hostname or ""
    if host not in _LOOPBACK_HOSTS:
        raise ValueError(
            f"laminar chaos runs on loopback only: {store_url} needs AWS_ENDPOINT_URL pointing at "
            f"127.0.0.1/localhost, not {endpoint or 'AWS'}"
        )


# --- helpers shared by the scenarios --------------------------------------------------------------


def _retrying(fn: Callable[[], T], what: str, note: Callable[[str], None], attempts: int = 3) -> T:
    """Call `fn`, retrying a failed migration; every retry is noted (it may point at a library problem)."""
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except (MigrationError, StoreError) as exc:
            if attempt == attempts:
                raise
            note(f"retried: {what}: attempt {attempt} failed with {type(exc).__name__}: {exc}")
            time.sleep(1.0)
    raise AssertionError("unreachable")


def _coordinator(ledger: Ledger, config: MigrationConfig) -> MigrationCoordinator:
    # Each poll of a node's progress is a few requests; the single-threaded moto server
    # shared with the nodes must not spend its time answering them.
    remote = not ledger.store.url.startswith("file:")
    return MigrationCoordinator(ledger, config, poll_interval_s=0.1 if remote else 0.02)


def _migrate(
    ledger: Ledger, partition: int, to_node: int, forced: bool | None, config: MigrationConfig
) -> MigrationTask | None:
    """`run_migration`, where "already active on the target" (an earlier attempt got it there) is success.

    An attempt can time out waiting for the new owner's last report although the
    partition is running there (see the notes of the scenario that retried it).
    """
    coordinator = _coordinator(ledger, config)
    desired, _ = coordinator.desired.read(P(partition))
    own = ledger.ownership(P(partition))
    settled = desired.migration is None or desired.migration.phase == MigrationPhase.ACTIVE
    # Only when the desired owner says so too: a move that failed after the new owner took its
    # epoch leaves the ledger naming it while nobody runs the partition (`stranded`: forced again).
    here = own is not None and own.owner == to_node and own.status == PartitionStatus.ACTIVE
    if settled and desired.owner == to_node and here:
        return None
    return run_migration(coordinator, partition, to_node, forced=forced)


def balance(
    ledger: Ledger,
    live: set[int],
    note: Callable[[str], None],
    *,
    weights: Mapping[int, float] | None = None,
    bump_reason: str | None = None,
    config: MigrationConfig = MIGRATION_CONFIG,
) -> list[MoveOutcome[MigrationTask | None]]:
    """What `laminar rebalance` does: plan the fewest moves over `live`, run them concurrently."""
    plan = plan_assignment(ownership_map(ledger), live, weights)
    if not plan.moves:
        return []
    if bump_reason:
        ledger.bump_cluster_epoch(bump_reason)

    def move(m: Move) -> MigrationTask | None:
        forced = None if m.from_node in live else True
        return _retrying(
            lambda: _migrate(ledger, m.partition, m.to_node, forced, config),
            f"move of partition {m.partition} to node {m.to_node}",
            note,
        )

    return run_moves(plan.moves, move, config.max_concurrent_migrations, live_nodes=live)


def fail_over(
    ledger: Ledger, node: int, live: set[int], note: Callable[[str], None], config: MigrationConfig = MIGRATION_CONFIG
) -> list[MoveOutcome[MigrationTask | None]]:
    """What `laminar failover` does: forced migration of every partition of `node` to the least-loaded live nodes."""
    live = live - {node}
    loads = node_loads(ownership_map(ledger), live)
    moves = []
    warm = warm_copies(ledger.nodes())
    for p, owner in sorted(ownership_map(ledger).items()):
        if owner != node:
            continue
        target = failover_target(loads, warm=warm.get(p))
        if target is None:
            raise RuntimeError(f"no live node left to take partition {p} of node {node}")
        loads[target] += 1
        moves.append(Move(p, node, target))

    def failover(m: Move) -> MigrationTask | None:
        def attempt() -> MigrationTask | None:
            coordinator = _coordinator(ledger, config)
            decision = prepare_failover(coordinator, m.partition, m.to_node, live=live)
            return drive(coordinator, decision.task) if decision.task is not None else None

        return _retrying(attempt, f"failover of partition {m.partition}", note)

    return run_moves(moves, failover, config.max_concurrent_migrations, live_nodes=live)


def _outcome_issues(outcomes: Sequence[MoveOutcome[Any]], what: str) -> list[str]:
    return [
        f"{what} of partition {o.move.partition} to node {o.move.to_node} failed: {type(o.error).__name__}: {o.error}"
        for o in outcomes
        if not o.ok
    ]


def _committed_everything(store: ObjectStore) -> int:
    """Events produced but not yet committed, over all partitions."""
    reader, source = ManifestReader(store), SourceLog(store)
    behind = 0
    for p in Ledger(store).partitions():
        current = reader.current(p)
        behind += max(0, source.end_offset(p) - (current.manifest.source_offset if current else 0))
    return behind


def _wait_committed(store: ObjectStore, timeout: float) -> int:
    """Wait until everything produced is committed; return what is still behind at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        behind = _committed_everything(store)
        if behind == 0 or time.monotonic() > deadline:
            return behind
        time.sleep(0.2)


# --- store faults, in-process, on both backends --------------------------------------------------


def _stale_writer(
    store: ObjectStore,
    ledger: Ledger,
    nodes: Mapping[int, ArrowNode],
    live: set[int],
    note: Callable[[str], None],
    config: MigrationConfig,
) -> tuple[int, int, list[str]]:
    """Fence a live owner, then write with its superseded token as a zombie that never refreshed would.

    Returns (attempts, rejections, notes) for the publish and the release; the
    output and checkpoint objects it also writes are counted by the history
    audit (they must stay invisible).
    """
    running: list[PartitionWorker] = []

    def find() -> bool:
        running[:] = [
            w
            for node in nodes.values()
            for w in list(node.workers.values())
            if w.token is not None and w.state_name == WorkerState.RUNNING
        ]
        return bool(running)

    wait_until(find, 60, "an in-process node to run a partition")
    worker = running[0]
    node = worker.node
    target = min(n for n in live if n != node.id)
    token = worker.token
    assert token is not None
    coordinator = _coordinator(ledger, config)

    def fence() -> None:
        own = ledger.ownership(token.partition)
        desired, _ = coordinator.desired.read(token.partition)
        done = desired.owner == target and (desired.migration is None or desired.migration.phase == "active")
        if own is not None and own.epoch > token.epoch and own.owner == target and done:
            return  # an earlier attempt fenced it; only its completion report was lost
        decision = prepare_failover(coordinator, worker.partition, target, live=live, allow_live_owner=True)
        if decision.task is not None:
            drive(coordinator, decision.task)

    _retrying(fence, f"fencing partition {worker.partition} of live node {node.id}", note)
    wait_until(lambda: worker.finished, 60, f"node {node.id} to stop partition {worker.partition}")
    guard = PartitionGuard(token)  # a zombie's guard whose cached epoch never saw the fence
    current = ManifestReader(store).current(token.partition)
    start = current.manifest.source_offset if current else 0
    output = pa.table({"key": ["stale"], "batch_count": [1], "count": [1], "epoch": [token.epoch]})
    ref = OutputWriter(OutputCommitter(store)).write(guard, output, start, start + 1)
    CheckpointStore(CheckpointWriter(store)).upload_delta(guard, empty_state(), start, start + 1)
    attempts = rejected = 0
    notes = []
    publisher = ManifestPublisher(OutputCommitter(store), store)
    attempts += 1
    try:
        publisher.publish(token, ManifestUpdate(source_offset=start + 1, outputs=(ref,)))
        notes.append(f"stale publish of epoch {token.epoch} was ACCEPTED")
    except EpochError as exc:
        rejected += 1
        notes.append(f"stale publish rejected: {exc}")
    attempts += 1
    try:
        ledger.release(token, commit_ulid=None, source_offset=start)
        notes.append(f"stale release of epoch {token.epoch} was ACCEPTED")
    except EpochError as exc:
        rejected += 1
        notes.append(f"stale release rejected: {exc}")
    return attempts, rejected, notes


def run_store_faults(
    inner: ObjectStore, backend: str, profile: Profile, workdir: Path, say: Callable[[str], None]
) -> ScenarioResult:
    """Nodes, coordinator, producer and a stale writer, in-process, through a faulty store on `inner`.

    `inner` must be an empty store. Faults: a seeded random rate over every
    operation (half of the write faults are lost responses after an applied
    write), bursts of 5xx / throttling / resets / lost responses every 0.25 s,
    and added latency. The audit reads `inner` directly.
    """
    result = ScenarioResult("store-faults", backend, deterministic_stale_writes=True)
    started = time.monotonic()

    def note(msg: str) -> None:
        say(f"store-faults [{backend}]: {msg}")
        result.notes.append(msg)

    # In-process handoffs take milliseconds: a phase that waits long is stuck, not slow.
    config = MigrationConfig(migration_timeout_s=10.0, release_wait_timeout_s=10.0, checkpoint_transfer_timeout_s=10.0)
    workdir.mkdir(parents=True, exist_ok=True)
    remote = backend != "local"
    faulty = FaultInjectingStore(inner)
    # More attempts than the default: bursts of 3 plus the random rate must not exhaust them.
    store = RetryingStore(faulty, RetryPolicy(max_attempts=10, base_delay_s=0.01, max_delay_s=0.25), seed=7)
    ledger = Ledger(store)
    ledger.init_cluster(PARTITIONS)
    source = SourceLog(store, partitions=PARTITIONS, segment_events=2_000)
    produced: list[pa.Table] = []
    counter = _LogCounter()
    nodes: dict[int, ArrowNode] = {}
    threads: list[threading.Thread] = []
    stop = threading.Event()
    errors: list[str] = []

    def node_config(n: int) -> NodeConfig:
        # Against the single-threaded moto server every poll is a round trip: poll less.
        return NodeConfig(
            store_url=inner.url,
            node_id=n,
            heartbeat_interval_s=1.0,
            heartbeat_timeout_s=10.0,
            reconcile_interval_s=0.25 if remote else 0.05,
            idle_poll_s=0.25 if remote else 0.05,
            refresh_interval_s=1.5,  # the default; the kill-switch is not what is under test here
            batch_max_events=4_000,
            checkpoint_every_batches=3,
            workdir=str(workdir / f"node{n}"),
        )

    def bursts() -> None:
        kinds = ("5xx", "throttle", "lost", "reset")
        i = 0
        while not stop.wait(0.25):
            kind = kinds[i % len(kinds)]
            if kind == "lost":
                faulty.lose_response_next(2)
            else:
                faulty.fail_next(3, kind="5xx" if kind == "5xx" else "throttle" if kind == "throttle" else "reset")
            i += 1

    def producer() -> None:
        chunk = 2_000
        try:
            for i in range(profile.fault_events // chunk):
                if stop.is_set():
                    return
                for p, table in generate_events(chunk, KEYS, 1_000 + i, PARTITIONS).items():
                    source.append(p, table)
                    produced.append(table)
                time.sleep(0.05)
        except Exception as exc:
            errors.append(f"producer: {type(exc).__name__}: {exc}")

    steps: list[str] = []
    mark = [time.monotonic()]

    def step(name: str) -> None:
        now_ = time.monotonic()
        steps.append(f"{name} {now_ - mark[0]:.1f}s")
        mark[0] = now_

    with counter.attached(workdir / "nodes.log"):
        try:
            for n in (1, 2):
                nodes[n] = ArrowNode(node_config(n), store=store)
                t = threading.Thread(
                    target=nodes[n].run, kwargs={"install_signals": False}, name=f"node-{n}", daemon=True
                )
                t.start()
                threads.append(t)
            wait_until(lambda: {1, 2} <= live_node_ids(ledger), 60, "the in-process nodes to join")
            live = {1, 2}
            result.issues += _outcome_issues(balance(ledger, live, note, config=config), "placement")
            step("start and placement")
            faulty.latency(0.002 if remote else 0.004)
            faulty.random_faults(profile.fault_rate, seed=11)
            extra = [threading.Thread(target=bursts, name="bursts"), threading.Thread(target=producer, name="producer")]
            for t in extra:
                t.start()
            try:
                # Against the single-threaded moto server every handoff costs seconds: half the rounds.
                rounds = max(1, profile.fault_rounds // 2) if remote else profile.fault_rounds
                for round_ in range(rounds):
                    # Every partition to the other node: graceful handoffs while load and faults run.
                    weights = {1: 0.0} if round_ % 2 == 0 else {2: 0.0}
                    outcomes = balance(
                        ledger, live, note, weights=weights, bump_reason=f"chaos round {round_}", config=config
                    )
                    result.issues += _outcome_issues(outcomes, "migration")
                result.issues += _outcome_issues(balance(ledger, live, note, config=config), "balancing")
                step(f"{rounds} rounds of migrations")
                attempts, rejected, notes = _stale_writer(store, ledger, nodes, live, note, config)
                step("stale writer")
                result.stale_writes_attempted += attempts
                result.stale_writes_rejected += rejected
                result.notes += notes
            finally:
                extra[1].join(timeout=300)
                behind = _wait_committed(store, profile.commit_timeout_s)  # still under faults
                stop.set()
                extra[0].join(timeout=10)
                faulty.clear()
                step("rest of the load committed")
            if behind:
                result.issues.append(f"{behind} events still uncommitted after {profile.commit_timeout_s:.0f}s")
        except Exception as exc:
            result.error = f"{type(exc).__name__}: {exc}"
            say(f"store-faults [{backend}]: {traceback.format_exc()}")
        finally:
            stop.set()
            faulty.clear()
            for node in nodes.values():
                node.stop()
            for t in threads:
                t.join(timeout=60)
            if any(t.is_alive() for t in threads):
                result.issues.append("an in-process node did not stop within 60s")
            step("nodes stopped")
    result.issues += errors
    logs = counter.counts()
    result.revoked = logs.revoked
    result.stale_writes_attempted += logs.rejected_publishes
    result.stale_writes_rejected += logs.rejected_publishes
    behind = _committed_everything(inner)
    _apply(result, Measure(), measure(inner, expected_counts(produced) if behind == 0 else None))
    result.duration_s = time.monotonic() - started
    result.notes.append(f"steps: {', '.join(steps)}")
    result.notes.append(
        f"faults: {faulty.injected_failures} failed requests, {faulty.lost_responses} lost responses, "
        f"{faulty.delayed} delayed calls of {sum(faulty.calls.values())}; retry layer: {store.retries} retries, "
        f"{store.resolved_by_readback} outcomes resolved by read-back"
    )
    return result


# --- the process cluster ----------------------------------------------------------------------


class ProcessChaos:
    """The node-process scenarios, sharing one `Cluster` of 3 nodes and 4 partitions."""

    def __init__(self, store_url: str, workdir: Path, profile: Profile, say: Callable[[str], None]) -> None:
        self.profile = profile
        self.say = say
        self.workdir = workdir
        # Nodes make their per-partition staging directories under TMPDIR: knowing
        # where lets us see a batch in flight (its directory exists only while Spark runs it).
        self.tmp = workdir / "tmp"
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.cluster = Cluster(store_url, workdir, partitions=PARTITIONS, env={"TMPDIR": str(self.tmp)})
        self.ledger = self.cluster.ledger
        self.store = self.cluster.store
        self.backend = "local" if store_url.startswith("file:") else "s3"
        self.procs: list[NodeProcess] = []
        self._produce_lock = threading.Lock()
        self._audited = Measure()
        self._subprocesses: list[subprocess.Popen[bytes]] = []
        self._current: ScenarioResult | None = None

    def note(self, msg: str) -> None:
        """Say it, and keep it in the running scenario's notes."""
        self.say(msg)
        if self._current is not None:
            self._current.notes.append(msg)

    # -- nodes ----------------------------------------------------------------------------------

    def start_nodes(self) -> None:
        for n in NODE_IDS:
            self._start(n)

    def _start(self, n: int) -> None:
        self.procs.append(self.cluster.start_node(n))

    def _running(self, n: int) -> bool:
        node = self.cluster.nodes.get(n)
        return node is not None and node.proc.poll() is None

    def live(self) -> set[int]:
        return live_node_ids(self.ledger) & {n for n in NODE_IDS if self._running(n)}

    def close(self) -> None:
        for proc in self._subprocesses:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        self.cluster.shutdown()
        for node in self.procs:  # earlier incarnations too
            if node.proc.poll() is None:
                node.signal(signal.SIGCONT)
                node.signal(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.proc.wait(30)

    def _log_counts(self) -> LogCounts:
        total = LogCounts()
        for node in self.procs:
            with contextlib.suppress(OSError):
                c = count_revocations(node.log().splitlines())
                total = LogCounts(total.revoked + c.revoked, total.rejected_publishes + c.rejected_publishes)
        return total

    def _batch_dirs(self, n: int) -> set[Path]:
        return set(self.tmp.glob(f"laminar-node{n}-*/p*-*/batch-*"))

    def _wait_mid_batch(self, n: int, before: set[Path], timeout: float = 30.0) -> tuple[int, int] | None:
        """Wait until node `n` is running a batch it was not running before; (partition, batch start)."""
        found: list[Path] = []

        def in_batch() -> bool:
            found[:] = sorted(self._batch_dirs(n) - before)
            return bool(found)

        try:
            wait_until(in_batch, timeout, f"node {n} to start a batch", interval=0.01)
        except TimeoutError:
            return None
        d = found[0]
        return int(d.parent.name.split("-")[0][1:]), int(d.name.split("-")[1])

    # -- data -----------------------------------------------------------------------------------

    def produce(self, count: int) -> None:
        with self._produce_lock:
            self.cluster.produce(count, keys=KEYS)

    @contextlib.contextmanager
    def load(self) -> Iterator[None]:
        """Produce a chunk every `load_interval_s` in the background while inside."""
        stop = threading.Event()
        failures: list[BaseException] = []

        def run() -> None:
            while not stop.is_set():
                try:
                    self.produce(self.profile.load_events)
                except BaseException as exc:
                    failures.append(exc)
                    return
                stop.wait(self.profile.load_interval_s)

        t = threading.Thread(target=run, name="chaos-load", daemon=True)
        t.start()
        try:
            yield
        finally:
            stop.set()
            t.join(60)
            if failures:
                raise RuntimeError(f"background load failed: {failures[0]!r}")

    # -- scenario frame ---------------------------------------------------------------------------

    def prepare(self, min_live: int, *, all_nodes: bool = False) -> None:
        """Bring dead nodes back, wait for enough live ones, finish leftover moves, balance."""
        for n in NODE_IDS:
            if not self._running(n):
                self.say(f"restarting node {n}")
                self._start(n)
        want = len(NODE_IDS) if all_nodes else min_live
        wait_until(lambda: len(self.live()) >= want, 240, f"{want} live nodes", interval=0.5)
        coordinator = MigrationCoordinator(self.ledger, MIGRATION_CONFIG)
        live = self.live()
        for p in self.cluster.partitions:
            task = coordinator.current(p)
            if task is None or task.is_terminal:
                continue
            try:
                if task.from_node in live and task.to_node in live:
                    drive(coordinator, task)
                else:  # resumes it if it can do without the dead node, supersedes it otherwise
                    decision = prepare_failover(coordinator, p, live=live)
                    if decision.task is not None:
                        drive(coordinator, decision.task)
            except (MigrationError, StoreError) as exc:
                record_failure(coordinator, p, task.migration_id, exc)
        issues = _outcome_issues(balance(self.ledger, live, self.note), "balancing")
        if issues:
            raise RuntimeError("; ".join(issues))
        behind = _wait_committed(self.store, self.profile.commit_timeout_s)
        if behind:
            raise RuntimeError(f"{behind} events still uncommitted before the scenario")

    def scenario(
        self,
        name: str,
        body: Callable[[ScenarioResult], None],
        *,
        min_live: int = 2,
        all_nodes: bool = False,
    ) -> ScenarioResult:
        """Prepare, run `body`, wait for everything to be committed, audit, and report the difference."""
        result = ScenarioResult(name, self.backend)
        self._current = result
        self.say(f"{name}: preparing")
        before = self._audited
        try:
            self.prepare(min_live, all_nodes=all_nodes)
        except Exception as exc:
            result.error = f"preparation failed: {type(exc).__name__}: {exc}"
        # Counted from here: what preparing did (restarts, balancing) is not the scenario's.
        counts = self._cheap_measure()
        logs = self._log_counts()
        started = time.monotonic()
        if result.error is None:
            self.say(f"{name}: running")
            try:
                body(result)
            except Exception as exc:
                result.error = f"{type(exc).__name__}: {exc}"
                self.say(f"{name}: {traceback.format_exc()}")
        behind = _wait_committed(self.store, self.profile.commit_timeout_s)
        result.duration_s = time.monotonic() - started
        if behind:
            result.issues.append(f"{behind} events still uncommitted after {self.profile.commit_timeout_s:.0f}s")
        self.say(f"{name}: auditing")
        after = measure(self.store, self.cluster.expected_counts() if behind == 0 else None)
        self._audited = after
        _apply(result, before, after)
        result.events_produced = after.produced - counts.produced
        result.events_committed = after.committed - counts.committed
        result.epochs_granted = after.epochs - counts.epochs
        delta = self._log_counts() - logs
        result.revoked += delta.revoked
        result.stale_writes_attempted += delta.rejected_publishes
        result.stale_writes_rejected += delta.rejected_publishes
        self.say(f"{name}: {result.verdict} in {result.duration_s:.1f}s")
        return result

    def _cheap_measure(self) -> Measure:
        source, reader = self.cluster.source, self.cluster.manifests
        produced = committed = epochs = 0
        for p in self.cluster.partitions:
            produced += source.end_offset(p)
            current = reader.current(p)
            committed += current.manifest.source_offset if current else 0
            own = self.ledger.ownership(p)
            epochs += own.epoch if own else 0
        return Measure(produced=produced, committed=committed, epochs=epochs)

    def _victim(self, live: set[int]) -> int:
        """The live node holding the most partitions."""
        return max(sorted(live), key=lambda n: len(self.cluster.partitions_of(n)))

    def _fail_over(self, node: int, result: ScenarioResult) -> float:
        started = time.monotonic()
        outcomes = fail_over(self.ledger, node, self.live() | {node}, self.note)
        result.issues += _outcome_issues(outcomes, "failover")
        elapsed = time.monotonic() - started
        moved = [f"p{o.move.partition}->node {o.move.to_node}" for o in outcomes if o.ok]
        result.notes.append(f"failover of node {node} in {elapsed:.1f}s: {', '.join(moved) or 'nothing to move'}")
        return elapsed

    # -- the scenarios -------------------------------------------------------------------------------

    def kill9_mid_batch(self, result: ScenarioResult) -> None:
        victim = self._victim(self.live())
        before = self._batch_dirs(victim)
        killed_at = time.monotonic()
        self.produce(self.profile.batch_events)
        batch = self._wait_mid_batch(victim, before)
        self.cluster.kill(victim)
        killed_at = time.monotonic()
        if batch is None:
            result.issues.append(f"node {victim} never started a batch: killed without one in flight")
        else:
            p, start = batch
            committed = self.cluster.committed(p)
            result.notes.append(
                f"node {victim} SIGKILLed while Spark ran partition {p}'s batch from offset {start} "
                f"(committed offset {committed}, {self.cluster.source.end_offset(p) - committed} events uncommitted)"
            )
            if committed > start:
                result.issues.append(f"the batch at {start} was committed before the kill: not mid-batch")
        self.cluster.wait_dead(victim, timeout=30)
        self._fail_over(victim, result)
        result.notes.append(f"{time.monotonic() - killed_at:.1f}s from SIGKILL to every partition active again")
        self.produce(self.profile.load_events)
        self._start(victim)  # boots while the next scenarios run

    def zombie(self, result: ScenarioResult) -> None:
        live = self.live()
        zombie = self._victim(live)
        node = self.cluster.nodes[zombie]
        moved = self.cluster.partitions_of(zombie)
        epochs = {p: self.cluster.epoch(p) for p in moved}
        before = self._batch_dirs(zombie)
        self.produce(self.profile.batch_events)
        batch = self._wait_mid_batch(zombie, before)
        node.signal(signal.SIGSTOP)
        paused_at = datetime.now(UTC)
        revocations_before = count_revocations(node.log().splitlines())
        try:
            result.notes.append(
                f"node {zombie} SIGSTOPped "
                + (f"while Spark ran partition {batch[0]}'s batch from {batch[1]}" if batch else "(no batch seen)")
            )
            self.cluster.wait_dead(zombie, timeout=30)
            self._fail_over(zombie, result)
            self.produce(self.profile.load_events)
        finally:
            node.signal(signal.SIGCONT)
        try:
            wait_until(
                lambda: (count_revocations(node.log().splitlines()) - revocations_before).revoked >= len(moved),
                60,
                f"the zombie to report the revocation of {moved}",
            )
        except TimeoutError as exc:
            result.issues.append(str(exc))
        self.cluster.wait_alive(zombie, timeout=60)
        zombie_commits = 0
        for p in moved:
            for v in self.cluster.manifests.history(P(p)):
                m = v.manifest
                if m.node == zombie and m.fencing_token <= epochs[p] and m.committed_at > paused_at:
                    zombie_commits += 1
        if zombie_commits:
            result.issues.append(f"the zombie committed {zombie_commits} manifest(s) after it was fenced")
        result.notes.append(f"zombie resumed after failover of {moved}: {zombie_commits} commits after the pause")

    def kill9_mid_release(self, result: ScenarioResult, repetition: int) -> None:
        live = self.live()
        old = self._victim(live)
        p = self.cluster.partitions_of(old)[0]
        target = min(n for n in live if n != old)
        kill_phase = MigrationPhase.RELEASED if repetition % 2 == 0 else MigrationPhase.UPLOADING
        coordinator = MigrationCoordinator(self.ledger, MIGRATION_CONFIG)
        self.produce(self.profile.load_events)
        task = coordinator.plan(P(p), N(target))
        outcome: list[BaseException | None] = []
        with self.load():
            for phase in (MigrationPhase.PLANNED, MigrationPhase.DRAINING, MigrationPhase.CHECKPOINTING):
                if phase == kill_phase:
                    break
                coordinator.run_phase(P(p), task.migration_id, phase)

            def run_kill_phase() -> None:
                try:
                    coordinator.run_phase(P(p), task.migration_id, kill_phase)
                    outcome.append(None)
                except BaseException as exc:
                    outcome.append(exc)

            if kill_phase == MigrationPhase.RELEASED:
                coordinator.run_phase(P(p), task.migration_id, MigrationPhase.UPLOADING)
            waiter = threading.Thread(target=run_kill_phase, name="chaos-release")
            waiter.start()
            wait_until(
                lambda: (t := coordinator.current(P(p))) is not None and t.phase == kill_phase,
                30,
                f"phase {kill_phase} to be recorded",
                interval=0.001,
            )
            self.cluster.kill(old)
            waiter.join(120)
        released = self.ledger.release_record(P(p), task.from_epoch) is not None
        error = outcome[0] if outcome else None
        result.notes.append(
            f"node {old} SIGKILLed with partition {p}'s migration to node {target} recorded at {kill_phase}; "
            f"release {'written' if released else 'not written'}; coordinator: "
            + (f"{type(error).__name__}" if error else "phase completed")
        )
        current = coordinator.current(P(p))
        if current is not None and not current.is_terminal:
            with contextlib.suppress(MigrationError):
                drive(coordinator, current)  # needs the dead old owner unless it released: recorded Failed
        self.cluster.wait_dead(old, timeout=30)
        self._fail_over(old, result)
        final = coordinator.current(P(p))
        if self.cluster.owner(p) == old or final is None:
            result.issues.append(f"partition {p} still on the dead node {old}")
        else:
            result.notes.append(
                f"partition {p}: {final.migration_kind} migration {final.phase}, now node {self.cluster.owner(p)} "
                f"at epoch {self.cluster.epoch(p)}"
            )
        self._start(old)

    def orchestrator_killed(self, result: ScenarioResult, repetition: int) -> None:
        live = self.live()
        old = self._victim(live)
        p = self.cluster.partitions_of(old)[0]
        target = min(n for n in live if n != old)
        epoch = self.cluster.epoch(p)
        early = (MigrationPhase.CHECKPOINTING, MigrationPhase.UPLOADING, MigrationPhase.RELEASED)
        late = (MigrationPhase.DOWNLOADING, MigrationPhase.RESTORING, MigrationPhase.SEEKING)
        wanted = early if repetition % 2 == 0 else late
        self.produce(self.profile.batch_events // 2)  # a batch in flight makes the drain take a while
        cmd = [
            sys.executable, "-m", "laminar_orchestration.cli", "migrate",
            "--store", self.cluster.store_url, "--partition", str(p), "--to", str(target),
        ]  # fmt: skip
        with open(self.workdir / f"orchestrator-{p}-{int(time.time() * 1000)}.log", "wb") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=self.cluster.env)
        self._subprocesses.append(proc)
        seq = phase_sequence(MigrationKind.GRACEFUL)
        first = min(seq.index(w) for w in wanted)
        seen: list[MigrationPhase] = []

        def mid_way() -> bool:
            t = coordinator_view.current(P(p))
            if t is None or t.to_node != target or t.from_epoch != epoch:
                return proc.poll() is not None
            seen[:] = [t.phase]
            return t.is_terminal or (t.phase in seq and seq.index(t.phase) >= first) or proc.poll() is not None

        coordinator_view = MigrationCoordinator(self.ledger, MIGRATION_CONFIG)
        try:
            wait_until(mid_way, 90, f"the orchestrator to reach {wanted[0]}", interval=0.002)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        interrupted = coordinator_view.current(P(p))
        if interrupted is None or interrupted.is_terminal or interrupted.from_epoch != epoch:
            result.error = f"the orchestrator finished (or never planned) before it could be killed: {seen}"
            return
        result.notes.append(
            f"orchestrator SIGKILLed with partition {p}'s migration {old}->{target} at {interrupted.phase}"
        )
        # No retry: resuming the recorded migration must work the first time.
        task = run_migration(coordinator_view, p, target)
        if task.migration_id != interrupted.migration_id:
            result.issues.append(
                f"the resumed run planned migration {task.migration_id}, not {interrupted.migration_id}"
            )
        if task.phase != MigrationPhase.ACTIVE or self.cluster.owner(p) != target or self.cluster.epoch(p) != epoch + 1:
            result.issues.append(
                f"after resuming: {task.phase}, owner {self.cluster.owner(p)} at epoch {self.cluster.epoch(p)}"
            )
        else:
            result.notes.append(f"resumed migration {task.migration_id}: active on node {target} at epoch {epoch + 1}")

    def migrations_rebalance(self, result: ScenarioResult) -> None:
        live = self.live()
        moves_done = 0
        with self.load():
            # Two partitions of different owners, each to another node, at the same time.
            chosen: list[Move] = []
            owners_used: set[int] = set()
            for p, owner in sorted(ownership_map(self.ledger).items()):
                if owner in owners_used or len(chosen) == 2:
                    continue
                target = min((n for n in live if n != owner), key=lambda n: len(self.cluster.partitions_of(n)))
                chosen.append(Move(p, owner, target))
                owners_used.add(owner)

            def migrate(m: Move) -> MigrationTask | None:
                return _retrying(
                    lambda: _migrate(self.ledger, m.partition, m.to_node, None, MIGRATION_CONFIG),
                    f"migration of partition {m.partition}",
                    self.note,
                )

            outcomes = run_moves(chosen, migrate, 2, live_nodes=live)
            result.issues += _outcome_issues(outcomes, "migration")
            moves_done += len(outcomes)
            epochs = [self.ledger.membership().cluster_epoch]
            for round_ in range(self.profile.rebalance_rounds):
                drained = sorted(live)[round_ % len(live)]
                for weights in ({drained: 0.0}, None):
                    outcomes = balance(
                        self.ledger, live, self.note, weights=weights, bump_reason=f"chaos rebalance {round_}"
                    )
                    result.issues += _outcome_issues(outcomes, "rebalance")
                    moves_done += len(outcomes)
            epochs.append(self.ledger.membership().cluster_epoch)
        result.notes.append(
            f"{len(chosen)} concurrent migrations and {2 * self.profile.rebalance_rounds} rebalances under load: "
            f"{moves_done} moves, cluster epoch {epochs[0]} -> {epochs[-1]}"
        )

    def rolling_restart(self, result: ScenarioResult) -> None:
        # The busiest nodes first: a lighter profile restarts fewer nodes, but the ones that matter most.
        order = sorted(NODE_IDS, key=lambda n: (-len(self.cluster.partitions_of(n)), n))
        for n in order[: self.profile.rolling_nodes]:
            owned = self.cluster.partitions_of(n)
            epochs = {p: self.cluster.epoch(p) for p in owned}
            self.produce(self.profile.load_events)
            t0 = time.monotonic()
            code = self.cluster.stop(n)
            if code != 0:
                result.issues.append(f"node {n} exited with {code} on SIGTERM")
            for p in owned:
                own = self.ledger.ownership(P(p))
                if own is None or own.status != "released" or own.epoch != epochs[p]:
                    result.issues.append(f"node {n} did not release partition {p} on SIGTERM: {own}")
            self._start(n)
            self.cluster.wait_alive(n, timeout=240)

            def taken_back(owned: list[int] = owned, epochs: dict[int, int] = epochs, n: int = n) -> bool:
                return all(self.cluster.owner(p) == n and self.cluster.epoch(p) > epochs[p] for p in owned)

            wait_until(taken_back, 90, f"node {n} to take {owned} back")
            result.notes.append(f"node {n}: stopped, restarted and took {owned} back in {time.monotonic() - t0:.1f}s")


# --- the run ------------------------------------------------------------------------------------


def _skipped(name: str, backend: str, reason: str) -> ScenarioResult:
    return ScenarioResult(name, backend, skipped=reason)


def run_chaos(
    profile: Profile,
    names: Sequence[str] | None = None,
    *,
    store_url: str | None = None,
    workdir: Path,
    say: Callable[[str], None] = lambda _msg: None,
) -> list[ScenarioResult]:
    """Run the selected scenarios (all by default) in their fixed order; return one result per row.

    `store_url` is the store the node processes share (it must hold no
    cluster; default: a fresh local store in `workdir`). The store-fault
    scenario always uses its own local store and moto server.
    """
    selected = [s for s in SCENARIOS if names is None or s in names]
    started = time.monotonic()
    results: list[ScenarioResult] = []
    faults: list[ScenarioResult] = []
    process_names = [s for s in selected if s != "store-faults"]
    chaos: ProcessChaos | None = None
    faults_thread: threading.Thread | None = None

    def store_faults() -> None:
        for run in (_store_faults_local, _store_faults_s3):
            try:
                faults.append(run(profile, workdir, say))
            except Exception as exc:  # e.g. the moto server did not start
                backend = "local" if run is _store_faults_local else "s3/moto"
                faults.append(ScenarioResult("store-faults", backend, error=f"{type(exc).__name__}: {exc}"))

    try:
        if process_names:
            url = store_url or (workdir / "store").resolve().as_uri()
            _check_loopback(url)
            chaos = ProcessChaos(url, workdir / "cluster", profile, say)
            say(f"starting nodes {list(NODE_IDS)} on {url}")
            chaos.start_nodes()
        if "store-faults" in selected:
            if chaos is None:
                store_faults()
                return faults
            # In-process, in this process: it runs while the node processes boot and the first
            # process scenarios run (they share nothing but the CPU).
            faults_thread = threading.Thread(target=store_faults, name="chaos-store-faults", daemon=True)
            faults_thread.start()
        if chaos is None:
            return results
        plan: list[tuple[str, Callable[[ScenarioResult], None], dict[str, Any]]] = []
        for name in process_names:
            reps = (
                profile.repetitions
                if name in ("kill9-mid-batch", "zombie", "kill9-mid-release", "orchestrator-killed")
                else 1
            )
            for rep in range(reps):
                label = name if rep == 0 else f"{name}#{rep + 1}"
                plan.append((label, _body(chaos, name, rep), _needs(name)))
        for label, body, needs in plan:
            if time.monotonic() - started > profile.budget_s:
                results.append(_skipped(label, chaos.backend, f"time budget of {profile.budget_s:.0f}s used up"))
                continue
            results.append(chaos.scenario(label, body, **needs))
        if faults_thread is not None:
            faults_thread.join(max(60.0, profile.budget_s - (time.monotonic() - started)))
            if faults_thread.is_alive():
                faults.append(ScenarioResult("store-faults", "-", error="still running at the end of the time budget"))
    finally:
        if chaos is not None:
            chaos.close()
    return [*faults, *results]


def _body(chaos: ProcessChaos, name: str, rep: int) -> Callable[[ScenarioResult], None]:
    bodies: dict[str, Callable[[ScenarioResult], None]] = {
        "kill9-mid-batch": chaos.kill9_mid_batch,
        "zombie": chaos.zombie,
        "kill9-mid-release": lambda r: chaos.kill9_mid_release(r, rep),
        "orchestrator-killed": lambda r: chaos.orchestrator_killed(r, rep),
        "migrations-rebalance": chaos.migrations_rebalance,
        "rolling-restart": chaos.rolling_restart,
    }
    return bodies[name]


def _needs(name: str) -> dict[str, Any]:
    if name in ("migrations-rebalance", "rolling-restart"):
        return {"all_nodes": True}
    return {"min_live": 2}


def _store_faults_local(profile: Profile, workdir: Path, say: Callable[[str], None]) -> ScenarioResult:
    say("store-faults [local]: running")
    result = run_store_faults(
        LocalObjectStore(workdir / "faults-local" / "store"), "local", profile, workdir / "faults-local", say
    )
    say(f"store-faults [local]: {result.verdict} in {result.duration_s:.1f}s")
    return result


def _store_faults_s3(profile: Profile, workdir: Path, say: Callable[[str], None]) -> ScenarioResult:
    try:
        import moto  # noqa: F401 - only to say clearly why the S3 half cannot run
    except ImportError:
        return _skipped("store-faults", "s3/moto", "moto is not installed (pip install 'moto[server]')")
    from .store.s3 import S3ObjectStore, make_s3_client

    say("store-faults [s3/moto]: starting a moto server on loopback")
    with moto_server(workdir / "moto") as endpoint:
        client = make_s3_client(endpoint)
        bucket = f"laminar-chaos-{uuid.uuid4().hex[:12]}"
        client.create_bucket(Bucket=bucket)
        try:
            inner = S3ObjectStore(bucket, "chaos", client=client)
            say("store-faults [s3/moto]: running")
            result = run_store_faults(inner, "s3/moto", profile, workdir / "faults-s3", say)
        finally:
            client.close()
    say(f"store-faults [s3/moto]: {result.verdict} in {result.duration_s:.1f}s")
    return result


def main(
    *,
    profile_name: str,
    names: Sequence[str] | None,
    store_url: str | None,
    as_json: bool,
    out: str | None,
    workdir: str | None,
) -> int:
    """`laminar chaos`: run, print the table (or JSON), write both to files; 0 if every scenario held."""
    profile = PROFILES[profile_name]
    unknown = sorted(set(names or ()) - set(SCENARIOS))
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown}; choose from {list(SCENARIOS)}")
    began = time.monotonic()

    def say(msg: str) -> None:
        print(f"[chaos {time.monotonic() - began:7.1f}s] {msg}", file=sys.stderr, flush=True)

    def on_term(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop every process

    previous = signal.signal(signal.SIGTERM, on_term)
    keep = workdir is not None
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="laminar-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    started_at = datetime.now(UTC)
    try:
        results = run_chaos(profile, names, store_url=store_url, workdir=work, say=say)
    finally:
        signal.signal(signal.SIGTERM, previous)
    report = report_json(
        results,
        profile=profile.name,
        started_at=started_at.isoformat(),
        duration_s=round(time.monotonic() - began, 1),
        store=store_url or "a fresh local store",
        workdir=str(work),
    )
    title = (
        f"laminar chaos, profile {profile.name}, {started_at:%Y-%m-%d %H:%M}Z, "
        f"{report['duration_s']:.0f}s: {'OK' if report['ok'] else 'FAILED'}"
    )
    table = format_table(results, title=title)
    text_path = Path(out) if out else Path(".laminar") / "chaos" / f"report-{profile.name}.txt"
    json_path = text_path if text_path.suffix == ".json" else text_path.with_suffix(".json")
    if text_path == json_path:
        text_path = text_path.with_suffix(".txt")
    text_path.parent.mkdir(parents=True, exist_ok=True)
    text_path.write_text(table + "\n")
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2) if as_json else table, flush=True)
    if report["ok"] and not keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        say(f"node logs and stores kept in {work}")
    say(f"report written to {text_path} and {json_path}")
    return 0 if report["ok"] else 1
