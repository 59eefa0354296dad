"""Where everything lives in the object store: the one module that spells prefixes and keys.

Layout (``p`` is a partition, five digits; numbers are zero-padded so keys sort
in numeric order)::

    ledger/cluster.json                                cluster record (created by `init`)
    ledger/membership.json                             member set + cluster epoch (CAS)
    ledger/nodes/{node:05d}.json                       one node's record and heartbeat (CAS)
    ledger/moves/{node:05d}.json                       one node's reports on the moves it is in (CAS)
    ledger/partitions/{p}/head.json                    ownership head: current owner (CAS, may lag)
    ledger/partitions/{p}/grants/{epoch:020d}.json     epoch grant (create-only, never deleted)
    ledger/partitions/{p}/releases/{epoch:020d}.json   release of an epoch (create-only)
    ledger/partitions/{p}/desired.json                 desired owner + migration in flight (CAS)
    manifests/{p}/current.json                         manifest pointer (CAS, may lag)
    manifests/{p}/history/{seq:020d}.json             manifest chain entry (create-only)
    checkpoints/{p}/n-{node:05d}/{epoch:010d}-{ulid}.delta.parquet  a commit's delta (create-only, fenced)
    checkpoints/{p}/n-{node:05d}/{epoch:010d}-{ulid}.snap.{file}    a snapshot's file (create-only, fenced)
    sink/{p}/n-{node:05d}/{epoch:010d}-{start:020d}-{end:020d}-{ulid}.parquet   output (create-only, fenced)
    source/{p}/{start_offset:020d}.seg                 input log segment (create-only)
    source/{p}/head.json                               producers' source head (CAS, may lag)
    grant-keys/n-{node:05d}/p-{p}/e-{epoch:020d}.json  a grant's private signing key (create-only;
                                                       readable by the grantee and the control plane only)

These formats are persisted: changing one orphans every existing store.
Fenced objects sit under their writer's node, so a node's storage policy can
allow it to write its own objects only (`node_checkpoint_objects_pattern`).
Write capabilities (`capabilities`) are split by the top-level prefixes in
`PREFIXES`; the S3 policies are rendered from the key patterns at the end of
this module (one per kind of object).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from laminar_orchestration.errors import InvalidInputError
from laminar_orchestration.identity import MAX_PARTITIONS
from laminar_orchestration.ulid import ULID_PATTERN, ulid_time_ms

# --- top-level prefixes (one per write capability) ------------------------------

LEDGER_PREFIX = "ledger/"
MANIFESTS_PREFIX = "manifests/"
CHECKPOINTS_PREFIX = "checkpoints/"
SINK_PREFIX = "sink/"
SOURCE_PREFIX = "source/"
#: Private signing keys of grants: the control plane reads and writes them, a node reads only its
#: own part (`node_signing_keys_prefix`), the auditor and the producer none of it.
GRANT_KEYS_PREFIX = "grant-keys/"
#: The output table (a Delta table the nodes derive from the manifest chains; not protocol state).
TABLES_PREFIX = "tables/"
#: Where the output table is, when `laminar init --output-table` chose it (absent: `<store>/tables/output`).
OUTPUT_TABLE_KEY = f"{TABLES_PREFIX}output.json"
#: The objects of the output table at its default place: its Delta log, data files and checkpoints.
OUTPUT_TABLE_PREFIX = f"{TABLES_PREFIX}output/"
#: The output table's Delta log (its entries, written create-only, and its checkpoints).
OUTPUT_TABLE_LOG_PREFIX = f"{OUTPUT_TABLE_PREFIX}_delta_log/"


def table_node_folder(node: int) -> str:
    """The folder, relative to the output table's root, of the data files node `node` writes."""
    return f"n-{node:05d}/"


#: Every top-level prefix by the name the capabilities and storage policies use.
PREFIXES: Mapping[str, str] = MappingProxyType(
    {
        "ledger": LEDGER_PREFIX,
        "manifests": MANIFESTS_PREFIX,
        "checkpoints": CHECKPOINTS_PREFIX,
        "source": SOURCE_PREFIX,
        "sink": SINK_PREFIX,
        "grant-keys": GRANT_KEYS_PREFIX,
    }
)

