"""`laminar report`, `laminar policies` and `laminar demo`: the report is written beside a local store (or to
``--out``) with a one-line count of partitions, epochs, migrations and failovers; the policies are each role's
least-privilege S3 policy and the bucket policy for ``--bucket``/``--prefix``/``--nodes``; the demo's flags
become its options, checked before anything starts.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from laminar_orchestration import cli
from laminar_orchestration.ops import demo
from laminar_orchestration.ops.report import write_report
from laminar_orchestration.protocol.capabilities import storage_policies
from tests.cli.conftest import run_error
from tests.ops.test_report import build_history
from tests.processes import laminar


@pytest.mark.processes
def test_cli_writes_the_report_beside_the_local_store(tmp_path: Path) -> None:
    build_history(tmp_path)
    url = (tmp_path / "store").as_uri()
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    run = laminar("report", "--store", url, cwd=elsewhere)
    assert run.returncode == 0, run.stderr
    out = tmp_path / "laminar-report.html"
    assert f"wrote {out}" in run.stdout
    assert "3 partitions, 4 epochs (1 migration, 1 failover)" in run.stdout
    assert not list(elsewhere.iterdir())  # nothing in the working directory
    page = out.read_text()
    assert (
        page.startswith("<!doctype html>")
        and "<script" not in page
        and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    )  # self-contained: nothing loaded from elsewhere
    png = tmp_path / "laminar-report.png"
    if importlib.util.find_spec("matplotlib") is None:
        assert not png.exists() and "no PNG: matplotlib is not installed" in run.stdout
    else:
        assert f"wrote {png}" in run.stdout and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.processes
def test_cli_report_out_and_errors(tmp_path: Path) -> None:
    ledger = build_history(tmp_path)
    written = write_report(ledger, tmp_path / "sub" / "timeline.html", png=False)
    assert written.html.is_file() and written.png is None
    empty = tmp_path / "empty"
    empty.mkdir()
    run = laminar("report", "--store", empty.as_uri(), "--out", str(tmp_path / "x.html"))
    assert run.returncode == 7 and "no cluster" in run.stderr  # not found
    assert not (tmp_path / "x.html").exists()


def test_report_with_no_png_writes_the_page_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build_history(tmp_path)
    out = tmp_path / "out" / "timeline.html"
    assert cli.main(["report", "--store", (tmp_path / "store").as_uri(), "--out", str(out), "--no-png"]) == 0
    assert capsys.readouterr().out.splitlines() == ["3 partitions, 4 epochs (1 migration, 1 failover)", f"wrote {out}"]
    assert [p.name for p in out.parent.iterdir()] == ["timeline.html"]
    # One of a kind is counted in the singular, none in the plural.
    url = (tmp_path / "one").as_uri()
    assert cli.main(["init", "--store", url, "--partitions", "1"]) == 0
    capsys.readouterr()
    assert cli.main(["report", "--store", url, "--out", str(tmp_path / "one.html"), "--no-png"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "1 partition, 0 epochs (0 migrations, 0 failovers)"


def test_policies_render_every_roles_policy_for_the_bucket(capsys: pytest.CaptureFixture[str]) -> None:
    expected = storage_policies("bucket", "laminar/prod", nodes=[1, 2])
    assert cli.main(["policies", "--bucket", "bucket", "--prefix", "laminar/prod", "--nodes", "2,1,2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(expected.to_json()))
    assert cli.main(["policies", "--bucket", "bucket", "--prefix", "laminar/prod", "--nodes", "2,1"]) == 0
    text = capsys.readouterr().out
    for role in expected.roles:
        assert f"# IAM policy of the {role} role (s3://bucket/laminar/prod)" in text
    assert "# bucket policy of bucket" in text


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--bucket", "  "], "--bucket: give the bucket's name"),
        (["--bucket", "b", "--nodes", "1,x"], "--nodes: 'x' is not a node id"),
        (["--bucket", "b", "--nodes", "0"], "--nodes: node 0 is the 'unassigned' sentinel"),
    ],
)
def test_policies_name_a_bad_bucket_or_node(capsys: pytest.CaptureFixture[str], argv: list[str], named: str) -> None:
    code, line = run_error(capsys, "policies", *argv)
    assert code == 2 and named in line


def test_demo_flags_become_its_options_checked_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    started: list[demo.DemoOptions] = []

    def run_demo(options: demo.DemoOptions) -> int:
        started.append(options)
        return 0

    monkeypatch.setattr(demo, "run_demo", run_demo)
    monkeypatch.chdir(tmp_path)
    url = (tmp_path / "store").as_uri()
    argv = ["demo", "--store", url, "--nodes", "2", "--metrics-port", "0", "--no-dagster", "--heartbeat-timeout", "2.5"]
    assert cli.main(argv) == 0
    (options,) = started
    assert (options.store, options.nodes, options.metrics_port, options.dagster) == (url, 2, None, False)
    assert (options.heartbeat_timeout_s, options.base_dir, options.partitions) == (2.5, tmp_path, 4)
    code, line = run_error(capsys, "demo", "--interval", "0")
    assert code == 2 and "--interval: must be > 0" in line
    assert len(started) == 1  # refused before the demo started
