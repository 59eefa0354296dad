"""A request the caller's credentials may not make on a key is `AccessDenied` (a `StoreUnavailable`,
so every caller that gives up on an unavailable store still does), told apart from credentials the
store refuses altogether, and never retried: another principal may be allowed, these keys are not."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from botocore.stub import Stubber

from laminar_orchestration.store import AccessDenied, StoreUnavailable
from laminar_orchestration.store.retry import RetryingStore
from laminar_orchestration.store.s3 import S3ObjectStore, make_s3_client
from tests.store.test_retry import NO_WAIT

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


@pytest.fixture
def stubbed() -> Iterator[tuple[S3ObjectStore, Stubber]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        client: S3Client = make_s3_client("http://127.0.0.1:9")
    stub = Stubber(client)
    with stub:
        yield S3ObjectStore("bucket", "pfx", client=client), stub
    client.close()


def test_a_get_or_head_outside_the_callers_policy_is_access_denied_naming_the_key(
    stubbed: tuple[S3ObjectStore, Stubber],
) -> None:
    store, stub = stubbed
    stub.add_client_error("get_object", service_error_code="AccessDenied", http_status_code=403)
    stub.add_client_error("head_object", service_error_code="403", http_status_code=403)  # a HEAD has no body
    with pytest.raises(AccessDenied) as denied:
        store.get("sink/00000/n-00002/out.parquet")
    assert denied.value.key == "sink/00000/n-00002/out.parquet" and "'bucket'" in str(denied.value)
    with pytest.raises(AccessDenied):
        store.head("sink/00000/n-00002/out.parquet")
    assert isinstance(denied.value, StoreUnavailable)


@pytest.mark.parametrize("code", ["InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"])
def test_credentials_the_store_refuses_altogether_are_unavailable_not_denied(
    stubbed: tuple[S3ObjectStore, Stubber], code: str
) -> None:
    store, stub = stubbed
    stub.add_client_error("get_object", service_error_code=code, http_status_code=403)
    with pytest.raises(StoreUnavailable) as refused:
        store.get("k")
    assert not isinstance(refused.value, AccessDenied)


def test_a_denied_read_is_not_retried(stubbed: tuple[S3ObjectStore, Stubber]) -> None:
    store, stub = stubbed
    stub.add_client_error("get_object", service_error_code="AccessDenied", http_status_code=403)
    retrying = RetryingStore(store, NO_WAIT)
    with pytest.raises(AccessDenied):
        retrying.get("k")
    stub.assert_no_pending_responses()
    assert retrying.attempts == 1
