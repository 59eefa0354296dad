"""Least privilege the store enforces: each role runs with its own IAM keys on an authenticating server.

moto's server with authentication on checks every request's signature and its
IAM Action/Resource against the signer's policies, which are the ones
`laminar policies` renders. A whole scenario runs with each process on its own
role's keys: the control plane (`init`, `rebalance`, `migrate`, `failover`,
from a profile), the nodes (processes, from environment variables), the
producer and the auditor (`verify`, `sweep`, `status`). Then every forbidden
action is tried with a role's keys, through the project's store code and with
raw boto3, and must answer 403.

moto evaluates neither Condition blocks nor bucket policies: the rules only S3
enforces (conditional-write headers, ListBucket by prefix, no deletes of the
ledger, manifests or source) are checked on the rendered documents, by a small
evaluator of IAM's semantics (`tests/iam.py`), in `tests/protocol/test_capabilities.py`.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from botocore.exceptions import ClientError

from laminar_dev.localcluster import stop_processes, wait_until
from laminar_dev.s3server import AccessKey, create_iam_user, start_s3_server
from laminar_orchestration.dataplane.checkpoint import OutputWriter
from laminar_orchestration.identity import MAX_PARTITIONS, NodeId, PartitionId
from laminar_orchestration.protocol import keys
from laminar_orchestration.protocol.capabilities import (
    AUDITOR_ROLE,
    CAS_PATTERNS,
    CONTROL_PLANE_ROLE,
    CREATE_ONLY_PATTERNS,
    PRODUCER_ROLE,
    OutputCommitter,
    manifest_key,
    node_role,
    storage_policies,
)
from laminar_orchestration.protocol.chain import ManifestReader, ManifestVersion
from laminar_orchestration.protocol.desired_states import DesiredStates
from laminar_orchestration.protocol.fencing import PartitionGuard
from laminar_orchestration.protocol.ledger import Ledger, NotReleased
from laminar_orchestration.protocol.manifest import SHA256_METADATA, ArtifactRef, PartitionManifest
from laminar_orchestration.protocol.producers import generate_events
from laminar_orchestration.protocol.records import PartitionStatus, ReleaseRecord, now
from laminar_orchestration.protocol.signing import SigningKey, sign_record
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import ObjectStore, PreconditionFailed, StoreUnavailable
from laminar_orchestration.store.s3 import S3ObjectStore
from laminar_orchestration.table import table_status
from laminar_orchestration.ulid import next_ulid
from tests.iam import BUCKET, NODES, PREFIX, like, own_keys, spanning_keys

STORE_URL = f"s3://{BUCKET}/{PREFIX}"
HEARTBEAT_TIMEOUT_S = 2.0
REPO = Path(__file__).resolve().parents[2]
P, N = PartitionId, NodeId
_CLEARED = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")


@dataclass
class Roles:
    """The authenticating server, each role's key, and how a process of each role is started."""

    endpoint: str
    admin: AccessKey
    keys: dict[str, AccessKey]
    credentials_file: Path
    workdir: Path
    nodes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    stores: dict[str, S3ObjectStore] = field(default_factory=dict)
    clients: dict[str, Any] = field(default_factory=dict)

    def env(self, role: str) -> dict[str, str]:
        """A process of `role`: nodes get their key as environment variables, the rest a profile."""
        env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
        env["AWS_ENDPOINT_URL"] = self.endpoint
        env["PYTHONPATH"] = str(REPO)
        if role.startswith("node-"):
            env.update(self.keys[role].environ())
        else:
            env["AWS_PROFILE"] = role
            env["AWS_SHARED_CREDENTIALS_FILE"] = str(self.credentials_file)
        return env

    def laminar(self, role: str, *args: str) -> str:
        """Run `laminar ARGS --store URL` as `role`; its stdout (fails the test on a non-zero exit)."""
        done = subprocess.run(
            [sys.executable, "-m", "laminar_orchestration.cli", *args, "--store", STORE_URL],
            env=self.env(role),
            capture_output=True,
            text=True,
            timeout=120,
            cwd=self.workdir,
        )
        assert done.returncode == 0, f"laminar {' '.join(args)} as {role}: exit {done.returncode}\n{done.stderr}"
        return done.stdout

    def start_node(self, node: int) -> None:
        log = open(self.workdir / f"node{node}-{time.monotonic_ns()}.log", "wb")  # noqa: SIM115 - lives with the process
        self.nodes[node] = subprocess.Popen(
            [sys.executable, "-m", "laminar_dev.arrownode", "--store", STORE_URL, "--node-id", str(node),
             "--heartbeat-timeout", str(HEARTBEAT_TIMEOUT_S), "--table-sync-interval", "1"],
            env=self.env(node_role(node)), stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
        )  # fmt: skip

    def store(self, role: str) -> S3ObjectStore:
        """The project's S3 store signing with `role`'s key only."""
        if role not in self.stores:
            self.stores[role] = S3ObjectStore(BUCKET, PREFIX, client=self.raw(role))
        return self.stores[role]

    def raw(self, role: str) -> Any:
        """A raw boto3 S3 client signing with `role`'s key only."""
        if role not in self.clients:
            self.clients[role] = self.keys[role].client("s3", self.endpoint)
        return self.clients[role]