#: Prefixes of the fenced objects a manifest names (the anti-entropy sweep lists these).
FENCED_OBJECT_PREFIXES: tuple[str, ...] = (SINK_PREFIX, CHECKPOINTS_PREFIX)


def _partition(partition: int) -> str:
    return f"{partition:05d}"


# --- ledger -----------------------------------------------------------------------

CLUSTER_KEY = f"{LEDGER_PREFIX}cluster.json"
MEMBERSHIP_KEY = f"{LEDGER_PREFIX}membership.json"
#: The stream's schema and processor (`protocol.stream`): created once by `init`, read by nodes and producers.
STREAM_KEY = f"{LEDGER_PREFIX}stream.json"


NODES_PREFIX = f"{LEDGER_PREFIX}nodes/"


def node_key(node: int) -> str:
    """A node's own record (identity, heartbeat, partition progress)."""
    return f"{NODES_PREFIX}{node:05d}.json"


_NODE_KEY_RE = re.compile(r"^ledger/nodes/(\d{5,})\.json$")


def parse_node_key(key: str) -> int | None:
    """The node id of a node record's key; None for any other key."""
    match = _NODE_KEY_RE.match(key)
    return int(match.group(1)) if match else None


MOVE_REPORTS_PREFIX = f"{LEDGER_PREFIX}moves/"


def move_report_key(node: int) -> str:
    """A node's report on the moves it takes part in (the phases it did): what a move's driver polls."""
    return f"{MOVE_REPORTS_PREFIX}{node:05d}.json"


def ledger_partition_prefix(partition: int) -> str:
    """Prefix of every ledger record of `partition` (no trailing slash)."""
    return f"{LEDGER_PREFIX}partitions/{_partition(partition)}"


def ownership_head_key(partition: int) -> str:
    """The CAS head naming `partition`'s current owner; it may lag the grants."""
    return f"{ledger_partition_prefix(partition)}/head.json"


def grant_key(partition: int, epoch: int) -> str:
    """The immutable grant of `partition` at `epoch`."""
    return f"{ledger_partition_prefix(partition)}/grants/{epoch:020d}.json"


def release_key(partition: int, epoch: int) -> str:
    """The immutable release of `partition`'s `epoch` by its owner."""
    return f"{ledger_partition_prefix(partition)}/releases/{epoch:020d}.json"


def desired_state_key(partition: int) -> str:
    """The control plane's desired state of `partition` (owner, migration in flight)."""
    return f"{ledger_partition_prefix(partition)}/desired.json"


ASSIGNMENTS_PREFIX = f"{LEDGER_PREFIX}assignments/"


def assignment_key(node: int) -> str:
    """The control plane's index of the desired states that name `node`: all a node polls when idle."""
    return f"{ASSIGNMENTS_PREFIX}{node:05d}.json"


_ASSIGNMENT_KEY_RE = re.compile(r"^ledger/assignments/(\d{5,})\.json$")


def parse_assignment_key(key: str) -> int | None:
    """The node id of an assignment record's key; None for any other key."""
    match = _ASSIGNMENT_KEY_RE.match(key)
    return int(match.group(1)) if match else None


# --- manifests ----------------------------------------------------------------------


def manifest_prefix(partition: int) -> str:
    """Prefix of `partition`'s manifest chain (no trailing slash)."""
    return f"{MANIFESTS_PREFIX}{_partition(partition)}"


def manifest_pointer_key(partition: int) -> str:
    """The CAS pointer to (a copy of) `partition`'s newest manifest; it may lag the history."""
    return f"{manifest_prefix(partition)}/current.json"


def manifest_history_key(partition: int, seq: int) -> str:
    """History entry `seq` of `partition`'s manifest chain."""
    return f"{manifest_prefix(partition)}/history/{seq:020d}.json"


# --- grant signing keys ---------------------------------------------------------------


def node_signing_keys_prefix(node: int) -> str:
    """Prefix (with trailing slash) of the signing keys of every grant made to `node`."""
    return f"{GRANT_KEYS_PREFIX}n-{node:05d}/"


def signing_key_key(node: int, partition: int, epoch: int) -> str:
    """The private signing key of the grant of `partition` at `epoch` to `node`."""
    return f"{node_signing_keys_prefix(node)}p-{_partition(partition)}/e-{epoch:020d}.json"


# --- source log ---------------------------------------------------------------------


