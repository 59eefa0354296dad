"""The chaos suite (`python -m laminar_dev.chaos`): its pieces, the store faults on both backends, the short profile.

Everything but the last test runs without Spark. The last one runs the short
profile on real node processes (~4-5 minutes) and checks the promises every
scenario must keep: no duplicate, no loss, one owner per epoch, no stale write
accepted after the fence, no migration left wedged.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from laminar_dev.chaos import (
    PROFILES,
    SCENARIOS,
    ArrowBatchEngine,
    LogCounts,
    ScenarioResult,
    count_revocations,
    format_table,
    report_json,
    run_chaos,
    run_store_faults,
)
from laminar_dev.chaos import main as chaos_main
from laminar_orchestration.cli import main as cli_main
from laminar_orchestration.dataplane.checkpoint import OutputWriter
from laminar_orchestration.dataplane.statestore import PartitionStateStore
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.ops.verify import audit_epoch_history, reference_fold
from laminar_orchestration.processing.contract import FoldContext
from laminar_orchestration.processing.keyed import keyed_aggregation
from laminar_orchestration.protocol.capabilities import OutputCommitter
from laminar_orchestration.protocol.chain_writes import ManifestPublisher, ManifestUpdate
from laminar_orchestration.protocol.fencing import PartitionGuard, StaleEpoch
from laminar_orchestration.protocol.keys import manifest_history_key, output_object_key
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.manifest import StaleFencingToken
from laminar_orchestration.protocol.signing import sign_record
from laminar_orchestration.store import LocalObjectStore, ObjectStore
from laminar_orchestration.ulid import next_ulid

P, N = PartitionId, NodeId


def unexpected(issues: list[str]) -> list[str]:
    """Issues other than a move timing out under injected faults and heavy load.

    The scenario retries such a move; data safety, stale writes and wedged
    migrations are asserted separately.
    """
    return [i for i in issues if "failed: MigrationTimeout" not in i]


# --- the report --------------------------------------------------------------------------------


def test_result_verdicts_table_and_json() -> None:
    good = ScenarioResult(
        "zombie",
        "local",
        events_produced=1200,
        events_committed=1200,
        stale_writes_attempted=2,
        stale_writes_rejected=2,
        revoked=1,
        epochs_granted=2,
        max_owners_per_epoch=1,
        duration_s=12.34,
        notes=["node 2 SIGSTOPped"],
    )
    duplicated = ScenarioResult("kill9-mid-batch", "local", duplicates=3, max_owners_per_epoch=1)
    accepted = ScenarioResult("store-faults", "local", stale_writes_attempted=2, stale_writes_rejected=1)
    split = ScenarioResult("store-faults", "s3/moto", max_owners_per_epoch=2, issues=["p0 split-brain: epoch 2"])
    skipped = ScenarioResult("rolling-restart", "local", skipped="time budget of 420s used up")
    assert good.ok and good.verdict == "ok"
    assert not duplicated.ok and not accepted.ok and not split.ok
    assert skipped.verdict == "skipped" and not skipped.ok

    table = format_table([good, duplicated, accepted, split, skipped], title="laminar chaos")
    lines = table.splitlines()
    assert lines[0] == "laminar chaos"
    header = lines[2].split()
    assert header[:4] == ["scenario", "backend", "produced", "committed"] and header[-2:] == ["time", "verdict"]
    row = next(line for line in lines if line.startswith("zombie"))
    figures = ["1200", "1200", "0", "0", "2/2", "0", "1", "2", "0", "1", "0", "12.3s"]
    assert row.split() == ["zombie", "local", *figures, "ok"]
    assert "stale acc" in lines[2] and "dbl grant" in lines[2] and "wedged" in lines[2]
    assert not ScenarioResult("x", "local", double_grants=1).ok
    assert not ScenarioResult("x", "local", wedged_migrations=1).ok
    assert "skipped: time budget of 420s used up" in table
    assert "  - node 2 SIGSTOPped" in table and "  - ISSUE: p0 split-brain: epoch 2" in table

    report = report_json([good, duplicated], profile="short")
    assert report["profile"] == "short" and report["ok"] is False
    assert report["scenarios"][0]["stale_writes_accepted"] == 0
    assert [s["verdict"] for s in report["scenarios"]] == ["ok", "FAILED"]
    assert json.loads(json.dumps(report)) == report
    assert report_json([good, skipped])["ok"] is True  # skipped rows do not fail a run...
    assert report_json([skipped])["ok"] is False  # ...but a run that ran nothing is not a pass


def test_revocations_are_counted_from_the_runtime_log_line() -> None:
    def line(node: int, p: int, epoch: int, reason: str) -> str:
        # The format string of dataplane.worker.PartitionWorker._revoked.
        body = f"node {node}: partition {p} REVOKED at epoch {epoch}: {reason}; local state discarded"
        return f"2026-11-22 07:00:00,000 laminar.node ERROR {body}"

    lines = [
        line(2, 0, 3, str(StaleFencingToken(P(0), 3, 4))),  # a publish the store's fencing rejected
        line(2, 1, 2, str(StaleEpoch(P(1), 2, 3))),  # the kill-switch, before any write
        line(3, 2, 5, "conditional PUT failed for partition 2: expected epoch=5, actual=6"),
        "2026-11-22 07:00:00,000 laminar.node INFO node 1: partition 3 acquired at epoch 4",
    ]
    assert count_revocations(lines) == LogCounts(revoked=3, rejected_publishes=2)
    assert LogCounts(5, 3) - LogCounts(2, 1) == LogCounts(3, 2)


def test_arrow_engine_and_the_default_merge_fold_like_the_reference(tmp_path: Path) -> None:
    engine = ArrowBatchEngine()
    batches = [
        pa.table({"offset": [0, 1, 2], "key": ["a", "b", "a"], "value": [1.0, 5.0, 3.0], "ts": [0, 0, 0]}),
        pa.table({"offset": [3, 4], "key": ["a", "c"], "value": [-2.0, 7.0], "ts": [0, 0]}),
    ]
    outputs: list[pa.Table] = []
    with PartitionStateStore(tmp_path / "db", keyed_aggregation.state_schema, partition=0) as local:
        for i, batch in enumerate(batches):
            path = tmp_path / f"b{i}.parquet"
            pq.write_table(batch, path)
            aggregate = engine.aggregate([path], epoch=4, generation=2)
            previous = local.get_many(aggregate["key"].to_pylist())
            fold = keyed_aggregation.fold(aggregate, previous, FoldContext.at(4, 2))
            local.apply(fold.delta, int(batch["offset"][-1].as_py()) + 1)
            outputs.append(fold.output)
        state = local.to_table()
    expected = reference_fold(pa.concat_tables(batches))
    assert state.sort_by("key").to_pylist() == expected.sort_by("key").to_pylist()
    last = outputs[-1].sort_by("key").to_pylist()
    assert [(r["key"], r["batch_count"], r["count"], r["epoch"], r["generation"]) for r in last] == [
        ("a", 1, 3, 4, 2),
        ("c", 1, 1, 4, 2),
    ]


def test_chaos_command_rejects_unknown_scenarios(capsys: pytest.CaptureFixture[str]) -> None:
    assert chaos_main(["--scenario", "zombie", "meteor-strike"]) == 2
    err = capsys.readouterr().err
    assert "meteor-strike" in err and "kill9-mid-batch" in err


def test_the_chaos_suite_is_no_subcommand_of_the_installed_cli(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli_main(["chaos"])
    assert exc.value.code == 2 and "invalid choice: 'chaos'" in capsys.readouterr().err


# --- the epoch history audit (verify.audit_epoch_history) ---------------------------------------


def _output(store: ObjectStore, guard: PartitionGuard) -> ManifestUpdate:
    ref = OutputWriter(OutputCommitter(store)).write(guard, pa.table({"key": ["k"], "epoch": [guard.epoch]}), 0, 0)
    return ManifestUpdate(source_offset=0, outputs=(ref,))


def test_epoch_history_audit_finds_stale_writes_and_split_brain(store: ObjectStore) -> None:
    ledger = Ledger(store)
    ledger.init_cluster(1)
    publisher = ManifestPublisher(OutputCommitter(store), store)
    first = ledger.fence(P(0), N(1), expected_epoch=0, reason="start")
    assert first is not None
    publisher.publish(first, _output(store, PartitionGuard(first)))
    second = ledger.fence(P(0), N(2), expected_epoch=1, reason="failover")
    assert second is not None
    time.sleep(0.01)  # object names carry millisecond timestamps
    zombie = PartitionGuard(first)  # node 1 never refreshed: its cached epoch is still 1
    stale = _output(store, zombie)  # lands, as an object no manifest names
    publisher.publish(second, ManifestUpdate(source_offset=0, note="takeover"))
    with pytest.raises(StaleFencingToken):
        publisher.publish(first, stale)

    clean = audit_epoch_history(store, P(0))
    assert (clean.epochs_granted, clean.max_owners_per_epoch) == (2, 1)
    assert clean.owners == {1: {1}, 2: {2}}
    assert (clean.stale_writes, clean.stale_writes_accepted, clean.stale_writes_rejected) == (1, 0, 1)
    assert clean.issues == []

    # Fenced again (the grant seals the chain at 3), node 2 can no longer publish...
    assert ledger.fence(P(0), N(3), expected_epoch=2, reason="operator") is not None
    time.sleep(0.01)
    late_output = _output(store, PartitionGuard(second))
    with pytest.raises(StaleFencingToken):
        publisher.publish(second, late_output)
    assert audit_epoch_history(store, P(0), ledger=ledger).stale_writes_accepted == 0
    # ...and a writer that bypasses the publisher, signing with the key of the epoch it held, can
    # still store an entry, but it is void: passed over by every reader, so neither it nor the
    # output it names is accepted; the audit reports it.
    seal = publisher.current(P(0))
    assert seal is not None and seal.manifest.is_seal and seal.manifest.fencing_token == 3
    unsigned = seal.manifest.model_copy(
        update={
            "seq": seal.manifest.seq + 1,
            "fencing_token": 2,
            "node": 2,
            "commit_ulid": next_ulid(seal.manifest.commit_ulid),
            "parent_hash": seal.raw_hash,
            "outputs": list(late_output.outputs),
            "note": "",
        }
    )
    forged = sign_record(unsigned, ledger.signing_keys.get(2, 0, 2))
    store.put_if_absent(manifest_history_key(0, forged.seq), forged.model_dump_json().encode())
    late = audit_epoch_history(store, P(0), ledger=ledger)
    assert late.stale_writes_accepted == 0
    assert late.stale_writes == 3  # the earlier late output, this one, and the void entry
    assert {i.kind for i in late.issues} == {"superseded"}

    # An object written under epoch 3 by a node that does not hold it: two owners of one epoch.
    key = output_object_key(0, 9, 3, 0, 1, next_ulid())
    store.put_if_absent(key, b"x", {"x-laminar-partition": "0", "x-laminar-epoch": "3", "x-laminar-node": "9"})
    split = audit_epoch_history(store, P(0), ledger=ledger)
    assert split.max_owners_per_epoch == 2 and split.owners[3] == {3, 9} and split.double_grants == 1
    assert any(i.kind == "split-brain" and "[3, 9]" in i.detail for i in split.issues)


# --- store faults, in-process, on both backends -----------------------------------------------------


@pytest.mark.slow
def test_store_fault_scenario_keeps_every_promise(store: ObjectStore, tmp_path: Path) -> None:
    backend = "local" if isinstance(store, LocalObjectStore) else "s3"
    profile = dataclasses.replace(PROFILES["short"], fault_events=12_000, fault_rounds=1)
    result = run_store_faults(store, backend, profile, tmp_path, say=lambda msg: print(msg, file=sys.stderr))
    print(format_table([result]))
    assert result.error is None
    assert result.events_produced == result.events_committed == profile.fault_events
    assert result.duplicates == 0 and result.losses == 0
    assert result.max_owners_per_epoch == 1 and result.double_grants == 0
    assert result.stale_writes_accepted == 0 and result.wedged_migrations == 0
    # Deterministic: a publish and a release with a superseded token, and the fenced worker's revocation.
    assert result.stale_writes_attempted >= 2 and result.stale_writes_rejected >= 2
    assert result.revoked >= 1
    assert unexpected(result.issues) == []


# --- the short profile on node processes ---------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.processes
@pytest.mark.slow(seconds=270)  # ~4-5 minutes: the longest test, so the first file to start
@pytest.mark.timeout(900)  # the profile's budget (720 s) and its last scenario
def test_short_profile(tmp_path: Path) -> None:
    # The store faults on both backends are the test above: here only the node-process scenarios,
    # so no moto server shares the CPU with the node processes.
    started = time.monotonic()
    process_scenarios = SCENARIOS[1:]
    results = run_chaos(
        PROFILES["short"], names=process_scenarios, workdir=tmp_path, say=lambda msg: print(msg, file=sys.stderr)
    )
    print(format_table(results, title=f"short profile in {time.monotonic() - started:.0f}s"))
    rows = {(r.name, r.backend): r for r in results}
    assert set(rows) == {(name, "local") for name in process_scenarios}
    for r in results:
        where = f"{r.name} [{r.backend}]: {r.error or r.skipped or ''} {r.issues}"
        assert r.skipped is None and r.error is None, where
        assert r.duplicates == 0 and r.losses == 0, where
        assert r.max_owners_per_epoch == 1 and r.double_grants == 0, where
        assert r.stale_writes_accepted == 0 and r.wedged_migrations == 0, where
        assert r.events_committed == r.events_produced > 0, where
        assert r.issues == [], where
    # The paused node's kill-switch always fires once it resumes (whether it got as far as a write is a race).
    assert rows[("zombie", "local")].revoked >= 1