@pytest.fixture(scope="module")
def roles(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Roles]:
    workdir = tmp_path_factory.mktemp("least-privilege")
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
        r = Roles(endpoint, admin, role_keys, credentials, workdir)
        r.keys["admin"] = admin
        try:
            yield r
        finally:
            stop_processes(r.nodes.values(), timeout_s=20)


# --- the scenario: every step on the role's own keys -----------------------------------------------


@dataclass
class ScenarioResult:
    #: The node that was killed and failed over (its keys still work: a zombie's).
    victim: int
    zombie_output: str
    swept: list[str]
    audit: list[dict[str, Any]]
    #: `verify`'s audit of the output table the nodes kept (None: there was none).
    table_audit: dict[str, Any] | None


def committed(admin: ObjectStore) -> bool:
    ledger, log, reader = Ledger(admin), SourceLog(admin), ManifestReader(admin)
    for p in ledger.partitions():
        current = reader.current(p)
        if (current.manifest.source_offset if current else 0) != log.end_offset(p):
            return False
    return True


def table_caught_up(admin: ObjectStore) -> bool:
    status = table_status(admin)
    return status.exists and status.lag_batches == 0


def alive(admin: ObjectStore) -> set[int]:
    return {v.record.node for v in Ledger(admin).members.nodes() if v.alive}


@pytest.fixture(scope="module")
def scenario(roles: Roles) -> ScenarioResult:
    admin = roles.store("admin")  # the test's own view: reads only
    ledger = Ledger(admin)
    roles.laminar(CONTROL_PLANE_ROLE, "init", "--partitions", "2")
    for n in NODES:
        roles.start_node(n)
    wait_until(lambda: alive(admin) == set(NODES), 60, "three live nodes")
    roles.laminar(CONTROL_PLANE_ROLE, "rebalance")  # admits the nodes, places both partitions
    assert ledger.members.record().members == list(NODES)
    roles.laminar(PRODUCER_ROLE, "produce", "--count", "3000", "--keys", "30")
    wait_until(lambda: committed(admin), 60, "the first load committed")

    # A graceful move: the control plane grants the target once the old owner released.
    own0 = ledger.ownership(P(0))
    assert own0 is not None
    target = next(n for n in NODES if n != own0.owner)
    roles.laminar(CONTROL_PLANE_ROLE, "migrate", "--partition", "0", "--to", str(target))
    moved = ledger.ownership(P(0))
    assert moved is not None and moved.owner == target and moved.epoch == own0.epoch + 1
    grant = ledger.grant(P(0), moved.epoch)
    assert grant is not None and "migration" in grant.reason  # made by the control plane, not by the node

    # A restart re-adopts the node's epoch: no new grant, a seal at its newer generation.
    roles.nodes[target].kill()
    roles.nodes[target].wait()
    roles.start_node(target)

    def readopted() -> bool:
        current = ManifestReader(admin).current(P(0))
        record = ledger.members.node(N(target))
        return (
            current is not None
            and record is not None
            and record.generation == 2
            and current.manifest.generation == 2
            and current.manifest.fencing_token == moved.epoch
        )

    wait_until(readopted, 60, f"node {target} to re-adopt partition 0 after its restart")
    own = ledger.ownership(P(0))
    assert own is not None and own.epoch == moved.epoch and own.owner == target

    # A failover: the owner of partition 1 dies; before it does, it holds a token a zombie would write with.
    own1 = ledger.ownership(P(1))
    assert own1 is not None
    victim = int(own1.owner)
    zombie_guard = PartitionGuard(Ledger(roles.store(node_role(victim))).adopt(P(1), N(victim)))
    roles.nodes[victim].kill()
    roles.nodes[victim].wait()
    wait_until(lambda: victim not in alive(admin), 30, f"node {victim} to be seen dead")
    roles.laminar(CONTROL_PLANE_ROLE, "failover", "--node", str(victim))
    after = ledger.ownership(P(1))
    assert after is not None and after.owner != victim and after.epoch == own1.epoch + 1
    # The zombie's late output lands (its keys may write output) but no manifest will ever name it.
    zombie_ref = OutputWriter(OutputCommitter(roles.store(node_role(victim)))).write(
        zombie_guard, pa.table({"key": ["z"], "value": [1.0]}), 0, 1
    )

    roles.laminar(PRODUCER_ROLE, "produce", "--count", "1000", "--keys", "30")
    wait_until(lambda: committed(admin), 60, "the second load committed")
    # The nodes keep the output table with their own keys (every second here).
    wait_until(lambda: table_caught_up(admin), 60, "the output table to hold every committed batch")
    audit = json.loads(roles.laminar(AUDITOR_ROLE, "verify", "--json"))
    swept = json.loads(roles.laminar(AUDITOR_ROLE, "sweep", "--grace-s", "0", "--json"))
    audits = audit if isinstance(audit, list) else audit.get("partitions", [audit])
    table_audit = audit.get("output_table") if isinstance(audit, dict) else None
    return ScenarioResult(victim, zombie_ref.key, list(swept["deleted"]), audits, table_audit)


