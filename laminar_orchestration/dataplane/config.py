"""What a worker node is configured with (``laminar node run``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

#: Synthetic batches a node runs at start until its first real batch (`SparkBatchEngine.keep_warming`).
WARM_UP_BATCHES = 200


class NodeConfig(BaseModel):
    """Configuration of one worker node (``laminar node run``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    store_url: str
    node_id: int = Field(ge=1)
    #: The processor this node runs (``package.module:attribute``, an entry point's or a built-in's
    #: name); None: the one the cluster recorded at ``laminar init``. Either must match the record.
    processor: str | None = None
    spark_master: str = "local[*]"
    spark_ui: bool = False
    #: Synthetic batches Spark runs in the background at start, until the node's first real batch:
    #: a target or standby that owned nothing yet is then as fast as a busy node at a handoff.
    spark_warm_up_batches: int = Field(default=WARM_UP_BATCHES, ge=0)
    #: Each heartbeat is a billed PUT; the failure sensor judges a node dead after `heartbeat_timeout_s`.
    heartbeat_interval_s: float = Field(default=2.0, gt=0)
    heartbeat_timeout_s: float = Field(default=6.0, gt=0)
    #: How often the node reads its assignment while a migration involves it; the control plane's
    #: nudge after each phase it records wakes the node at once, so this is the fallback's latency.
    reconcile_interval_s: float = Field(default=0.1, gt=0)
    #: The same while nudges reach the node (one came within the last 30 s): their fallback only.
    nudged_reconcile_interval_s: float = Field(default=1.0, gt=0)
    #: How often an idle node reads its assignment record (one GET); a nudge wakes it at once.
    assignment_poll_s: float = Field(default=2.0, gt=0)
    #: Every this often the node reads every partition's desired state (a repair path).
    full_reconcile_interval_s: float = Field(default=900.0, gt=0)
    #: Where the node listens for the control plane's nudges (None: it does not; it still converges).
    nudge_host: str | None = "127.0.0.1"
    #: How often the node reads the cluster epoch, and how often a committing partition looks for a
    #: successor's grant before its commit (an early exit; the chain is the fence). Every guard is
    #: checked against the ledger when this node's assignment changes (the control plane moved a
    #: partition) and at each full pass (`full_reconcile_interval_s`).
    refresh_interval_s: float = Field(default=5.0, gt=0)
    batch_max_events: int = Field(default=1_000_000, ge=1)
    #: An idle partition's first poll of its source comes after this long; each empty poll doubles
    #: the wait up to `idle_poll_max_s` (every poll is a billed GET), and a batch resets it.
    idle_poll_s: float = Field(default=0.05, gt=0)
    idle_poll_max_s: float = Field(default=2.0, gt=0)
    #: How often the node reads the log ends producers record (one GET, whatever it owns): a
    #: partition whose end moved is read at once; while they are recorded, a caught-up partition
    #: polls its own log only every `source_fallback_poll_s` (a producer may die before recording).
    log_ends_poll_s: float = Field(default=2.0, gt=0)
    #: How often the node appends its partitions' new committed batches to the output table, in one
    #: Delta commit (when it keeps the table): the table's lag, traded against its requests. 5 s keeps
    #: the table a few seconds behind for a small share of the cluster's requests (docs/output-table.md).
    table_sync_interval_s: float = Field(default=5.0, gt=0)
    source_fallback_poll_s: float = Field(default=300.0, gt=0)
    #: How often a migration's target reads the ownership head while it waits for the grant that
    #: follows Seeking (the control plane makes it right after recording the phase). Every poll is a GET.
    migration_poll_s: float = Field(default=0.01, gt=0)
    #: A snapshot of the local store is uploaded once this many deltas follow the last one ...
    checkpoint_every_batches: int = Field(default=10, ge=1)
    #: ... or the deltas since it reach this fraction of its size (and at least `checkpoint_min_delta_bytes`) ...
    checkpoint_delta_fraction: float = Field(default=0.25, gt=0)
    checkpoint_min_delta_bytes: int = Field(default=4 << 20, ge=0)
    #: ... or this much time passed since it (with at least one delta).
    checkpoint_every_s: float = Field(default=30.0, gt=0)
    #: A failed partition is restarted after this delay, doubled per consecutive failure
    #: up to `restart_backoff_max_s`; a successful commit resets it. A batch failing on a segment it
    #: cannot decode (`UndecodableSegment`) is a permanent failure: not restarted.
    restart_backoff_initial_s: float = Field(default=0.5, gt=0)
    restart_backoff_max_s: float = Field(default=30.0, gt=0)
    workdir: str | None = None
    #: Partitions this node keeps a warm standby copy of while it does not own them.
    standby_for: tuple[int, ...] = ()
    #: How often a standby (or a migration's warming target) reads the partition's newest manifest.
    standby_poll_s: float = Field(default=0.1, gt=0)
    #: Where the node serves Prometheus metrics (``/metrics``; None: it does not, 0: any free port).
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