def source_partition_prefix(partition: int) -> str:
    """Prefix of `partition`'s input log (no trailing slash)."""
    return f"{SOURCE_PREFIX}{_partition(partition)}"


def segment_key(partition: int, start_offset: int) -> str:
    """The segment of `partition` whose first event has offset `start_offset`."""
    return f"{source_partition_prefix(partition)}/{start_offset:020d}.seg"


def source_head_key(partition: int) -> str:
    """The producers' CAS head of `partition`'s input log; it may lag the segments."""
    return f"{source_partition_prefix(partition)}/head.json"


#: Every partition's log end as the producers last recorded it, in one object: the nodes' signal
#: that a log grew (one GET per node per poll, whatever the number of partitions). It may lag.
LOG_ENDS_KEY = f"{SOURCE_PREFIX}ends.json"


# --- fenced objects: checkpoints and output ----------------------------------------------


def checkpoint_partition_prefix(partition: int) -> str:
    """Prefix (with trailing slash) of `partition`'s checkpoint objects."""
    return f"{CHECKPOINTS_PREFIX}{_partition(partition)}/"


def sink_partition_prefix(partition: int) -> str:
    """Prefix (with trailing slash) of `partition`'s output files."""
    return f"{SINK_PREFIX}{_partition(partition)}/"


def fenced_object_prefixes(partition: int) -> tuple[str, str]:
    """Prefixes (with trailing slash) of `partition`'s output files and checkpoint objects."""
    return sink_partition_prefix(partition), checkpoint_partition_prefix(partition)


def _node(node: int) -> str:
    return f"n-{node:05d}/"


def delta_key(partition: int, node: int, epoch: int, ulid: str) -> str:
    """One commit's delta (the touched keys' new values), written by `node` under `epoch`."""
    return f"{checkpoint_partition_prefix(partition)}{_node(node)}{epoch:010d}-{ulid}.delta.parquet"


def snapshot_file_key(partition: int, node: int, epoch: int, ulid: str, file_name: str) -> str:
    """One file of a snapshot written by `node` under `epoch`; the files of one snapshot share `ulid`."""
    # One flat name per file, so the sweep parses epoch and ULID from it like any other.
    return f"{checkpoint_partition_prefix(partition)}{_node(node)}{epoch:010d}-{ulid}.snap.{file_name}"


def output_object_key(partition: int, node: int, epoch: int, start: int, end: int, ulid: str) -> str:
    """The output file of source offsets [start, end), written by `node` under `epoch`."""
    return f"{sink_partition_prefix(partition)}{_node(node)}{epoch:010d}-{start:020d}-{end:020d}-{ulid}.parquet"


# `{sink|checkpoints}/{partition:05d}/n-{node:05d}/{epoch:010d}-<rest>`; the rest ends in (or contains) a ULID.
_FENCED_RE = re.compile(r"^(sink|checkpoints)/(\d{5,})/n-(\d{5,})/(\d{10})-([^/]+)$")


class UnparseableObjectKey(InvalidInputError, ValueError):
    """A fenced object's name does not carry a partition, an epoch and a ULID."""

    key: str
    reason: str

    message = "object {key!r}: {reason}"


@dataclass(frozen=True)
class FencedObjectName:
    """What a fenced object's key says about it: whose partition, which epoch, written when."""

    key: str
    partition: int
    #: The node that wrote it (the grantee of `epoch`, unless written with another node's keys).
    node: int
    epoch: int
    ulid: str

    @property
    def created_ms(self) -> int:
        """Creation time from the key's ULID, in ms by the writer's clock (not trusted for safety)."""
        return ulid_time_ms(self.ulid)


def parse_fenced_object_key(key: str) -> FencedObjectName:
    """The one parser of ``sink/`` and ``checkpoints/`` object names; UnparseableObjectKey if `key` is not one."""
    match = _FENCED_RE.match(key)
    if match is None:
        raise UnparseableObjectKey(key, "not {sink|checkpoints}/{partition}/n-{node}/{epoch:010d}-...")
    _, partition, node, epoch, rest = match.groups()
    # The ULID is the last 26-character Crockford segment of the name before its extension.
    ulids = [s for s in rest.split(".", 1)[0].split("-") if ULID_PATTERN.match(s)]
    if not ulids:
        raise UnparseableObjectKey(key, "no ULID in the name")
    return FencedObjectName(key, int(partition), int(node), int(epoch), ulids[-1])