@pytest.mark.processes
@pytest.mark.slow
def test_a_whole_scenario_runs_with_each_process_on_its_own_roles_keys(roles: Roles, scenario: ScenarioResult) -> None:
    assert scenario.audit, "verify printed no audit"
    for audit in scenario.audit:  # `verify` also exited 0
        assert audit["duplicates"] == 0 and audit["losses"] == 0 and not audit["issues"], audit
    # The nodes wrote the output table with their keys: every committed batch in it once.
    assert scenario.table_audit is not None and scenario.table_audit["ok"], scenario.table_audit
    assert scenario.zombie_output in scenario.swept  # the auditor's sweep may delete what nobody references
    assert roles.store("admin").head(scenario.zombie_output) is None


# --- the forbidden actions: 403 through the store code and with raw boto3 ---------------------------


@dataclass(frozen=True)
class Attempt:
    """One action of one role: through the project's code, and the same request with raw boto3."""

    role: str
    action: str
    project: Callable[[Roles], object]
    raw: Callable[[Roles], object]
    allowed: bool = False
    note: str = ""


def _full(key: str) -> str:
    return f"{PREFIX}/{key}"


def _create(role: str, key: str) -> tuple[Callable[[Roles], object], Callable[[Roles], object]]:
    return (
        lambda r: r.store(role).put_if_absent(key, b"{}"),
        lambda r: r.raw(role).put_object(Bucket=BUCKET, Key=_full(key), Body=b"{}", IfNoneMatch="*"),
    )


def _swap(role: str, key: str) -> tuple[Callable[[Roles], object], Callable[[Roles], object]]:
    # The store code swaps by ETag; raw boto3 overwrites blindly with garbage (what the attack did).
    return (
        lambda r: r.store(role).put_if_match(key, b"{}", r.store("admin").get(key).etag),
        lambda r: r.raw(role).put_object(Bucket=BUCKET, Key=_full(key), Body=b"not json"),
    )


def _rewrite(role: str, key: str) -> tuple[Callable[[Roles], object], Callable[[Roles], object]]:
    # An allowed swap, done the way the code does it (same bytes, If-Match): the record stays valid.
    def project(r: Roles) -> object:
        obj = r.store("admin").get(key)
        return r.store(role).put_if_match(key, obj.data, obj.etag)

    def raw(r: Roles) -> object:
        obj = r.store("admin").get(key)
        return r.raw(role).put_object(Bucket=BUCKET, Key=_full(key), Body=obj.data, IfMatch=f'"{obj.etag}"')

    return project, raw


def _delete(role: str, key: str) -> tuple[Callable[[Roles], object], Callable[[Roles], object]]:
    return (
        lambda r: r.store(role).delete_if_match(key, r.store("admin").get(key).etag),
        lambda r: r.raw(role).delete_object(Bucket=BUCKET, Key=_full(key)),
    )


def _read(role: str, key: str) -> tuple[Callable[[Roles], object], Callable[[Roles], object]]:
    return (lambda r: r.store(role).get(key), lambda r: r.raw(role).get_object(Bucket=BUCKET, Key=_full(key)))


def _attempt(
    role: str, action: str, how: tuple[Callable[[Roles], object], Callable[[Roles], object]], **kw: Any
) -> Attempt:
    return Attempt(role, action, how[0], how[1], **kw)


def _some_key(admin: ObjectStore, prefix: str) -> str:
    return next(iter(admin.list(prefix)))


def _written_by_another_node(admin: ObjectStore, prefix: str, node: int) -> str:
    """A stored data object (output or checkpoint) that a node other than `node` wrote."""
    return next(k for k in admin.list(prefix) if keys.parse_fenced_object_key(k).node != node)


