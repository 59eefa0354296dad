"""Shared fixtures: object stores on the local filesystem and on a real S3-protocol server.

The S3 side is moto's server running as a subprocess on loopback (see
`tests/s3server.py`), reached over real HTTP by boto3, so the S3 backend is
tested through the same code path it uses in production.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from laminar_orchestration.store import LocalObjectStore, ObjectStore
from laminar_orchestration.store.s3 import S3ObjectStore, make_s3_client

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

#: Backends every store-level test runs against.
STORE_KINDS = ["local", "s3"]
#: Key prefix the S3 fixtures put their store under, to exercise prefix handling.
S3_TEST_PREFIX = "laminar-test"

_SERVER_SCRIPT = Path(__file__).with_name("s3server.py")
_STARTUP_TIMEOUT_S = 30.0

#: Fake credentials: moto accepts anything, and they guarantee a test can never
#: touch a real AWS account whatever the developer's environment holds.
_FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    # No instance-metadata probing (slow timeouts when not on EC2).
    "AWS_EC2_METADATA_DISABLED": "true",
}
_CLEARED_AWS_ENV = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


def _wait_for_server(proc: subprocess.Popen[bytes], port_file: Path, log: Path) -> str:
    """Return the server's URL once it answers HTTP; fail with its log if it dies."""
    deadline = time.monotonic() + _STARTUP_TIMEOUT_S
    url: str | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        if url is None and port_file.exists():
            url = f"http://127.0.0.1:{int(port_file.read_text())}"
        if url is not None:
            try:
                # An unsigned GET / is ListBuckets; it also warms up moto's S3 app.
                with urllib.request.urlopen(url + "/", timeout=5):
                    return url
            except urllib.error.HTTPError:
                return url  # any HTTP answer means it is serving
            except OSError:
                pass
        time.sleep(0.05)
    raise RuntimeError(f"moto server did not answer within {_STARTUP_TIMEOUT_S}s:\n{log.read_text(errors='replace')}")


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a single-threaded moto S3 server started for this test session.

    Also sets fake AWS credentials and region in the environment for the whole
    session, so boto3 clients here and in CLI subprocesses need no setup.
    """
    workdir = tmp_path_factory.mktemp("s3server")
    port_file = workdir / "port"
    log = workdir / "server.log"
    with pytest.MonkeyPatch.context() as mp:
        for name, value in _FAKE_AWS_ENV.items():
            mp.setenv(name, value)
        for name in _CLEARED_AWS_ENV:
            mp.delenv(name, raising=False)
        # Nor may the developer's ~/.aws files (profiles, endpoints, addressing) leak in.
        mp.setenv("AWS_CONFIG_FILE", str(workdir / "no-aws-config"))
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(workdir / "no-aws-credentials"))
        with open(log, "wb") as log_fh:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    str(_SERVER_SCRIPT),
                    "--port",
                    "0",
                    "--port-file",
                    str(port_file),
                    "--parent-pid",
                    str(os.getpid()),
                ],
                stdin=subprocess.DEVNULL,
                # To a file, never a pipe: nobody drains a pipe and a full one
                # would freeze the server mid-test.
                stdout=log_fh,
                stderr=subprocess.STDOUT,
            )
        try:
            yield _wait_for_server(proc, port_file, log)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


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
