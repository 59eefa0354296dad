"""What the CLI's tests share: a freshly initialised local cluster, and running a command that must fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from laminar_orchestration import cli
from laminar_orchestration.store import open_store


@pytest.fixture
def cluster(tmp_path: Path) -> str:
    """The URL of a local store in which `laminar init` made a cluster of two partitions."""
    url = (tmp_path / "store").as_uri()
    assert cli.main(["init", "--store", url, "--partitions", "2"]) == 0
    return url


def snapshot(url: str) -> dict[str, str]:
    """Every key of the store with its ETag: equal snapshots mean nothing was written."""
    store = open_store(url)
    heads = {key: store.head(key) for key in store.list("")}
    return {key: meta.etag for key, meta in heads.items() if meta is not None}


def run_error(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """Run the CLI expecting an error: return the exit code and the one error line."""
    code = cli.main(list(argv))
    err = capsys.readouterr().err
    assert code != 0
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("laminar: error: "), err
    return code, lines[0]