def attempts(r: Roles, victim: int) -> list[Attempt]:
    admin = r.store("admin")
    ledger = Ledger(admin)
    own = ledger.ownership(P(0))
    assert own is not None
    owner = int(own.owner)
    other = next(n for n in NODES if n != owner)
    node = node_role(owner)
    future = own.epoch + 100
    output = _some_key(admin, keys.sink_partition_prefix(0))
    checkpoint = _some_key(admin, keys.checkpoint_partition_prefix(1))
    segment = keys.segment_key(0, 0)
    ulid = next_ulid()
    fake_output = keys.output_object_key(1, owner, future, 0, 1, ulid)
    fake_checkpoint = keys.delta_key(1, owner, future, ulid)
    # Data objects another node wrote, and new ones under that node's keys.
    others_checkpoint = _written_by_another_node(admin, keys.CHECKPOINTS_PREFIX, owner)
    others_output = _written_by_another_node(admin, keys.SINK_PREFIX, owner)
    as_other = keys.parse_fenced_object_key(others_checkpoint).node
    cp, producer, auditor = CONTROL_PLANE_ROLE, PRODUCER_ROLE, AUDITOR_ROLE
    return [
        # A node: takes nothing it was not granted, rewrites no ledger record but its own.
        _attempt(node, "create a grant (take a partition)", _create(node, keys.grant_key(0, own.epoch + 1))),
        Attempt(
            node,
            "Ledger.fence to itself (the project's grant path)",
            lambda r: Ledger(r.store(node)).fence(P(0), N(owner), expected_epoch=own.epoch, reason="attack"),
            _create(node, keys.grant_key(0, own.epoch + 1))[1],
        ),
        _attempt(node, "rewrite the ownership head", _swap(node, keys.ownership_head_key(0))),
        _attempt(node, "delete a grant", _delete(node, keys.grant_key(0, 1))),
        _attempt(node, "rewrite desired.json", _swap(node, keys.desired_state_key(0))),
        Attempt(
            node,
            "DesiredStates.update (the project's path)",
            lambda r: DesiredStates(Ledger(r.store(node))).update(
                P(1), lambda s: s.model_copy(update={"owner": owner})
            ),
            _swap(node, keys.desired_state_key(1))[1],
        ),
        _attempt(node, "rewrite cluster.json", _swap(node, keys.CLUSTER_KEY)),
        _attempt(node, "rewrite membership.json", _swap(node, keys.MEMBERSHIP_KEY)),
        _attempt(node, "overwrite another node's record", _swap(node, keys.node_key(other))),
        _attempt(node, "append to the source log", _create(node, keys.segment_key(0, 10**12))),
        _attempt(node, "delete an output file", _delete(node, output)),
        _attempt(node, "delete a checkpoint object", _delete(node, checkpoint)),
        _attempt(
            node_role(other),
            "read another node's grant signing key",
            _read(node_role(other), keys.signing_key_key(owner, 0, own.epoch)),
        ),
        _attempt(
            node, "read its own grant signing key", _read(node, keys.signing_key_key(owner, 0, own.epoch)), allowed=True
        ),
        _attempt(
            node_role(victim),
            "write its own node record",
            _rewrite(node_role(victim), keys.node_key(victim)),
            allowed=True,
        ),
        _attempt(
            node,
            "write another partition's checkpoint under its own node",
            _create(node, fake_checkpoint),
            allowed=True,
            note="static policies cannot follow ownership: only what a signed manifest names counts",
        ),
        _attempt(node, "overwrite another node's checkpoint object", _swap(node, others_checkpoint)),
        _attempt(node, "overwrite another node's output file", _swap(node, others_output)),
        _attempt(
            node,
            "create a checkpoint object under another node",
            _create(node, keys.delta_key(0, as_other, own.epoch, ulid)),
        ),
        _attempt(
            node,
            "create an output file under another node",
            _create(node, keys.output_object_key(0, as_other, own.epoch, 0, 1, ulid)),
        ),
        # The control plane: grants and heads, never a node's record, data or the source.
        _attempt(cp, "overwrite a node's heartbeat record", _swap(cp, keys.node_key(owner))),
        Attempt(
            cp,
            "Membership.register_node (a node's join)",
            lambda r: Ledger(r.store(cp)).members.register_node(N(owner)),
            _swap(cp, keys.node_key(owner))[1],
        ),
        _attempt(cp, "record a release", _create(cp, keys.release_key(0, future))),
        _attempt(cp, "write an output file", _create(cp, fake_output)),
        _attempt(cp, "write a checkpoint object", _create(cp, fake_checkpoint)),
        _attempt(cp, "append to the source log", _create(cp, keys.segment_key(0, 10**12))),
        _attempt(cp, "delete a grant", _delete(cp, keys.grant_key(0, 1))),
        _attempt(cp, "create a grant", _create(cp, keys.grant_key(1, future)), allowed=True),
        # The producer: appends, never deletes or rewrites the log, touches nothing else.
        _attempt(producer, "delete a committed segment", _delete(producer, segment)),
        _attempt(producer, "create a grant", _create(producer, keys.grant_key(0, future))),
        _attempt(producer, "write a manifest entry", _create(producer, keys.manifest_history_key(0, 10**6))),
        _attempt(producer, "write an output file", _create(producer, fake_output)),
        _attempt(producer, "rewrite the ownership head", _swap(producer, keys.ownership_head_key(0))),
        _attempt(producer, "append to the source log", _create(producer, keys.segment_key(1, 10**12)), allowed=True),
        _attempt(producer, "read a grant signing key", _read(producer, keys.signing_key_key(owner, 0, own.epoch))),
        # The auditor: reads, lists, deletes unreferenced fenced objects; writes nothing.
        _attempt(auditor, "create a grant", _create(auditor, keys.grant_key(0, future))),
        _attempt(auditor, "write a manifest entry", _create(auditor, keys.manifest_history_key(0, 10**6))),
        _attempt(auditor, "append to the source log", _create(auditor, keys.segment_key(0, 10**12))),
        _attempt(auditor, "overwrite a node's record", _swap(auditor, keys.node_key(owner))),
        _attempt(auditor, "delete a grant", _delete(auditor, keys.grant_key(0, 1))),
        _attempt(auditor, "delete a manifest entry", _delete(auditor, keys.manifest_history_key(0, 1))),
        _attempt(auditor, "delete a committed segment", _delete(auditor, segment)),
        _attempt(auditor, "read a grant signing key", _read(auditor, keys.signing_key_key(owner, 0, own.epoch))),
    ]


