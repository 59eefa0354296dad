"""The S3 backend: conditional writes as ``If-None-Match: *`` and ``If-Match``, and every botocore or
HTTP failure translated into the store's typed errors, so callers and the retry layer never see a
``ClientError``: a lost race is `PreconditionFailed`, a dropped connection `TransientStoreError`,
and a missing bucket, refused credentials or a malformed endpoint `StoreUnavailable` naming what to fix.

The shared contract every backend keeps is `tests/store/test_base.py`; here against the real
S3-protocol server where the promise is about S3 itself, and with botocore's `Stubber` where it is
about the requests sent and the answers mapped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import botocore.exceptions as bce
import pytest
from botocore.stub import Stubber

from laminar_orchestration.store import (
    ConcurrentModification,
    InvalidKey,
    ObjectNotFound,
    PreconditionFailed,
    StoreUnavailable,
    TransientStoreError,
)
from laminar_orchestration.store.metering import RequestMeter
from laminar_orchestration.store.retry import RetryingStore
from laminar_orchestration.store.s3 import S3ObjectStore, make_s3_client
from tests.store.test_retry import NO_WAIT

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# -- against the S3-protocol server ------------------------------------------------------------


def test_s3_prefixes_isolate_stores(s3_endpoint: str, s3_bucket: str) -> None:
    a = S3ObjectStore(s3_bucket, "tenant-a", endpoint_url=s3_endpoint)
    b = S3ObjectStore(s3_bucket, "/tenant-b/", endpoint_url=s3_endpoint)
    try:
        assert (a.url, b.url) == (f"s3://{s3_bucket}/tenant-a", f"s3://{s3_bucket}/tenant-b")
        a.put_if_absent("k", b"from-a")
        b.put_if_absent("k", b"from-b")  # same key, other prefix: no conflict
        assert (a.get("k").data, b.get("k").data) == (b"from-a", b"from-b")
        assert list(a.list("")) == ["k"] and list(b.list("")) == ["k"]
    finally:
        a.close()
        b.close()


def test_s3_metadata_keys_come_back_lowercased(s3_store: S3ObjectStore) -> None:
    s3_store.put_if_absent("m", b"x", {"Writer-Id": "W1"})
    assert dict(s3_store.get("m").metadata) == {"writer-id": "W1"}


@pytest.mark.parametrize("op", ["put_if_absent", "put_if_match", "delete_if_match", "get", "head", "list"])
def test_s3_missing_bucket_is_unavailable_and_named(s3_client: S3Client, op: str) -> None:
    s3 = S3ObjectStore("laminar-no-such-bucket", "p", client=s3_client)
    retrying = RetryingStore(s3, NO_WAIT)
    calls: dict[str, Callable[[], object]] = {
        "put_if_absent": lambda: retrying.put_if_absent("k", b"v"),
        "put_if_match": lambda: retrying.put_if_match("k", b"v", "e"),
        "delete_if_match": lambda: retrying.delete_if_match("k", "e"),
        "get": lambda: retrying.get("k"),
        "head": lambda: retrying.head("k"),
        "list": lambda: retrying.list(""),
    }
    with pytest.raises(StoreUnavailable) as unavailable:
        calls[op]()
    assert "laminar-no-such-bucket" in str(unavailable.value)
    assert "does not exist" in str(unavailable.value)
    assert retrying.retries == 0  # configuration errors are not retried


def test_s3_malformed_endpoint_is_unavailable() -> None:
    with pytest.raises(StoreUnavailable) as unavailable:
        S3ObjectStore("bucket", endpoint_url="not a url")
    assert "not a url" in str(unavailable.value)
    assert "bucket" in str(unavailable.value)


# -- requests and answers, stubbed ------------------------------------------------------------


@pytest.fixture(scope="module")
def offline_client() -> Iterator[S3Client]:
    """A client for a dead endpoint, shared because building one costs ~0.2 s; tests stub it."""
    with pytest.MonkeyPatch.context() as mp:
        # Credentials are resolved when the client is built; no real ones may leak in.
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        client = make_s3_client("http://127.0.0.1:9")
    yield client
    client.close()


@pytest.fixture
def stubbed(offline_client: S3Client) -> Iterator[tuple[S3ObjectStore, Stubber]]:
    """An S3ObjectStore (bucket "bucket", prefix "pfx") whose client answers from a Stubber."""
    stub = Stubber(offline_client)
    with stub:
        yield S3ObjectStore("bucket", "pfx", client=offline_client), stub


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("PreconditionFailed", 412, PreconditionFailed),
        ("ConditionalRequestConflict", 409, ConcurrentModification),
        ("SlowDown", 503, TransientStoreError),
        ("InternalError", 500, TransientStoreError),
        ("ServiceUnavailable", 503, TransientStoreError),
        ("RequestTimeout", 400, TransientStoreError),
        ("AccessDenied", 403, StoreUnavailable),
        ("InvalidAccessKeyId", 403, StoreUnavailable),
        ("NoSuchBucket", 404, StoreUnavailable),
        ("NotImplemented", 501, StoreUnavailable),
        ("InvalidArgument", 400, StoreUnavailable),
    ],
)
def test_s3_error_codes_map_to_typed_errors(
    stubbed: tuple[S3ObjectStore, Stubber], code: str, status: int, expected: type[Exception]
) -> None:
    store, stub = stubbed
    stub.add_client_error("put_object", service_error_code=code, http_status_code=status)
    with pytest.raises(expected) as raised:
        store.put_if_absent("k", b"v")
    assert not isinstance(raised.value, bce.BotoCoreError | bce.ClientError)
    if expected is StoreUnavailable:
        assert "'bucket'" in str(raised.value)


def test_s3_not_found_depends_on_the_operation(stubbed: tuple[S3ObjectStore, Stubber]) -> None:
    store, stub = stubbed
    for method in ("put_object", "delete_object", "get_object"):
        stub.add_client_error(method, service_error_code="NoSuchKey", http_status_code=404)
    # HEAD 404s carry no error code; the store checks the bucket once.
    stub.add_client_error("head_object", service_error_code="404", http_status_code=404)
    stub.add_response("head_bucket", {})
    stub.add_client_error("head_object", service_error_code="404", http_status_code=404)

    with pytest.raises(PreconditionFailed) as failed:  # CAS on a missing key
        store.put_if_match("k", b"v", "abc")
    assert failed.value.expected_etag == "abc"
    with pytest.raises(ObjectNotFound):
        store.delete_if_match("k", "abc")
    with pytest.raises(ObjectNotFound):
        store.get("k")
    assert store.head("k") is None
    assert store.head("k") is None  # no second bucket check
    stub.assert_no_pending_responses()


def test_s3_sends_conditional_headers_and_prefixed_keys(
    stubbed: tuple[S3ObjectStore, Stubber],
) -> None:
    store, stub = stubbed
    stub.add_response(
        "put_object",
        {"ETag": '"e1"'},
        {"Bucket": "bucket", "Key": "pfx/a/k", "Body": b"v", "Metadata": {"w": "1"}, "IfNoneMatch": "*"},
    )
    stub.add_response(
        "put_object",
        {"ETag": '"e2"'},
        {"Bucket": "bucket", "Key": "pfx/a/k", "Body": b"v2", "Metadata": {}, "IfMatch": '"e1"'},
    )
    stub.add_response("delete_object", {}, {"Bucket": "bucket", "Key": "pfx/a/k", "IfMatch": '"e2"'})
    assert store.put_if_absent("a/k", b"v", {"W": "1"}) == "e1"  # metadata keys lowercased
    assert store.put_if_match("a/k", b"v2", "e1") == "e2"
    store.delete_if_match("a/k", "e2")
    stub.assert_no_pending_responses()


@pytest.mark.parametrize(
    "error",
    [
        bce.ReadTimeoutError(endpoint_url="http://127.0.0.1:9"),
        bce.ConnectTimeoutError(endpoint_url="http://127.0.0.1:9"),
        bce.ConnectionClosedError(endpoint_url="http://127.0.0.1:9"),
        bce.EndpointConnectionError(endpoint_url="http://127.0.0.1:9"),
        bce.ResponseStreamingError(error="IncompleteRead(3 bytes read)"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_s3_network_errors_are_transient(offline_client: S3Client, error: Exception) -> None:
    store = S3ObjectStore("bucket", client=offline_client)

    with _failing_puts(offline_client, error), pytest.raises(TransientStoreError) as transient:
        store.put_if_absent("k", b"v")
    assert transient.value.operation == "put_if_absent"
    assert type(error).__name__ in str(transient.value)


@contextlib.contextmanager
def _failing_puts(client: S3Client, error: Exception) -> Iterator[list[str]]:
    """Every PutObject of `client` fails with `error` where its HTTP request would be sent, as a dropped
    connection does; yields the requests tried, one entry each."""
    tried: list[str] = []

    def fail(**_: Any) -> None:
        tried.append(type(error).__name__)
        raise error

    client.meta.events.register("before-send.s3.PutObject", fail)
    try:
        yield tried
    finally:
        client.meta.events.unregister("before-send.s3.PutObject", fail)


def test_botocore_sends_each_request_once_and_leaves_retries_to_the_retry_layer(offline_client: S3Client) -> None:
    # RetryingStore must see every transient failure of a conditional write to settle it by reading back.
    store = S3ObjectStore("bucket", client=offline_client)
    dropped = bce.EndpointConnectionError(endpoint_url="http://127.0.0.1:9")
    with _failing_puts(offline_client, dropped) as tried, pytest.raises(TransientStoreError):
        store.put_if_absent("k", b"v")
    assert tried == ["EndpointConnectionError"]


@pytest.mark.parametrize(
    "error",
    [bce.NoCredentialsError(), bce.PartialCredentialsError(provider="env", cred_var="AWS_SECRET_ACCESS_KEY")],
    ids=lambda e: type(e).__name__,
)
def test_s3_missing_credentials_are_unavailable_and_name_the_bucket(offline_client: S3Client, error: Exception) -> None:
    store = S3ObjectStore("bucket", client=offline_client)
    with _failing_puts(offline_client, error) as tried, pytest.raises(StoreUnavailable) as unavailable:
        store.put_if_absent("k", b"v")
    assert "no usable AWS credentials" in str(unavailable.value) and "'bucket'" in str(unavailable.value)
    assert not isinstance(unavailable.value, TransientStoreError) and len(tried) == 1


def test_a_head_refused_on_the_bucket_to_a_least_privilege_role_still_reads_a_missing_key_as_absent(
    stubbed: tuple[S3ObjectStore, Stubber],
) -> None:
    store, stub = stubbed
    stub.add_client_error("head_object", service_error_code="404", http_status_code=404)
    # The role may read its prefixes but not HEAD the bucket: a 403 there says the bucket exists.
    stub.add_client_error("head_bucket", service_error_code="403", http_status_code=403)
    stub.add_client_error("head_object", service_error_code="404", http_status_code=404)
    assert store.head("k") is None
    assert store.head("k") is None  # the bucket is checked once
    stub.assert_no_pending_responses()


def test_an_s3_listing_strips_the_prefix_sorts_and_counts_each_page(stubbed: tuple[S3ObjectStore, Stubber]) -> None:
    store, stub = stubbed
    store.meter = RequestMeter()
    first = {"Contents": [{"Key": "pfx/a/2"}, {"Key": "pfx/a/10"}], "IsTruncated": True, "NextContinuationToken": "t"}
    stub.add_response("list_objects_v2", first, {"Bucket": "bucket", "Prefix": "pfx/a"})
    # Keys come back unsorted, as some S3-compatible stores send them.
    second = {"Contents": [{"Key": "pfx/a/1"}], "IsTruncated": False}
    stub.add_response("list_objects_v2", second, {"Bucket": "bucket", "Prefix": "pfx/a", "ContinuationToken": "t"})
    assert list(store.list("a")) == ["a/1", "a/10", "a/2"]
    assert store.meter.snapshot().by_method == {"LIST": 2}  # one billed request per page
    stub.assert_no_pending_responses()


def test_an_s3_store_needs_a_bucket_and_a_prefix_that_obeys_the_key_rules(offline_client: S3Client) -> None:
    with pytest.raises(StoreUnavailable, match="no S3 bucket given"):
        S3ObjectStore("", client=offline_client)
    with pytest.raises(InvalidKey):
        S3ObjectStore("bucket", "tenant/../other", client=offline_client)
    assert S3ObjectStore("bucket", client=offline_client).url == "s3://bucket"
    assert S3ObjectStore("bucket", "/a/b/", client=offline_client).url == "s3://bucket/a/b"


def test_the_endpoint_is_the_argument_else_the_s3_variable_else_the_generic_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")  # no real credentials may leak in
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9001")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9002")
    clients = [make_s3_client("http://127.0.0.1:9003"), make_s3_client()]
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    clients.append(make_s3_client())
    try:
        assert [c.meta.endpoint_url for c in clients] == [f"http://127.0.0.1:{port}" for port in (9003, 9002, 9001)]
        # Self-hosted endpoints rarely resolve bucket subdomains: buckets go in the path.
        assert all(c.meta.config.s3 == {"addressing_style": "path"} for c in clients)  # type: ignore[attr-defined]
    finally:
        for client in clients:
            client.close()
