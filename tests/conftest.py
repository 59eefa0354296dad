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
from laminar_orchestration.store import LocalObjectStore, ObjectStore
from laminar_orchestration.store.s3 import S3ObjectStore, make_s3_client

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

#: Backends every store-level test runs against.
STORE_KINDS = ["local", "s3"]
#: Key prefix the S3 fixtures put their store under, to exercise prefix handling.
S3_TEST_PREFIX = "laminar-test"


#: Test files that run Spark nodes or Dagster processes for minutes, the longest first. With
#: ``--dist loadfile --no-loadscope-reorder`` (scripts/test.sh) the two workers take these first and
#: the short files fill in behind them, so no long file is left to run alone at the end.
LONG_FILES_FIRST = (
    "test_chaos.py",
    "test_runtime.py",
    "test_least_privilege.py",
    "test_demo.py",
    "test_cli.py",
    "test_dataplane.py",
    "test_dagster_failover.py",
    "test_sensors.py",
    "test_simulation.py",
    "test_dagster_launcher.py",
    "test_spark_cluster.py",
    "test_dagster_definitions.py",
    "test_dagster_spark.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A stable sort by file: each file's tests stay together and in their order (module fixtures).
    rank = {name: i for i, name in enumerate(LONG_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_configure(config: pytest.Config) -> None:
    # A run started in the background inherits SIGINT ignored, and Dagster maps SIGTERM to SIGINT's
    # handler: every process the tests start would then ignore SIGTERM too.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a single-threaded moto S3 server started for this test session.

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