def _outcome(call: Callable[[], object]) -> str:
    try:
        call()
    except PreconditionFailed:
        return "allowed"  # authorized; only its condition failed (the object exists)
    except StoreUnavailable as exc:
        if "refused" in str(exc):
            return "denied (403)"
        raise
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status == 403:
            return "denied (403)"
        if status == 412:
            return "allowed"  # authorized; only its condition failed
        raise
    return "allowed"


@pytest.mark.processes
def test_every_forbidden_action_is_denied_with_the_roles_keys(roles: Roles, scenario: ScenarioResult) -> None:
    admin = roles.store("admin")
    rows: list[tuple[str, str, str, str, str]] = []
    wrong: list[str] = []
    watched = (keys.grant_key(0, 1), keys.ownership_head_key(0), keys.desired_state_key(0), keys.segment_key(0, 0))
    before = {k: admin.head(k) for k in watched}
    for attempt in attempts(roles, scenario.victim):
        project = _outcome(functools.partial(attempt.project, roles))
        raw = _outcome(functools.partial(attempt.raw, roles))
        expected = "allowed" if attempt.allowed else "denied (403)"
        if project != expected or raw != expected:
            wrong.append(f"{attempt.role}: {attempt.action}: project code {project}, raw boto3 {raw}")
        rows.append((attempt.role, attempt.action, project, raw, attempt.note))
    # Nothing the denied attempts aimed at changed (the allowed ones aim elsewhere).
    assert {k: admin.head(k) for k in watched} == before
    write_matrix(roles.workdir, rows)
    assert not wrong, "\n".join(wrong)
    # The ledger still reads cleanly after every attempt.
    assert committed(admin)


