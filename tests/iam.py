"""IAM's evaluation rules, small enough to read, for the documents `laminar policies` renders.

moto evaluates neither Condition blocks nor bucket policies, so the rules only S3 enforces
(conditional-write headers, ListBucket by prefix, no deletes of the ledger, manifests or source) are
checked on the documents: an explicit Deny wins, else an Allow is needed; conditions Null and
StringLike. Also the rendered documents of the test cluster and a key of each kind.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from laminar_orchestration.identity import MAX_PARTITIONS
from laminar_orchestration.protocol import keys
from laminar_orchestration.protocol.capabilities import storage_policies
from laminar_orchestration.ulid import next_ulid

BUCKET = "laminar-iam"
PREFIX = "store"
NODES = (1, 2, 3)


def like(pattern: str, value: str) -> bool:
    """IAM's wildcard match: `*` any run of characters, `?` any one character."""
    return re.fullmatch(re.escape(pattern).replace(r"\*", ".*").replace(r"\?", "."), value) is not None


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _conditions_hold(conditions: Mapping[str, Mapping[str, Any]], context: Mapping[str, str]) -> bool:
    for operator, entries in conditions.items():
        for key, expected in entries.items():
            if operator == "Null":
                if (str(expected).lower() == "true") != (key not in context):
                    return False
            elif operator == "StringLike":
                if key not in context or not any(like(p, context[key]) for p in _as_list(expected)):
                    return False
            else:
                raise AssertionError(f"the evaluator does not know {operator}: extend it with the policy")
    return True


def _statement_applies(st: Mapping[str, Any], action: str, resource: str, context: Mapping[str, str]) -> bool:
    return (
        any(like(a, action) for a in _as_list(st["Action"]))
        and any(like(r, resource) for r in _as_list(st["Resource"]))
        and _conditions_hold(st.get("Condition", {}), context)
    )


def permitted(documents: Sequence[Mapping[str, Any]], action: str, resource: str, context: Mapping[str, str]) -> bool:
    """IAM's decision: an explicit Deny wins, else an Allow is needed."""
    statements = [st for doc in documents for st in doc["Statement"]]
    if any(st["Effect"] == "Deny" and _statement_applies(st, action, resource, context) for st in statements):
        return False
    return any(st["Effect"] == "Allow" and _statement_applies(st, action, resource, context) for st in statements)


RENDERED = storage_policies(BUCKET, PREFIX, nodes=NODES)
IF_NONE_MATCH = {"s3:if-none-match": "*"}
IF_MATCH = {"s3:if-match": '"etag"'}


def can(role: str, action: str, key: str, context: Mapping[str, str] | None = None) -> bool:
    resource = f"arn:aws:s3:::{BUCKET}" if action == "s3:ListBucket" else f"arn:aws:s3:::{BUCKET}/{PREFIX}/{key}"
    return permitted([RENDERED.roles[role], RENDERED.bucket_policy], action, resource, context or {})


#: One key of each kind, the way the code builds them.
SAMPLES = {
    keys.CLUSTER_KEY: keys.CLUSTER_KEY,
    keys.MEMBERSHIP_KEY: keys.MEMBERSHIP_KEY,
    keys.STREAM_KEY: keys.STREAM_KEY,
    keys.NODE_RECORDS_PATTERN: keys.node_key(2),
    keys.OWNERSHIP_HEADS_PATTERN: keys.ownership_head_key(3),
    keys.GRANTS_PATTERN: keys.grant_key(3, 7),
    keys.RELEASES_PATTERN: keys.release_key(3, 7),
    keys.DESIRED_STATES_PATTERN: keys.desired_state_key(3),
    keys.MANIFEST_HISTORY_PATTERN: keys.manifest_history_key(3, 9),
    keys.MANIFEST_POINTERS_PATTERN: keys.manifest_pointer_key(3),
    keys.SEGMENTS_PATTERN: keys.segment_key(3, 100),
    keys.SOURCE_HEADS_PATTERN: keys.source_head_key(3),
    keys.LOG_ENDS_KEY: keys.LOG_ENDS_KEY,
    keys.CHECKPOINT_OBJECTS_PATTERN: keys.delta_key(3, 2, 7, next_ulid()),
    keys.OUTPUT_OBJECTS_PATTERN: keys.output_object_key(3, 2, 7, 0, 10, next_ulid()),
    keys.SIGNING_KEYS_PATTERN: keys.signing_key_key(2, 3, 7),
}


def spanning_keys(node: int, other: int) -> list[str]:
    """Keys that end like `node`'s own but lie under `other`'s data prefix or a ledger/manifest prefix
    `node` may not write: a `*` in the partition's place of `node`'s patterns would span the `/`s."""
    ulid = next_ulid()
    return [
        f"{keys.checkpoint_partition_prefix(1)}n-{other:05d}/x/n-{node:05d}/y",
        f"{keys.sink_partition_prefix(1)}n-{other:05d}/x/n-{node:05d}/y",
        f"{keys.delta_key(1, other, 3, ulid)}/{keys.delta_key(1, node, 3, ulid)}",
        f"{keys.snapshot_file_key(1, other, 3, ulid, 'a.sst')}/{keys.snapshot_file_key(1, node, 3, ulid, 'a.sst')}",
        f"{keys.output_object_key(1, other, 3, 0, 1, ulid)}/{keys.output_object_key(1, node, 3, 0, 1, ulid)}",
        # Under the grants of partition 0, and under its manifest pointer, by way of the release and
        # manifest history patterns.
        f"{keys.grant_key(0, 7)}/{keys.release_key(0, 7)}",
        f"{keys.manifest_pointer_key(0)}/{keys.manifest_history_key(0, 7)}",
    ]


def own_keys(node: int) -> list[str]:
    """Data objects `node` writes, at the lowest and the highest partition id."""
    ulid = next_ulid()
    return [
        k
        for p in (0, MAX_PARTITIONS - 1)
        for k in (
            keys.delta_key(p, node, 3, ulid),
            keys.snapshot_file_key(p, node, 3, ulid, "000001.sst"),
            keys.output_object_key(p, node, 3, 0, 1, ulid),
        )
    ]
