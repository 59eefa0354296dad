"""One reading of an ``s3://`` store URL: `open_store` and the Dagster resource open the same bucket
and prefix from it, and refuse the same URLs."""

from __future__ import annotations

import pytest
from dagster_aws.s3 import S3Resource

from laminar_orchestration.store import InvalidStoreUrl, S3Url, open_store, parse_s3_url
from laminar_orchestration.store.retry import RetryingStore
from laminar_orchestration.store.s3 import S3ObjectStore
from resources import LaminarResource

# The Dagster resource builds boto3 clients (seconds on a cold start).
pytestmark = pytest.mark.dagster


def _bucket_and_prefix(store: object) -> tuple[str, str]:
    assert isinstance(store, RetryingStore) and isinstance(store.inner, S3ObjectStore)
    return store.inner.bucket, store.inner.prefix


@pytest.mark.parametrize(
    ("url", "bucket", "prefix"),
    [(" s3://b/p/q/ ", "b", "p/q"), ("S3://b", "b", ""), ("s3://b//deep//", "b", "deep")],
)
def test_every_opener_reads_an_s3_url_alike(
    url: str, bucket: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    assert parse_s3_url(url) == S3Url(bucket, prefix)
    assert _bucket_and_prefix(open_store(url)) == (bucket, prefix)
    resource = LaminarResource(store_url=url, s3=S3Resource(region_name="us-east-1", max_attempts=0))
    assert _bucket_and_prefix(resource.store()) == (bucket, prefix)


@pytest.mark.parametrize("url", ["s3://", "s3:///prefix"])
def test_an_s3_url_without_a_bucket_is_refused_alike(url: str) -> None:
    for open_it in (parse_s3_url, open_store, lambda u: LaminarResource(store_url=u, s3=S3Resource()).store()):
        with pytest.raises(InvalidStoreUrl, match="no bucket"):
            open_it(url)
