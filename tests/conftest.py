"""Shared fixtures: object stores on the local filesystem and on a real S3-protocol server.

The S3 side is moto's server running as a subprocess on loopback (see
`laminar_dev.s3server`), reached over real HTTP by boto3, so the S3 backend is
tested through the same code path it uses in production.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from laminar_dev.s3server import start_s3_server
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.store import LocalObjectStore, ObjectStore
from laminar_orchestration.store.metering import RequestMeter
from laminar_orchestration.store.s3 import S3ObjectStore, make_s3_client
from tests.ledgers import new_ledger

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

#: Backends every store-level test runs against.
STORE_KINDS = ["local", "s3"]
#: Key prefix the S3 fixtures put their store under, to exercise prefix handling.
S3_TEST_PREFIX = "laminar-test"


#: What a test of each mark costs, roughly, in seconds: a `slow` test a minute or more (its own
#: ``seconds=`` where it knows better, e.g. ``@pytest.mark.slow(seconds=270)``), a JVM (`spark`) tens
#: of seconds to start, a Dagster instance or a subprocess a few seconds. Tests with none of these
#: marks take well under a second: they only order files of equal marked cost, by their number.
MARK_COST_S = {"slow": 60.0, "spark": 20.0, "dagster": 10.0, "processes": 3.0}


def item_cost_s(item: pytest.Item) -> float:
    """What `item` costs by its marks; 0 for a test with none of them."""
    slow = item.get_closest_marker("slow")
    if slow is not None:
        return float(slow.kwargs.get("seconds", MARK_COST_S["slow"]))
    marks = {mark.name for mark in item.iter_markers()}
    return sum(cost for mark, cost in MARK_COST_S.items() if mark in marks)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: a file's cost counts all its tests
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The costliest files first, by their tests' marks: with ``--dist loadfile --no-loadscope-reorder``
    # (scripts/test.sh) the two workers take the long files first and the short ones fill in behind
    # them, so no long file is left to run alone at the end. Of files of equal marked cost, the one with
    # more tests first. A stable sort by file: each file's tests stay together and in their order
    # (module fixtures), equal files keep their path order, and every worker computes the same order
    # from the same items, as xdist requires.
    cost: dict[Path, tuple[float, int]] = {}
    for item in items:
        marked, tests = cost.get(item.path, (0.0, 0))
        cost[item.path] = (marked + item_cost_s(item), tests + 1)
    items.sort(key=lambda item: (-cost[item.path][0], -cost[item.path][1]))


def pytest_configure(config: pytest.Config) -> None:
    # A run started in the background inherits SIGINT ignored, and Dagster maps SIGTERM to SIGINT's
    # handler: every process the tests start would then ignore SIGTERM too.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a moto S3 server (one request at a time) started for this test session.

    Also sets fake AWS credentials and region in the environment for the whole
    session, so boto3 clients here and in CLI subprocesses need no setup.
    """
    with start_s3_server(tmp_path_factory.mktemp("s3server")) as url:
        yield url


@pytest.fixture(scope="session")
def s3_client(s3_endpoint: str) -> Iterator[S3Client]:
    """One boto3 client for the moto server, shared because building one costs ~0.2 s."""
    client = make_s3_client(s3_endpoint)
    yield client
    client.close()


def create_bucket(client: S3Client) -> str:
    """Create a bucket with a fresh unique name; return its name."""
    name = f"laminar-{uuid.uuid4().hex[:24]}"
    client.create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_bucket(s3_client: S3Client) -> str:
    """A fresh, empty bucket for this test."""
    return create_bucket(s3_client)


@pytest.fixture
def s3_store(s3_client: S3Client, s3_bucket: str) -> S3ObjectStore:
    """An S3ObjectStore under a prefix in a fresh bucket on the moto server."""
    return S3ObjectStore(s3_bucket, S3_TEST_PREFIX, client=s3_client)


@pytest.fixture
def local_store(tmp_path: Path) -> LocalObjectStore:
    """A LocalObjectStore in this test's temporary directory."""
    return LocalObjectStore(tmp_path / "store")


@pytest.fixture(params=STORE_KINDS)
def store(request: pytest.FixtureRequest) -> ObjectStore:
    """Each backend in turn: the same test runs against the local and the S3 store."""
    value = request.getfixturevalue(f"{request.param}_store")
    assert isinstance(value, ObjectStore)
    return value


@pytest.fixture(params=STORE_KINDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A store URL for `open_store` or a CLI subprocess, for each backend in turn.

    ``file://...`` for local; ``s3://bucket/prefix`` for S3, with
    ``AWS_ENDPOINT_URL`` pointed at the moto server in this process's
    environment (subprocesses inherit it).
    """
    if request.param == "local":
        return (tmp_path / "store").resolve().as_uri()
    endpoint = request.getfixturevalue("s3_endpoint")
    assert isinstance(endpoint, str)
    bucket = request.getfixturevalue("s3_bucket")
    assert isinstance(bucket, str)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    return f"s3://{bucket}/{S3_TEST_PREFIX}"


@pytest.fixture
def ledger(store: ObjectStore) -> Ledger:
    """A cluster of 4 partitions on each backend in turn (a test module may define its own)."""
    return new_ledger(store)


@pytest.fixture
def meter(store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> RequestMeter:
    """The store requests of this test alone: the backend counts them (each wrapper names its meter)."""
    own = RequestMeter()
    layer: object = store
    while isinstance(layer, ObjectStore):
        monkeypatch.setattr(layer, "meter", own)
        layer = getattr(layer, "inner", None)
    return own
