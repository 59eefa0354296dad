"""The S3 client reads timestamps without dateutil, to the same instants botocore's parser gives."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from botocore.utils import parse_timestamp

from laminar_orchestration.store.s3 import S3ObjectStore, _parse_s3_timestamp

S3_FORMS = [
    "2026-11-29T16:24:52.000Z",  # a listing's LastModified
    "2026-11-29T16:24:52Z",
    "2026-11-29T16:24:52.123456Z",
    "2026-11-29T16:24:52.1+00:00",
    "Sun, 29 Nov 2026 16:24:52 GMT",  # a HEAD's or GET's Last-Modified header
    "Mon, 01 Jan 2024 00:00:00 GMT",
]
OTHER_FORMS = ["2026-11-29T16:24:52+02:00", "Sun, 29 Nov 2026 16:24:52 +0200", "1700000000", "2026-11-29"]


@pytest.mark.parametrize("value", S3_FORMS + OTHER_FORMS)
def test_timestamps_are_the_instants_botocore_reads(value: str) -> None:
    ours, botocore_s = _parse_s3_timestamp(value), parse_timestamp(value)
    assert ours == botocore_s
    assert ours.utcoffset() == botocore_s.utcoffset()
    assert ours.replace(tzinfo=None) == botocore_s.replace(tzinfo=None)


@pytest.mark.parametrize("value", S3_FORMS)
def test_s3_forms_are_aware_utc(value: str) -> None:
    assert _parse_s3_timestamp(value).tzinfo is UTC


def test_head_reads_last_modified_as_an_aware_time(s3_store: S3ObjectStore) -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    s3_store.put_if_absent("stamped", b"x")
    meta = s3_store.head("stamped")
    assert meta is not None and meta.last_modified is not None
    assert meta.last_modified.tzinfo is UTC  # read by `_parse_s3_timestamp`, not dateutil
    assert (meta.last_modified - before).total_seconds() >= -1.0