# --- key patterns for storage policies ------------------------------------------------------
# IAM's `*` matches any run of characters, `/` included, and `?` exactly one character. A `*` in
# place of a partition would let a key run on past it into another object's prefix: node 1's
# `checkpoints/*/n-00001/*` allows `checkpoints/00001/n-00002/x/n-00001/y`, an object under node 2's
# prefix. So a partition segment is matched by `PARTITION_SEGMENT_PATTERN`, five `?`: exactly one
# five-character segment (partition ids are five digits below `MAX_PARTITIONS`), and a `*` appears
# only in a pattern's last segment, where the key stays under the prefix before it. Each pattern covers
# exactly the keys its function above builds (the policy tests check that against the functions).
# The auditor's deletes and the bucket policy's create-only rule keep the whole data prefixes
# (`CHECKPOINT_OBJECTS_PATTERN`, `OUTPUT_OBJECTS_PATTERN`): whatever lands there can be swept.

#: One partition segment of a key, in a storage policy: exactly five characters, never a `/`-spanning run.
PARTITION_SEGMENT_PATTERN = "?" * len(_partition(MAX_PARTITIONS - 1))

#: Create-only and CAS objects of the ledger, by what they are.
NODE_RECORDS_PATTERN = f"{NODES_PREFIX}*"
OWNERSHIP_HEADS_PATTERN = f"{LEDGER_PREFIX}partitions/{PARTITION_SEGMENT_PATTERN}/head.json"
GRANTS_PATTERN = f"{LEDGER_PREFIX}partitions/{PARTITION_SEGMENT_PATTERN}/grants/*"
RELEASES_PATTERN = f"{LEDGER_PREFIX}partitions/{PARTITION_SEGMENT_PATTERN}/releases/*"
DESIRED_STATES_PATTERN = f"{LEDGER_PREFIX}partitions/{PARTITION_SEGMENT_PATTERN}/desired.json"
ASSIGNMENTS_PATTERN = f"{ASSIGNMENTS_PREFIX}?????.json"
MOVE_REPORTS_PATTERN = f"{MOVE_REPORTS_PREFIX}?????.json"
MANIFEST_HISTORY_PATTERN = f"{MANIFESTS_PREFIX}{PARTITION_SEGMENT_PATTERN}/history/*"
MANIFEST_POINTERS_PATTERN = f"{MANIFESTS_PREFIX}{PARTITION_SEGMENT_PATTERN}/current.json"
SEGMENTS_PATTERN = f"{SOURCE_PREFIX}{PARTITION_SEGMENT_PATTERN}/*.seg"
SOURCE_HEADS_PATTERN = f"{SOURCE_PREFIX}{PARTITION_SEGMENT_PATTERN}/head.json"
CHECKPOINT_OBJECTS_PATTERN = f"{CHECKPOINTS_PREFIX}*"
OUTPUT_OBJECTS_PATTERN = f"{SINK_PREFIX}*"
SIGNING_KEYS_PATTERN = f"{GRANT_KEYS_PREFIX}*"


def node_checkpoint_objects_pattern(node: int) -> str:
    """The checkpoint objects `node` writes, of any partition (and no other node's)."""
    return f"{CHECKPOINTS_PREFIX}{PARTITION_SEGMENT_PATTERN}/{_node(node)}*"


def node_output_objects_pattern(node: int) -> str:
    """The output files `node` writes, of any partition (and no other node's)."""
    return f"{SINK_PREFIX}{PARTITION_SEGMENT_PATTERN}/{_node(node)}*"


def node_signing_keys_pattern(node: int) -> str:
    """The signing keys of `node`'s grants: what that node (and no other) may read of them."""
    return f"{node_signing_keys_prefix(node)}*"


def partition_write_patterns(partition: int, node: int) -> tuple[str, ...]:
    """What `node`, owning `partition`, writes for it: its release records, manifest chain, checkpoints, output."""
    return (
        f"{ledger_partition_prefix(partition)}/releases/*",
        f"{manifest_prefix(partition)}/*",
        f"{checkpoint_partition_prefix(partition)}{_node(node)}*",
        f"{sink_partition_prefix(partition)}{_node(node)}*",
    )