def _verify_as_auditor(roles: Roles) -> tuple[int, list[dict[str, Any]]]:
    """`laminar verify --json` with the auditor's keys: its exit code and the per-partition audits."""
    done = subprocess.run(
        [sys.executable, "-m", "laminar_orchestration.cli", "verify", "--json", "--store", STORE_URL],
        env=roles.env(AUDITOR_ROLE), capture_output=True, text=True, timeout=120, cwd=roles.workdir,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    audit = json.loads(done.stdout)
    return done.returncode, audit if isinstance(audit, list) else audit.get("partitions", [audit])


def _forge(role: str, r: Roles, key: str, body: bytes, **condition: Any) -> None:
    """A write with `role`'s own keys and raw boto3, the way an attacker holding them would."""
    r.raw(role).put_object(Bucket=BUCKET, Key=_full(key), Body=body, **condition)


@pytest.mark.processes
def test_another_nodes_keys_forge_nothing_into_a_partitions_chain(roles: Roles, scenario: ScenarioResult) -> None:
    """Node B's keys may write under partition 0's ``manifests/`` and release keys (static policies
    cannot follow ownership): forged entries, a forged pointer and a forged release are written
    there, and none of it counts: the owner keeps committing past them, the control plane sees no
    release, a new owner restores the genuine chain, and `verify` reports the forgeries and counts
    nothing they name."""
    admin = roles.store("admin")
    ledger = Ledger(admin)
    own = ledger.ownership(P(0))
    assert own is not None and own.status == PartitionStatus.ACTIVE
    owner = int(own.owner)
    attacker = next(n for n in sorted(alive(admin)) if n != owner)
    role = node_role(attacker)
    current = ManifestReader(admin).current(P(0))
    assert current is not None and current.manifest.fencing_token == own.epoch

    # (3) The owner's grant key cannot be read with the attacker's keys.
    with pytest.raises(ClientError) as denied:
        roles.raw(role).get_object(Bucket=BUCKET, Key=_full(keys.signing_key_key(owner, 0, own.epoch)))
    assert denied.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    # What it can sign with: a key of one of its own grants (genuine, but not partition 0's at this epoch).
    own_keys = list(admin.list(keys.node_signing_keys_prefix(attacker)))
    assert own_keys, f"node {attacker} never held a grant"
    stolen = roles.store(role).get(own_keys[-1])
    assert stolen is not None
    signer = SigningKey.model_validate_json(stolen.data)

    # An output file under partition 0 (allowed by the static policy), for the forged entries to name.
    m = current.manifest
    fake_key = keys.output_object_key(0, attacker, own.epoch + 1, m.source_offset, m.source_offset + 1, next_ulid())
    fake_body = b"forged output"
    _forge(role, roles, fake_key, fake_body, IfNoneMatch="*", Metadata={SHA256_METADATA: sha256(fake_body).hexdigest()})
    fake_ref = ArtifactRef(key=fake_key, size=len(fake_body), sha256=sha256(fake_body).hexdigest())

    def forged_entry(seq: int, token: int, node: int) -> bytes:
        entry = m.model_copy(
            update={
                "seq": seq,
                "fencing_token": token,
                "node": node,
                "commit_ulid": next_ulid(m.commit_ulid),
                "parent_hash": current.raw_hash,
                "source_offset": m.source_offset + 10**6,
                "events_applied": m.events_applied + 10**6,
                "outputs": [fake_ref],
                "note": "",
                "signature": None,
            }
        )
        return sign_record(entry, signer).model_dump_json().encode()

    # (1) An entry claiming a higher token, and one claiming the owner's own epoch; the pointer onto it.
    # (The owner may commit meanwhile, e.g. a snapshot: then the forgeries go after its entries.)
    free = m.seq + 1
    while True:
        while admin.head(keys.manifest_history_key(0, free)) is not None:
            free += 1
        higher, same_epoch = forged_entry(free, own.epoch + 1, attacker), forged_entry(free + 1, own.epoch, owner)
        try:
            _forge(role, roles, keys.manifest_history_key(0, free), higher, IfNoneMatch="*")
            _forge(role, roles, keys.manifest_history_key(0, free + 1), same_epoch, IfNoneMatch="*")
            break
        except ClientError as exc:
            assert exc.response["ResponseMetadata"]["HTTPStatusCode"] == 412, exc
    pointer = admin.get(keys.manifest_pointer_key(0))
    assert pointer is not None
    _forge(role, roles, keys.manifest_pointer_key(0), same_epoch, IfMatch=f'"{pointer.etag}"')
    # (2) A release of the owner's epoch, as if the owner had handed the partition over.
    release = ReleaseRecord(
        partition=0, epoch=own.epoch, node=owner, commit_ulid=m.commit_ulid, source_offset=m.source_offset,
        released_at=now(),
    )  # fmt: skip
    _forge(role, roles, keys.release_key(0, own.epoch), sign_record(release, signer).model_dump_json().encode(),
           IfNoneMatch="*")  # fmt: skip

    # Readers pass over all of it.
    reader = ManifestReader(admin)
    seen = reader.current(P(0))
    assert seen is not None and (seen.manifest.fencing_token, seen.manifest.node) == (own.epoch, owner)
    assert seen.manifest.source_offset == m.source_offset and fake_key not in {o.key for o in seen.manifest.outputs}
    assert {keys.manifest_history_key(0, free), keys.manifest_history_key(0, free + 1)} <= set(reader.forged)
    # No release: a graceful move cannot be granted, the partition stays active with its owner.
    control_plane = Ledger(roles.store(CONTROL_PLANE_ROLE))
    assert control_plane.release_record(P(0), own.epoch) is None
    still = control_plane.ownership(P(0))
    assert still is not None and (still.owner, still.epoch, still.status) == (owner, own.epoch, PartitionStatus.ACTIVE)
    with pytest.raises(NotReleased):
        control_plane.acquire(P(0), N(attacker), expected_epoch=own.epoch, reason="attack")

    # The owner keeps committing, past the forged sequence numbers.
    roles.laminar(PRODUCER_ROLE, "produce", "--count", "600", "--keys", "30")
    wait_until(lambda: committed(admin), 60, "the load after the forgery committed")
    after = ManifestReader(admin).current(P(0))
    assert after is not None and after.manifest.seq > free + 1
    assert (after.manifest.fencing_token, after.manifest.node) == (own.epoch, owner)
    assert after.manifest.source_offset == SourceLog(admin).end_offset(P(0))

    # A new owner (a forced move: the owner cannot release past the forged release) restores the genuine chain.
    roles.laminar(CONTROL_PLANE_ROLE, "failover", "--node", str(owner), "--force")
    moved = ledger.ownership(P(0))
    assert moved is not None and moved.owner != owner and moved.epoch == own.epoch + 1
    roles.laminar(PRODUCER_ROLE, "produce", "--count", "600", "--keys", "30")
    wait_until(lambda: committed(admin), 60, "the load after the forced move committed")

    # The audit reports the forgeries and counts nothing they name: no loss, no duplicate, right state.
    code, audits = _verify_as_auditor(roles)
    assert code == 1  # issues found: the forgeries
    for a in audits:
        assert a["duplicates"] == 0 and a["losses"] == 0, a
        kinds = {i["kind"] for i in a["issues"]}
        assert kinds == ({"forged"} if a["partition"] == 0 else set()), a
    history = [v.manifest for v in ManifestReader(admin).history(P(0))]
    assert all(fake_key not in {o.key for o in h.outputs} for h in history)


@pytest.mark.processes
def test_a_former_owners_signed_entries_after_the_seal_stop_no_reader(roles: Roles, scenario: ScenarioResult) -> None:
    """The failed-over node still holds its keys and its old epoch's signing key (its own grant keys
    stay readable to it): entries it signs after the seal, through the project's store code and with
    raw boto3, are void. The new owner keeps committing past them, a fresh reader and the new owner's
    restore find the genuine chain, and `verify` reports them (`superseded`) and counts nothing."""
    admin = roles.store("admin")
    ledger = Ledger(admin)
    zombie = scenario.victim
    role = node_role(zombie)
    own = ledger.ownership(P(1))
    assert own is not None and own.owner != zombie
    old_grants = [g for g in ledger.grants(P(1)) if g.node == zombie]
    assert old_grants, f"node {zombie} never held partition 1"
    old_epoch = old_grants[-1].epoch
    key_object = roles.store(role).get(keys.signing_key_key(zombie, 1, old_epoch))
    assert key_object is not None
    signer = SigningKey.model_validate_json(key_object.data)

    def stale_after(version: ManifestVersion, seq: int) -> PartitionManifest:
        m = version.manifest
        entry = m.model_copy(
            update={
                "seq": seq,
                "fencing_token": old_epoch,
                "node": zombie,
                "generation": 1,
                "commit_ulid": next_ulid(m.commit_ulid),
                "parent_hash": version.raw_hash,
                "source_offset": m.source_offset + 10**6,
                "events_applied": m.events_applied + 10**6,
                "note": "",
                "signature": None,
            }
        )
        return sign_record(entry, signer)

    planted: list[str] = []
    for how in ("project store code", "raw boto3"):
        while True:
            chain = ManifestReader(admin).read_chain(P(1))
            head = chain.version
            assert head is not None and head.manifest.fencing_token == own.epoch
            # Past every entry written: the one planted before is void, but it holds its number.
            stale = stale_after(head, chain.next_seq)
            key = keys.manifest_history_key(1, stale.seq)
            body = stale.model_dump_json().encode()
            try:
                if how == "raw boto3":
                    _forge(role, roles, key, body, IfNoneMatch="*")
                else:
                    OutputCommitter(roles.store(role)).create_manifest(manifest_key(key), body)
                break
            except (ClientError, PreconditionFailed):
                continue  # the owner committed meanwhile: after its newest entry, then
        planted.append(key)
        pointer = admin.get(keys.manifest_pointer_key(1))
        assert pointer is not None
        _forge(role, roles, keys.manifest_pointer_key(1), body, IfMatch=f'"{pointer.etag}"')

        reader = ManifestReader(admin)
        seen = reader.current(P(1))
        assert seen is not None and seen.manifest.fencing_token == own.epoch and key in reader.superseded

    # The owner keeps committing, past the stale entries.
    roles.laminar(PRODUCER_ROLE, "produce", "--count", "600", "--keys", "30")
    wait_until(lambda: committed(admin), 60, "the load after the stale entries committed")
    after = ManifestReader(admin).current(P(1))
    assert after is not None and after.manifest.fencing_token == own.epoch
    assert after.manifest.source_offset == SourceLog(admin).end_offset(P(1))

    # A restore of the chain by a new owner (a forced move) finds the genuine state.
    roles.laminar(CONTROL_PLANE_ROLE, "failover", "--node", str(own.owner), "--force")
    roles.laminar(PRODUCER_ROLE, "produce", "--count", "600", "--keys", "30")
    wait_until(lambda: committed(admin), 60, "the load after the forced move committed")

    _, audits = _verify_as_auditor(roles)
    for a in audits:
        assert a["duplicates"] == 0 and a["losses"] == 0, a
        if a["partition"] == 1:
            superseded = [i for i in a["issues"] if i["kind"] == "superseded"]
            assert {i["kind"] for i in a["issues"]} == {"superseded"} and len(superseded) == len(planted), a


def write_matrix(workdir: Path, rows: Sequence[tuple[str, str, str, str, str]]) -> None:
    lines = ["| role | action | project's store code | raw boto3 |", "|---|---|---|---|"]
    for role, action, project, raw, note in rows:
        lines.append(f"| {role} | {action}{f' ({note})' if note else ''} | {project} | {raw} |")
    text = "\n".join(lines)
    (workdir / "least-privilege-matrix.md").write_text(text + "\n")
    print("\n" + text)


# --- what the authenticating server enforces on the rendered documents -----------------------


def test_a_nodes_keys_create_nothing_under_another_nodes_prefix(roles: Roles) -> None:
    """On the authenticating server: node 1's keys cannot create an object whose key runs from a
    partition segment into node 2's prefix (and back to a name of node 1's), nor into the grants or
    a manifest pointer; they still create every kind of data object of node 1's own."""
    role = node_role(1)
    wrong: list[str] = []
    created: list[str] = []
    try:
        for key in spanning_keys(1, 2):
            for how, call in zip(("project", "raw"), _create(role, key), strict=True):
                outcome = _outcome(functools.partial(call, roles))
                if outcome != "denied (403)":
                    wrong.append(f"{how}: {key}: {outcome}")
                    created.append(key)
        for key in (*own_keys(1), keys.release_key(MAX_PARTITIONS - 1, 10**9)):
            created.append(key)
            for how, call in zip(("project", "raw"), _create(role, key), strict=True):
                outcome = _outcome(functools.partial(call, roles))
                if outcome != "allowed":
                    wrong.append(f"{how}: {key}: {outcome}")
    finally:
        for key in created:  # the test's own objects: nothing for the scenario's audit to find
            roles.raw("admin").delete_object(Bucket=BUCKET, Key=_full(key))
    assert not wrong, "\n".join(wrong)


def test_the_store_code_sends_a_condition_with_every_put(roles: Roles) -> None:
    """The bucket policy's conditions hold for everything the code writes: every PUT carries
    If-None-Match or If-Match, and a create-only key always If-None-Match."""
    sent: list[tuple[str, bool, bool]] = []

    def record(params: dict[str, Any], **_: Any) -> None:
        sent.append((str(params["Key"]), "IfNoneMatch" in params, "IfMatch" in params))

    client = roles.admin.client("s3", roles.endpoint)
    client.meta.events.register("provide-client-params.s3.PutObject", record)
    store = S3ObjectStore(BUCKET, "conditions", client=client)
    ledger = Ledger(store)
    ledger.init_cluster(1)
    handle = ledger.members.register_node(N(1))
    handle.heartbeat()
    ledger.members.admit_nodes()
    token = ledger.acquire(P(0), N(1), expected_epoch=0, reason="test")
    DesiredStates(ledger).update(P(0), lambda s: s.model_copy(update={"owner": 1}))
    SourceLog(store).append(0, generate_events(10, 2, seed=1, partitions=1)[0])
    ledger.release(token, commit_ulid=None, source_offset=0)
    assert len(sent) >= 8
    for key, if_none_match, if_match in sent:
        relative = key.removeprefix("conditions/")
        assert if_none_match or if_match, key
        if any(like(p, relative) for p in CREATE_ONLY_PATTERNS):
            assert if_none_match, key
        assert any(like(p, relative) for p in (*CREATE_ONLY_PATTERNS, *CAS_PATTERNS)), key
