"""Running the chaos suite: every selected scenario in order, then the report (``python -m laminar_dev.chaos``)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from .processes import ProcessChaos
from .profiles import NODE_IDS, PROFILES, SCENARIOS, Profile
from .results import ScenarioResult, format_table, report_json
from .store_faults import store_faults_local, store_faults_s3

_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def _check_loopback(store_url: str) -> None:
    """Chaos runs on loopback only: an S3 store must be reached through a local endpoint."""
    if not store_url.startswith("s3://"):
        return
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    host = urlparse(endpoint).hostname or ""
    if host not in _LOOPBACK_HOSTS:
        raise ValueError(
            f"the chaos suite runs on loopback only: {store_url} needs AWS_ENDPOINT_URL pointing at "
            f"127.0.0.1/localhost, not {endpoint or 'AWS'}"
        )


def _skipped(name: str, backend: str, reason: str) -> ScenarioResult:
    return ScenarioResult(name, backend, skipped=reason)


def run_chaos(
    profile: Profile,
    names: Sequence[str] | None = None,
    *,
    store_url: str | None = None,
    workdir: Path,
    say: Callable[[str], None] = lambda _msg: None,
) -> list[ScenarioResult]:
    """Run the selected scenarios (all by default) in their fixed order; return one result per row.

    `store_url` is the store the node processes share (it must hold no
    cluster; default: a fresh local store in `workdir`). The store-fault
    scenario always uses its own local store and moto server.
    """
    selected = [s for s in SCENARIOS if names is None or s in names]
    started = time.monotonic()
    results: list[ScenarioResult] = []
    faults: list[ScenarioResult] = []
    process_names = [s for s in selected if s != "store-faults"]
    chaos: ProcessChaos | None = None
    faults_thread: threading.Thread | None = None

    def store_faults() -> None:
        for run in (store_faults_local, store_faults_s3):
            try:
                faults.append(run(profile, workdir, say))
            except Exception as exc:  # e.g. the moto server did not start
                backend = "local" if run is store_faults_local else "s3/moto"
                faults.append(ScenarioResult("store-faults", backend, error=f"{type(exc).__name__}: {exc}"))

    try:
        if process_names:
            url = store_url or (workdir / "store").resolve().as_uri()
            _check_loopback(url)
            chaos = ProcessChaos(url, workdir / "cluster", profile, say)
            say(f"starting nodes {list(NODE_IDS)} on {url}")
            chaos.start_nodes()
        if "store-faults" in selected:
            if chaos is None:
                store_faults()
                return faults
            # In-process, in this process: it runs while the node processes boot and the first
            # process scenarios run (they share nothing but the CPU).
            faults_thread = threading.Thread(target=store_faults, name="chaos-store-faults", daemon=True)
            faults_thread.start()
        if chaos is None:
            return results
        plan: list[tuple[str, Callable[[ScenarioResult], None], dict[str, Any]]] = []
        for name in process_names:
            reps = (
                profile.repetitions
                if name in ("kill9-mid-batch", "zombie", "kill9-mid-release", "orchestrator-killed")
                else 1
            )
            for rep in range(reps):
                label = name if rep == 0 else f"{name}#{rep + 1}"
                plan.append((label, _body(chaos, name, rep), _needs(name)))
        for label, body, needs in plan:
            if time.monotonic() - started > profile.budget_s:
                results.append(_skipped(label, chaos.backend, f"time budget of {profile.budget_s:.0f}s used up"))
                continue
            results.append(chaos.scenario(label, body, **needs))
        if faults_thread is not None:
            faults_thread.join(max(60.0, profile.budget_s - (time.monotonic() - started)))
            if faults_thread.is_alive():
                faults.append(ScenarioResult("store-faults", "-", error="still running at the end of the time budget"))
    finally:
        if chaos is not None:
            chaos.close()
    return [*faults, *results]


def _body(chaos: ProcessChaos, name: str, rep: int) -> Callable[[ScenarioResult], None]:
    bodies: dict[str, Callable[[ScenarioResult], None]] = {
        "kill9-mid-batch": chaos.kill9_mid_batch,
        "zombie": chaos.zombie,
        "kill9-mid-release": lambda r: chaos.kill9_mid_release(r, rep),
        "orchestrator-killed": lambda r: chaos.orchestrator_killed(r, rep),
        "migrations-rebalance": chaos.migrations_rebalance,
        "rolling-restart": chaos.rolling_restart,
    }
    return bodies[name]


def _needs(name: str) -> dict[str, Any]:
    if name in ("migrations-rebalance", "rolling-restart"):
        return {"all_nodes": True}
    return {"min_live": 2}


def run_and_report(
    *,
    profile_name: str,
    names: Sequence[str] | None,
    store_url: str | None,
    as_json: bool,
    out: str | None,
    workdir: str | None,
) -> int:
    """Run the suite, print the table (or JSON), write both to files; 0 if every scenario held."""
    profile = PROFILES[profile_name]
    began = time.monotonic()

    def say(msg: str) -> None:
        print(f"[chaos {time.monotonic() - began:7.1f}s] {msg}", file=sys.stderr, flush=True)

    def on_term(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop every process

    previous = signal.signal(signal.SIGTERM, on_term)
    keep = workdir is not None
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="laminar-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    started_at = datetime.now(UTC)
    try:
        results = run_chaos(profile, names, store_url=store_url, workdir=work, say=say)
    finally:
        signal.signal(signal.SIGTERM, previous)
    report = report_json(
        results,
        profile=profile.name,
        started_at=started_at.isoformat(),
        duration_s=round(time.monotonic() - began, 1),
        store=store_url or "a fresh local store",
        workdir=str(work),
    )
    title = (
        f"laminar chaos suite, profile {profile.name}, {started_at:%Y-%m-%d %H:%M}Z, "
        f"{report['duration_s']:.0f}s: {'OK' if report['ok'] else 'FAILED'}"
    )
    table = format_table(results, title=title)
    text_path = Path(out) if out else Path(".laminar") / "chaos" / f"report-{profile.name}.txt"
    json_path = text_path if text_path.suffix == ".json" else text_path.with_suffix(".json")
    if text_path == json_path:
        text_path = text_path.with_suffix(".txt")
    text_path.parent.mkdir(parents=True, exist_ok=True)
    text_path.write_text(table + "\n")
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2) if as_json else table, flush=True)
    if report["ok"] and not keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        say(f"node logs and stores kept in {work}")
    say(f"report written to {text_path} and {json_path}")
    return 0 if report["ok"] else 1


def build_parser() -> argparse.ArgumentParser:
    """The arguments of ``python -m laminar_dev.chaos``."""
    parser = argparse.ArgumentParser(
        prog="python -m laminar_dev.chaos",
        description="kill, pause and restart nodes and the orchestrator, inject store faults, then audit: "
        "no duplicate, no loss, one owner per epoch, every stale write rejected (loopback only; "
        "run from a checkout of the repository)",
    )
    parser.add_argument("--profile", choices=tuple(PROFILES), default="short", help="short (~5 min) or long (~15 min)")
    parser.add_argument(
        "--store",
        default=None,
        metavar="URL",
        help="an EMPTY store for the node processes: file:///path, or s3://bucket/prefix with a loopback "
        "AWS_ENDPOINT_URL (default: a fresh local store in the work directory)",
    )
    parser.add_argument(
        "--scenario",
        action="extend",
        nargs="+",
        metavar="NAME",
        help=f"run only these ({', '.join(SCENARIOS)})",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of the table")
    parser.add_argument(
        "--out",
        metavar="FILE",
        help="write the table to FILE and the JSON report next to it (default .laminar/chaos/report-PROFILE.txt)",
    )
    parser.add_argument(
        "--workdir", metavar="DIR", help="keep stores and node logs here (default: a temporary directory)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m laminar_dev.chaos``: 0 when every scenario held, 1 when one did not, 2 on a bad argument."""
    args = build_parser().parse_args(argv)
    unknown = sorted(set(args.scenario or ()) - set(SCENARIOS))
    if unknown:
        print(f"chaos: error: unknown scenario(s) {unknown}; choose from {list(SCENARIOS)}", file=sys.stderr)
        return 2
    try:
        return run_and_report(
            profile_name=args.profile,
            names=args.scenario,
            store_url=args.store,
            as_json=args.json,
            out=args.out,
            workdir=args.workdir,
        )
    except ValueError as exc:  # a store that is not on loopback
        print(f"chaos: error: {exc}", file=sys.stderr)
        return 2
