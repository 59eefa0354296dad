"""`laminar report`: the ownership timeline, on a store built through the ledger API (no Spark)."""

from __future__ import annotations

import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.ops.report import render_html
from laminar_orchestration.ops.timeline import FAILOVER, MIGRATION, PLACEMENT, collect_report
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.producers import generate_events
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import LocalObjectStore
from tests.commits import commit_all

P, N = PartitionId, NodeId
SVG_NS = "{http://www.w3.org/2000/svg}"


def build_history(root: Path) -> Ledger:
    """Partition 0: placed on node 1, migrated to node 2, failed over to node 3.
    Partition 1: placed on node 2, 600 events committed of 1000 appended.
    Partition 2: never granted."""
    ledger = Ledger(LocalObjectStore(root / "store"))
    ledger.init_cluster(3)
    token = ledger.fence(P(0), N(1), expected_epoch=0, reason="migration m0: fence node 0")
    assert token is not None
    time.sleep(0.05)
    ledger.release(token, commit_ulid=None, source_offset=0)
    time.sleep(0.05)
    ledger.acquire(P(0), N(2), expected_epoch=1, reason="migration 1 -> 2")
    time.sleep(0.05)
    ledger.fence(P(0), N(3), expected_epoch=2, reason="failover: node 2 stopped heartbeating")
    p1 = ledger.fence(P(1), N(2), expected_epoch=0, reason="placement")
    assert p1 is not None
    source = SourceLog(ledger.store, partitions=3)
    source.append(1, generate_events(600, 10, 1, 1)[0])
    commit_all(ledger.store, p1)
    source.append(1, generate_events(400, 10, 2, 1)[0])
    return ledger


def svg_of(page: str) -> ET.Element:
    """The inline SVG of the page, parsed as XML (so it must be well-formed)."""
    match = re.search(r"<svg .*?</svg>", page, re.S)
    assert match, "no inline SVG in the report"
    return ET.fromstring(match.group(0))


def elements(svg: ET.Element, tag: str, cls: str) -> list[ET.Element]:
    return [e for e in svg.iter(SVG_NS + tag) if cls in (e.get("class") or "").split()]


def test_timeline_has_a_lane_per_partition_a_bar_per_epoch_and_markers(tmp_path: Path) -> None:
    ledger = build_history(tmp_path)
    report = collect_report(ledger)
    page = render_html(report)
    svg = svg_of(page)

    lanes = elements(svg, "g", "lane")
    assert [lane.get("data-partition") for lane in lanes] == ["0", "1", "2"]

    bars = {(b.get("data-partition"), b.get("data-epoch")): b for b in elements(svg, "rect", "bar")}
    assert {k: b.get("data-node") for k, b in bars.items()} == {
        ("0", "1"): "1",
        ("0", "2"): "2",
        ("0", "3"): "3",
        ("1", "1"): "2",
    }
    assert [bars["0", e].get("data-kind") for e in ("1", "2", "3")] == ["fence", "acquire", "fence"]
    # Bars of one partition follow each other in time and are coloured by node.
    xs = [float(bars["0", e].get("x", "0")) for e in ("1", "2", "3")]
    assert xs == sorted(xs)
    assert bars["0", "2"].get("fill") == bars["1", "1"].get("fill") != bars["0", "1"].get("fill")

    markers = {(m.get("data-partition"), m.get("data-epoch")): m for m in elements(svg, "g", "marker")}
    assert "migration" in (markers["0", "2"].get("class") or "")
    assert (markers["0", "2"].get("data-node"), markers["0", "2"].get("data-from")) == ("2", "1")
    assert "failover" in (markers["0", "3"].get("class") or "")
    assert (markers["0", "3"].get("data-node"), markers["0", "3"].get("data-from")) == ("3", "2")
    assert "placement" in (markers["0", "1"].get("class") or "")
    assert len(elements(svg, "g", "failover")) == 1 and len(elements(svg, "g", "migration")) == 1

    # The graceful handoff's pause: epoch 1 was released before epoch 2 was granted.
    released = elements(svg, "rect", "released")
    assert [(r.get("data-partition"), r.get("data-epoch")) for r in released] == [("0", "1")]

    # Legend and time axis.
    legend = " ".join(t.text or "" for g in elements(svg, "g", "legend") for t in g.iter(SVG_NS + "text"))
    for word in ("node 1", "node 2", "node 3", "migration", "failover", "released"):
        assert word in legend
    assert len(elements(svg, "text", "tick")) >= 2

    assert (report.count(MIGRATION), report.count(FAILOVER), report.count(PLACEMENT)) == (1, 1, 2)


def test_tables_list_every_grant_and_the_committed_offsets(tmp_path: Path) -> None:
    page = render_html(collect_report(build_history(tmp_path)))
    grants = re.findall(r'<tr data-partition="(\d+)" data-epoch="(\d+)">(.*?)</tr>', page, re.S)
    assert [(p, e) for p, e, _ in grants] == [("0", "1"), ("0", "2"), ("0", "3"), ("1", "1")]
    row = dict(((p, e), cells) for p, e, cells in grants)
    assert "node 3" in row["0", "3"] and "fence" in row["0", "3"] and "node 2 stopped heartbeating" in row["0", "3"]
    assert "acquire" in row["0", "2"] and "migration 1 -&gt; 2" in row["0", "2"]
    # A placement takes the partition from nobody: neither its kind nor its reason speaks of a fence.
    assert '<span class="tag placement">placement</span>' in row["0", "1"] and "fence" not in row["0", "1"]
    assert row["0", "1"].count("placement") == 2  # the tag's class and its word, not "placement placement"
    assert "migration m0: place on node 1" in row["0", "1"]
    offsets = dict(re.findall(r'<tr data-partition="(\d+)">(.*?)</tr>', page, re.S))
    assert '<td class="num committed">600</td>' in offsets["1"]
    assert '<td class="num">1,000</td>' in offsets["1"]  # source end
    assert '<td class="num committed">0</td>' in offsets["2"]


def test_only_an_epoch_still_held_is_marked_current(tmp_path: Path) -> None:
    ledger = build_history(tmp_path)
    ledger.release(ledger.adopt(P(1), N(2)), commit_ulid=None, source_offset=600)  # node 2 stopped cleanly
    page = render_html(collect_report(ledger))
    grants = dict(
        ((p, e), cells)
        for p, e, cells in re.findall(r'<tr data-partition="(\d+)" data-epoch="(\d+)">(.*?)</tr>', page, re.S)
    )
    assert "(current)" in grants["0", "3"]  # node 3 holds it
    assert "(current)" not in grants["1", "1"]  # released: nobody holds it


@pytest.mark.parametrize("seconds", [1, 3, 90, 4000, 200_000])
def test_time_axis_has_round_ticks_for_any_span(tmp_path: Path, seconds: float) -> None:
    from datetime import timedelta

    from laminar_orchestration.ops.report_notation import axis_ticks as _ticks

    start = collect_report(build_history(tmp_path)).start
    step, ticks = _ticks(start, start + timedelta(seconds=seconds))
    assert 1 <= len(ticks) <= 9
    slack = timedelta(milliseconds=1)
    assert all(start - slack <= t <= start + timedelta(seconds=seconds) + slack for t in ticks)
    assert all(round(t.timestamp() * 1000) % round(step * 1000) == 0 for t in ticks)
