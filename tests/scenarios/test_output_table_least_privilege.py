"""The output table kept by real node processes, each on its own IAM keys, on the credential-checking
S3-protocol server: exactly once after a graceful move, a resumed zombie (SIGSTOP, failover, SIGCONT)
and a kill -9 failover; and a node's keys write the table only where its policy says.

The policies are the ones `laminar policies` renders (`storage_policies`): a node writes the table's
log and the data files under its own folder (`keys.table_node_folder`), nothing else under
``tables/``, nothing outside its own keys, and deletes nothing. moto's server with authentication on
checks each request's signature and its Action/Resource against the signer's policy.
"""

from __future__ import annotations

import functools
import json
import os
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from laminar_dev.localcluster import stop_processes, wait_until
from laminar_dev.s3server import AccessKey, create_iam_user, start_s3_server
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.protocol import keys
from laminar_orchestration.protocol.capabilities import (
    AUDITOR_ROLE,
    CONTROL_PLANE_ROLE,
    PRODUCER_ROLE,
    node_role,
    storage_policies,
)
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.table import table_location
from tests.iam import BUCKET, NODES, PREFIX
from tests.scenarios.test_least_privilege import Roles, _full, _outcome, alive, committed, table_caught_up

pytestmark = [pytest.mark.processes, pytest.mark.slow]

TABLE = f"{keys.OUTPUT_TABLE_PREFIX}"


