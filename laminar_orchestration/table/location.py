"""Where the output table lives, and how delta-rs reaches it.

By default the table sits beside the store it is derived from: under the
local store's directory (``<root>/tables/output``) or under the S3 store's
prefix (``s3://bucket/prefix/tables/output``). ``laminar init --output-table``
records another place in the store (`OutputTableRecord`, at
``tables/output.json``) where every node and command finds it; per process,
``LAMINAR_TABLE_URI`` or an explicit URI (``--table``) overrides both. A table
may not hold the store's own keys nor contain the store (its vacuum would
delete them): `check_table_uri`. delta-rs does not use boto3, so for S3 the
endpoint, region and credentials boto3 resolves are handed to it as storage
options; delta-rs 1.x commits the log with conditional puts (``If-None-Match``),
so concurrent writers need no lock table.

What is there: `open_table` (None for nothing yet; a place holding data files
but no log, once `CREATION_GRACE_S` has shown it is no creation in progress, is
a table whose log was lost), `check_identity` (this cluster's output table, or
`TableMismatch`), `landed_seq` and `remove_table`.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, DeltaProtocolError, TableNotFoundError
from pydantic import BaseModel, ConfigDict, ValidationError

from laminar_orchestration.errors import CorruptDataError, InvalidInputError
from laminar_orchestration.protocol.keys import OUTPUT_TABLE_KEY, TABLES_PREFIX
from laminar_orchestration.store import LocalObjectStore, ObjectStore, parse_s3_url
from laminar_orchestration.table.batches import LINEAGE_SCHEMA, app_id
from laminar_orchestration.table.errors import TableLogCorrupt, TableMismatch

#: Where the table is relative to the store's root or prefix.
DEFAULT_TABLE_PATH = f"{TABLES_PREFIX}output"
#: Environment variable naming the table's URI (overrides the default beside the store).
TABLE_URI_ENV = "LAMINAR_TABLE_URI"


class InvalidTableUri(InvalidInputError, ValueError):
    """A table URI delta-rs cannot use."""

    uri: str
    reason: str

    message = "output table {uri!r}: {reason}"


class OutputTableRecordCorrupt(CorruptDataError):
    """The record of where the output table is does not parse."""

    key: str
    reason: str

    message = "the output table's location record {key!r} is unusable: {reason}"


class OutputTableRecord(BaseModel):
    """Where the cluster's output table is: written by ``laminar init --output-table``, read by every
    node and command that keeps or shows the table (stored at ``tables/output.json``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: A local path (absolute) or ``s3://bucket/prefix``: never credentials, which each process resolves.
    uri: str
    recorded_at: datetime


def parse_table_record(data: bytes) -> OutputTableRecord:
    """The record as stored; OutputTableRecordCorrupt if it does not parse."""
    try:
        return OutputTableRecord.model_validate_json(data)
    except ValidationError as exc:
        raise OutputTableRecordCorrupt(OUTPUT_TABLE_KEY, " ".join(str(exc).split())[:300]) from None


def recorded_table(store: ObjectStore) -> OutputTableRecord | None:
    """The recorded location of the output table (None: none recorded, the default applies)."""
    obj = store.get_or_none(OUTPUT_TABLE_KEY)
    return parse_table_record(obj.data) if obj is not None else None


@dataclass(frozen=True)
class TableLocation:
    """A Delta table's URI and the storage options delta-rs needs to reach it."""

    uri: str
    storage_options: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def is_local(self) -> bool:
        return not urlparse(self.uri).scheme

    def options(self) -> dict[str, str] | None:
        """The storage options as delta-rs takes them (None for a local path)."""
        return dict(self.storage_options) if self.storage_options else None

    def describe(self) -> str:
        """The URI without credentials: safe to print."""
        return self.uri


def _innermost(store: ObjectStore) -> ObjectStore:
    """The backend under wrappers (retrying, metering, fault injection) that keep theirs in `inner`."""
    seen = 0
    while isinstance(getattr(store, "inner", None), ObjectStore) and seen < 16:
        store = store.inner  # type: ignore[attr-defined]
        seen += 1
    return store


def _s3_options(endpoint: str | None) -> dict[str, str]:
    """Endpoint, region and credentials for delta-rs, as boto3 resolves them for the store."""
    import boto3

    options: dict[str, str] = {}
    session = boto3.Session()
    creds = session.get_credentials()
    if creds is not None:
        frozen = creds.get_frozen_credentials()
        options["AWS_ACCESS_KEY_ID"] = frozen.access_key or ""
        options["AWS_SECRET_ACCESS_KEY"] = frozen.secret_key or ""
        if frozen.token:
            options["AWS_SESSION_TOKEN"] = frozen.token
    options["AWS_REGION"] = session.region_name or os.environ.get("AWS_REGION") or "us-east-1"
    endpoint = endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint and "amazonaws.com" not in endpoint:
        options["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    return options


def _from_uri(uri: str, endpoint: str | None = None) -> TableLocation:
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme in ("", "file"):
        path = unquote(parsed.path) if scheme == "file" else uri
        if not path:
            raise InvalidTableUri(uri, "no path")
        return TableLocation(str(Path(path).resolve()))
    if scheme in ("s3", "s3a"):
        if not parsed.netloc:
            raise InvalidTableUri(uri, "no bucket: use s3://bucket/prefix")
        return TableLocation(f"s3://{parsed.netloc}/{parsed.path.strip('/')}", MappingProxyType(_s3_options(endpoint)))
    raise InvalidTableUri(uri, f"unsupported scheme {scheme!r}: use a path, file:///path or s3://bucket/prefix")


def table_location(store: ObjectStore, uri: str | None = None) -> TableLocation:
    """The output table of `store`: `uri`, else ``$LAMINAR_TABLE_URI``, else the location recorded at
    ``laminar init``, else beside the store."""
    backend = _innermost(store)
    endpoint = getattr(backend, "endpoint", None)
    explicit = (uri or os.environ.get(TABLE_URI_ENV, "")).strip()
    if not explicit:
        record = recorded_table(store)
        explicit = record.uri if record is not None else ""
    if explicit:
        return _from_uri(explicit, endpoint if isinstance(endpoint, str) else None)
    if isinstance(backend, LocalObjectStore):
        return TableLocation(str(backend.root / DEFAULT_TABLE_PATH))
    url = store.url.rstrip("/")
    return _from_uri(f"{url}/{DEFAULT_TABLE_PATH}", endpoint if isinstance(endpoint, str) else None)


def _store_root(store: ObjectStore) -> tuple[str, PurePosixPath]:
    """Where `store` keeps its keys, comparable with a table URI: ("" and the local root) or the bucket and prefix."""
    backend = _innermost(store)
    if isinstance(backend, LocalObjectStore):
        return "", PurePosixPath(backend.root.as_posix())
    where = parse_s3_url(store.url)
    return where.bucket, PurePosixPath("/" + where.prefix)


def check_table_uri(store: ObjectStore, uri: str) -> TableLocation:
    """The location `uri` names, if the output table of `store` may live there; InvalidTableUri otherwise.

    Refused: a URI delta-rs cannot use; a place inside the store but not under its ``tables/`` prefix
    (the table's files would sit among the ledger's, manifests' or source's keys); a place that
    contains the store (vacuuming the table would delete the store's objects); a local path that is
    a file.
    """
    endpoint = getattr(_innermost(store), "endpoint", None)
    location = _from_uri(uri.strip(), endpoint if isinstance(endpoint, str) else None) if uri.strip() else None
    if location is None:
        raise InvalidTableUri(uri, "empty: use a path, file:///path or s3://bucket/prefix")
    bucket, root = _store_root(store)
    if location.is_local:
        where, path = "", PurePosixPath(Path(location.uri).as_posix())
        if Path(location.uri).exists() and not Path(location.uri).is_dir():
            raise InvalidTableUri(uri, f"{location.uri} is a file, not a directory")
    else:
        parsed = urlparse(location.uri)
        where, path = parsed.netloc, PurePosixPath("/" + parsed.path.strip("/"))
    if where != bucket:
        return location
    if path == root or root.is_relative_to(path):
        raise InvalidTableUri(uri, f"it contains the store {store.url}: the table's vacuum would delete the store")
    if path.is_relative_to(root):
        inside = path.relative_to(root).as_posix()
        if not inside.startswith(TABLES_PREFIX) or inside == OUTPUT_TABLE_KEY:
            raise InvalidTableUri(
                uri,
                f"it is inside the store {store.url} but not under its {TABLES_PREFIX} prefix, "
                f"where the table's files would sit among the store's own keys (e.g. {TABLES_PREFIX}output)",
            )
    return location


# --- what is there ---------------------------------------------------------------------------


#: The table's name (Delta metadata) is this plus the cluster id: a table of another cluster is refused.
TABLE_NAME_PREFIX = "laminar_output/"


#: How long files without a log may be a creation in progress before they count as a table whose
#: log was lost. The committer writes log entry 0 before any data file, so only a table made by
#: another writer (data files first, then the log) is ever seen this way.
CREATION_GRACE_S = 1.0


def open_table(location: TableLocation) -> DeltaTable | None:
    """The table at `location` (None: nothing there yet). TableLogCorrupt for a missing or broken log."""
    files_seen_at: float | None = None
    while True:
        began = time.monotonic()
        try:
            return DeltaTable(location.uri, storage_options=location.options())
        except TableNotFoundError as exc:
            # Lost only if an open begun after the files were seen (plus the grace) still finds no
            # log: an open that began before them may have missed a log written meanwhile.
            if files_seen_at is not None and began >= files_seen_at + CREATION_GRACE_S:
                raise TableLogCorrupt(location.uri, "data files but no readable _delta_log") from exc
            if not _holds_files(location):
                return None
            if files_seen_at is None:
                files_seen_at = time.monotonic()
            time.sleep(0.1)
        except (DeltaError, DeltaProtocolError, OSError, ValueError) as exc:
            raise TableLogCorrupt(location.uri, " ".join(str(exc).split())[:300]) from exc


def _is_pending_commit(relative: str) -> bool:
    """A commit being written (delta-rs stages one as ``_delta_log/_commit_<id>.json.tmp``)."""
    return relative.startswith("_delta_log/_commit_") or relative.endswith(".tmp")


def _holds_files(location: TableLocation) -> bool:
    """Whether anything but a commit being written is at `location`."""
    if location.is_local:
        root = Path(location.uri)
        return root.is_dir() and any(
            not _is_pending_commit(p.relative_to(root).as_posix()) for p in root.rglob("*") if p.is_file()
        )
    bucket, prefix = _bucket_prefix(location)
    pages = _s3_client(location).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
    return any(not _is_pending_commit(o["Key"][len(prefix) + 1 :]) for page in pages for o in page.get("Contents", []))


def _bucket_prefix(location: TableLocation) -> tuple[str, str]:
    rest = location.uri.split("://", 1)[1]
    bucket, _, prefix = rest.partition("/")
    return bucket, prefix.strip("/")


def _s3_client(location: TableLocation) -> Any:
    from laminar_orchestration.store.s3 import make_s3_client

    return make_s3_client(location.storage_options.get("AWS_ENDPOINT_URL"))


def remove_table(location: TableLocation) -> int:
    """Delete every object of the table at `location` (log and data files); the count removed."""
    if location.is_local:
        path = Path(location.uri)
        if not path.exists():
            return 0
        count = sum(1 for p in path.rglob("*") if p.is_file())
        shutil.rmtree(path)
        return count
    bucket, prefix = _bucket_prefix(location)
    client = _s3_client(location)
    removed = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
            removed += len(keys)
    return removed


def check_identity(table: DeltaTable, location: TableLocation, cluster_id: str) -> None:
    """TableMismatch unless `table` is the output table of cluster `cluster_id`."""
    check_identity_of(table.metadata().name or "", pa.schema(table.schema().to_arrow()), location, cluster_id)


def check_identity_of(name: str, schema: pa.Schema, location: TableLocation, cluster_id: str) -> None:
    """TableMismatch unless a table named `name` with `schema` is the output table of `cluster_id`."""
    if name != TABLE_NAME_PREFIX + cluster_id:
        raise TableMismatch(location.uri, f"its name is {name!r}, expected {TABLE_NAME_PREFIX + cluster_id!r}")
    have = {f.name: f for f in schema}
    for want in LINEAGE_SCHEMA:
        got = have.get(want.name)
        if got is None or got.type != want.type:
            raise TableMismatch(location.uri, f"column {want.name!r} is {got.type if got else 'missing'}")


def landed_seq(table: DeltaTable | None, partition: int) -> int:
    """The seq of the newest manifest entry of `partition` the table holds (0: none)."""
    if table is None:
        return 0
    return table.transaction_version(app_id(partition)) or 0
