"""How the demo ends: everything stopped in an order that leaves the store clean, then the store audited.

The producer first, then the Dagster daemon (so that nodes leaving on purpose
are not failed over), a moment for the nodes to commit the last events, the
nodes one at a time (they drain and release), the webserver; whatever a child
left behind in its process group is killed. Then the ``laminar verify`` audit
of the store and the output table as a downstream reader sees it.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Mapping

from laminar_orchestration.control.snapshot import live_node_ids, migrations_in_flight, ownership_map
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.metrics import MetricsServer
from laminar_orchestration.ops.demo_processes import Child, Producer
from laminar_orchestration.ops.demo_walkthrough import TableWatch
from laminar_orchestration.ops.verify import audit_store
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import ObjectStore, StoreError

__all__ = ["audit_at_end", "stop_in_order"]


def stop_in_order(
    ledger: Ledger | None,
    partitions: int,
    *,
    producer: Producer | None,
    daemon: Child | None,
    nodes: Mapping[int, Child],
    webserver: Child | None,
    metrics_server: MetricsServer | None,
    hurry: Callable[[], bool],
    say: Callable[[str], None],
) -> None:
    """Stop the demo's pieces in an order that leaves the store clean; `hurry` (read before every
    wait: a second Ctrl-C) shortens every wait. No child outlives it, whatever goes wrong."""
    try:
        if producer is not None:
            producer.stop()
            say(f"producer stopped after {producer.produced:,} events")
        # The daemon goes before the nodes: nodes leaving on purpose must not look like dead ones
        # to the failure sensor.
        if daemon is not None:
            # A migration or failover run it launched gets to finish rather than stop mid-phase
            # (it would resume from its record, but a clean store is nicer); other runs just stop.
            grace = 30.0 if _migrations_in_flight(ledger) else 1.0
            _stop_child(daemon, 20.0, hurry, say, group_grace=grace)
        _catch_up(ledger, partitions, nodes, hurry)
        if nodes:
            say("nodes: leaving one at a time (each hands its partitions on; the last releases them) ...")
        # One at a time: stopped together, each would hand its partitions to a peer stopping too and
        # wait out its leave deadline before releasing them.
        for child in nodes.values():
            _stop_child(child, 90.0, hurry, say)
        if webserver is not None:
            _stop_child(webserver, 20.0, hurry, say)
    finally:
        if metrics_server is not None:
            metrics_server.close()
        # Whatever went wrong above, no child outlives the demo.
        for leftover in [*nodes.values(), webserver, daemon]:
            if leftover is not None and not leftover.cleaned:
                leftover.kill_group()
                leftover.close()


def _stop_child(
    child: Child,
    timeout: float,
    hurry: Callable[[], bool],
    say: Callable[[str], None],
    *,
    already_signalled: bool = False,
    group_grace: float = 5.0,
) -> None:
    if child.running() and not already_signalled:
        child.signal(signal.SIGTERM)
    code = child.wait(timeout, hurry)
    if code is None:
        say(f"{child.name} (pid {child.pid}) did not stop in time: killed")
    elif not child.exit_reported:
        say(f"{child.name} (pid {child.pid}) stopped: {child.describe_exit()}")
    child.exit_reported = True
    # What it started may still be finishing (a Dagster run, a JVM shutting down): a moment's grace.
    if code is not None and not child.wait_group(min(1.0, group_grace), hurry) and group_grace > 1.0:
        if group_grace >= 10:
            say(f"{child.name}: waiting up to {group_grace:.0f}s for what it started to finish ...")
        child.wait_group(group_grace - 1.0, hurry)
    # Whatever is left in its process group (Spark JVM, code servers, run workers) goes now.
    child.kill_group()
    child.close()


def _migrations_in_flight(ledger: Ledger | None) -> bool:
    if ledger is None:
        return False
    try:
        return bool(migrations_in_flight(ledger))
    except StoreError:
        return False


def _catch_up(
    ledger: Ledger | None, partitions: int, nodes: Mapping[int, Child], hurry: Callable[[], bool], timeout: float = 15.0
) -> None:
    """Give running nodes a moment to commit the last appended events, so the audit shows everything."""
    if ledger is None or not nodes or hurry():
        return
    try:
        live = live_node_ids(ledger)
        owners = ownership_map(ledger)
        if not all(n in live for n in owners.values()):
            return  # a partition without a live owner will not catch up
        manifests = ManifestReader(ledger.store)
        source = SourceLog(ledger.store, partitions=partitions)
        ends = {p: source.end_offset(p) for p in owners}

        def caught_up() -> bool:
            for p, end in ends.items():
                cur = manifests.current(PartitionId(p))
                if (cur.manifest.source_offset if cur else 0) < end:
                    return False
            return True

        deadline = time.monotonic() + timeout
        while not caught_up() and time.monotonic() < deadline and not hurry():
            time.sleep(0.3)
    except StoreError:
        return


def audit_at_end(store: ObjectStore, table: TableWatch | None, say: Callable[[str], None]) -> bool:
    """Print the ``laminar verify`` audit of `store`, then the output `table` as a downstream reader
    sees it next to what the manifests committed; True when the audit is OK."""
    say("laminar verify:")
    audits = audit_store(store)
    for audit in audits:
        for line in audit.summary_lines():
            say(line)
    ok = all(a.ok for a in audits)
    say("verify: OK" if ok else "verify: FAILED")
    if table is not None:  # the nodes' last syncs are done: they stopped
        for line in table.final_lines({a.partition: a.committed_offset for a in audits}):
            say(line)
    return ok