@pytest.fixture(scope="module")
def table_roles(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Roles]:
    """The authenticating server with every role's IAM user (`laminar policies`' documents)."""
    workdir = tmp_path_factory.mktemp("table-least-privilege")
    with start_s3_server(workdir / "s3", auth=True) as endpoint:
        admin = AccessKey("admin", os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"])
        admin.client("s3", endpoint).create_bucket(Bucket=BUCKET)
        rendered = storage_policies(BUCKET, PREFIX, nodes=NODES)
        role_keys = {
            role: create_iam_user(endpoint, admin, f"laminar-{role}", document)
            for role, document in rendered.roles.items()
        }
        credentials = workdir / "credentials"
        credentials.write_text(
            "".join(
                f"[{role}]\naws_access_key_id = {k.access_key_id}\naws_secret_access_key = {k.secret_access_key}\n"
                for role, k in role_keys.items()
                if not role.startswith("node-")
            )
        )
        roles = Roles(endpoint, admin, role_keys, credentials, workdir)
        roles.keys["admin"] = admin
        try:
            yield roles
        finally:
            stop_processes(roles.nodes.values(), timeout_s=20)


@dataclass(frozen=True)
class Scenario:
    produced: int
    #: The owner of partition 1 that was stopped, failed over and resumed.
    zombie: int
    #: The owner of partition 0 that was killed (-9) and failed over.
    killed: int
    audit: dict[str, Any]


def _table_lines(workdir: Path) -> str:
    """The nodes' log lines about the output table (the last 15 of each), to say why it fell behind."""
    return "\n".join(
        f"{log.name}: {line}"
        for log in sorted(workdir.glob("node*.log"))
        for line in [x for x in log.read_text(errors="replace").splitlines() if "table" in x.lower()][-15:]
    )


def _table(roles: Roles, role: str) -> DeltaTable:
    """The table as a downstream reader with `role`'s keys opens it: `deltalake` alone."""
    key = roles.keys[role]
    options = {
        "AWS_ENDPOINT_URL": roles.endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": key.access_key_id,
        "AWS_SECRET_ACCESS_KEY": key.secret_access_key,
    }
    return DeltaTable(f"s3://{BUCKET}/{PREFIX}/{keys.OUTPUT_TABLE_PREFIX.rstrip('/')}", storage_options=options)


@pytest.fixture(scope="module")
def scenario(table_roles: Roles) -> Scenario:
    r = table_roles
    admin = r.store("admin")  # the test's own view: reads only
    ledger = Ledger(admin)
    produced = 0

    def produce(count: int) -> None:
        nonlocal produced
        r.laminar(PRODUCER_ROLE, "produce", "--count", str(count), "--keys", "30")
        produced += count
        wait_until(lambda: committed(admin), 90, f"{count} events committed")

    r.laminar(CONTROL_PLANE_ROLE, "init", "--partitions", "2")
    for n in NODES:
        r.start_node(n)
    wait_until(lambda: alive(admin) == set(NODES), 60, "three live nodes")
    r.laminar(CONTROL_PLANE_ROLE, "rebalance")
    produce(1500)

    # A graceful move of partition 0.
    own0 = ledger.ownership(PartitionId(0))
    assert own0 is not None
    target = next(n for n in NODES if n != own0.owner)
    r.laminar(CONTROL_PLANE_ROLE, "migrate", "--partition", "0", "--to", str(target))
    produce(1000)

    # A zombie: partition 1's owner stops right after committing (its table sync still owed), is seen
    # dead and failed over, then resumes with its keys and its remembered batches.
    own1 = ledger.ownership(PartitionId(1))
    assert own1 is not None
    zombie = int(own1.owner)
    produce(1000)
    os.kill(r.nodes[zombie].pid, signal.SIGSTOP)
    try:
        wait_until(lambda: zombie not in alive(admin), 30, f"node {zombie} to be seen dead")
        r.laminar(CONTROL_PLANE_ROLE, "failover", "--node", str(zombie))
    finally:
        os.kill(r.nodes[zombie].pid, signal.SIGCONT)
    after = ledger.ownership(PartitionId(1))
    assert after is not None and after.owner != zombie and after.epoch == own1.epoch + 1
    produce(1000)

    # kill -9 of partition 0's owner, then a forced move to a survivor.
    now0 = ledger.ownership(PartitionId(0))
    assert now0 is not None
    killed = int(now0.owner)
    r.nodes[killed].kill()
    r.nodes[killed].wait()
    wait_until(lambda: killed not in alive(admin), 30, f"node {killed} to be seen dead")
    r.laminar(CONTROL_PLANE_ROLE, "failover", "--node", str(killed))
    produce(1000)
    try:
        # A sync every 5 s; on the suite's loaded machine the one-request-at-a-time server answers slowly.
        wait_until(lambda: table_caught_up(admin), 180, "the nodes to catch the output table up")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; the nodes' table lines:\n{_table_lines(r.workdir)}") from exc
    audit = json.loads(r.laminar(AUDITOR_ROLE, "verify", "--json"))
    return Scenario(produced, zombie, killed, audit)


def test_the_table_holds_every_event_once_after_a_move_a_resumed_zombie_and_a_kill_9_failover(
    table_roles: Roles, scenario: Scenario
) -> None:
    table_audit = scenario.audit.get("output_table") if isinstance(scenario.audit, dict) else None
    assert table_audit is not None and table_audit["ok"], table_audit  # `verify` with the auditor's keys
    table = _table(table_roles, AUDITOR_ROLE)
    rows = table.to_pyarrow_table(columns=["partition", "batch_seq", "key", "batch_count", "epoch"])
    partitions, seqs, row_keys = (rows[c].to_pylist() for c in ("partition", "batch_seq", "key"))
    landed = Counter(zip(partitions, seqs, row_keys, strict=True))
    assert max(landed.values()) == 1, "a batch's row landed twice"
    assert sum(rows["batch_count"].to_pylist()) == scenario.produced  # every event once
    epochs = Counter(zip(partitions, rows["epoch"].to_pylist(), strict=True))
    assert len({e for p, e in epochs if p == 0}) >= 3  # first owner, the move's, the kill's failover
    assert len({e for p, e in epochs if p == 1}) >= 2  # first owner (the zombie), the failover's
    # The nodes wrote their data files under their own folders, several nodes of them.
    folders = {uri.rsplit("/", 2)[-2] for uri in table.file_uris()}
    assert folders <= {keys.table_node_folder(n).rstrip("/") for n in NODES} and len(folders) >= 2, folders
    history = [c for c in table.history() if c.get("operation") == "WRITE"]
    assert history and all("laminar.transactions" in c for c in history)


def _table_files(roles: Roles) -> dict[str, list[str]]:
    """The table's data files by the folder they are in (keys under the store's prefix)."""
    out: dict[str, list[str]] = {}
    marker = f"{BUCKET}/{PREFIX}/"
    for uri in _table(roles, "admin").file_uris():
        key = uri.split(marker, 1)[1]
        out.setdefault(key.rsplit("/", 2)[-2], []).append(key)
    return out


def test_a_nodes_keys_write_the_table_only_in_its_log_and_its_own_folder(
    table_roles: Roles, scenario: Scenario
) -> None:
    r = table_roles
    files = _table_files(r)
    attacker = next(n for n in NODES if any(f != keys.table_node_folder(n).rstrip("/") for f in files))
    others = [k for f, ks in files.items() if f != keys.table_node_folder(attacker).rstrip("/") for k in ks]
    victim_file = others[0]
    victim_etag = r.raw("admin").head_object(Bucket=BUCKET, Key=_full(victim_file))["ETag"]
    role = node_role(attacker)
    raw = r.raw(role)
    own = keys.OUTPUT_TABLE_PREFIX + keys.table_node_folder(attacker)
    another = keys.OUTPUT_TABLE_PREFIX + keys.table_node_folder(next(n for n in NODES if n != attacker))

    def put(key: str, **condition: Any) -> Callable[[], object]:
        return functools.partial(raw.put_object, Bucket=BUCKET, Key=_full(key), Body=b"PAR1", **condition)

    cases: list[tuple[str, Callable[[], object], str]] = [
        ("rewrite where the table is (tables/output.json)", put(keys.OUTPUT_TABLE_KEY), "denied (403)"),
        ("write elsewhere under tables/", put(f"{keys.TABLES_PREFIX}other/part-0.parquet"), "denied (403)"),
        ("write a data file at the table's root", put(f"{TABLE}part-0.parquet", IfNoneMatch="*"), "denied (403)"),
        ("write into another node's folder", put(f"{another}part-0.parquet", IfNoneMatch="*"), "denied (403)"),
        ("overwrite another node's committed data file", put(victim_file), "denied (403)"),
        (
            "delete another node's committed data file",
            functools.partial(raw.delete_object, Bucket=BUCKET, Key=_full(victim_file)),
            "denied (403)",
        ),
        ("write outside tables/", put("outside/part-0.parquet"), "denied (403)"),
        ("write its own folder", put(f"{own}probe.parquet", IfNoneMatch="*"), "allowed"),
        ("write a log object", put(f"{keys.OUTPUT_TABLE_LOG_PREFIX}_probe.json.tmp", IfNoneMatch="*"), "allowed"),
        (
            "read another node's committed data file",
            functools.partial(raw.get_object, Bucket=BUCKET, Key=_full(victim_file)),
            "allowed",
        ),
    ]
    wrong = [f"{role}: {what}: {got}, expected {want}" for what, call, want in cases if (got := _outcome(call)) != want]
    admin = r.raw("admin")
    for probe in (f"{own}probe.parquet", f"{keys.OUTPUT_TABLE_LOG_PREFIX}_probe.json.tmp"):
        admin.delete_object(Bucket=BUCKET, Key=_full(probe))
    assert not wrong, "\n".join(wrong)
    # The committed file is as it was, and the table still holds every committed batch once.
    assert admin.head_object(Bucket=BUCKET, Key=_full(victim_file))["ETag"] == victim_etag
    assert json.loads(r.laminar(AUDITOR_ROLE, "table", "audit", "--json"))["ok"]
    assert table_location(r.store("admin")).uri.endswith(keys.OUTPUT_TABLE_PREFIX.rstrip("/"))
