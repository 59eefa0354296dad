"""``python -m laminar_dev.sim simulate --seed S --steps N``, ``python -m laminar_dev.sim soak --minutes M`` and
``python -m laminar_dev.sim log-ends --seeds N`` (the focused log-ends scenario)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Sequence

from .log_ends import run_log_ends_scenario
from .reverts import Knobs
from .soak import SoakReport, soak
from .world import ScenarioResult, SimConfig, run_scenario

_KNOBS = [f.name for f in dataclasses.fields(Knobs)]


def _config(args: argparse.Namespace, seed: int) -> SimConfig:
    knobs = Knobs(**{name: True for name in args.revert})
    return SimConfig(
        seed=seed,
        steps=args.steps,
        partitions=args.partitions,
        nodes=args.nodes,
        fault_rate=args.fault_rate,
        knobs=knobs,
        full_trace=getattr(args, "trace", False),
    )


def _replay_command(args: argparse.Namespace, seed: int) -> str:
    extra = "".join(f" --revert {k}" for k in args.revert)
    return (
        f"python -m laminar_dev.sim simulate --seed {seed} --steps {args.steps} --partitions {args.partitions} "
        f"--nodes {args.nodes} --fault-rate {args.fault_rate}{extra} --trace"
    )


def _describe(result: ScenarioResult) -> str:
    counts = result.counts
    return (
        f"seed {result.seed}: {counts.steps} steps ({counts.fault_steps} with faults), "
        f"{result.simulated_s:.1f} simulated s, {counts.describe()}, "
        f"trace {result.trace_hash}: {'ok' if result.ok else 'VIOLATION'}"
    )


def _print_failure(result: ScenarioResult, args: argparse.Namespace, *, tail: int) -> None:
    v = result.violation
    assert v is not None
    print(f"FAILED seed {result.seed}: {v.invariant} violated: {type(v).__name__} {v.fields()}")
    print(f"  {v}")
    lines = result.trace if tail <= 0 else result.trace[-tail:]
    print(f"trace ({len(lines)} of the last lines):" if tail > 0 else "trace:")
    for line in lines:
        print(f"  {line}")
    print(f"replay: {_replay_command(args, result.seed)}")


def cmd_simulate(args: argparse.Namespace) -> int:
    result = run_scenario(_config(args, args.seed))
    if args.trace and result.ok:
        for line in result.trace:
            print(line)
    print(_describe(result))
    if not result.ok:
        _print_failure(result, args, tail=0 if args.trace else 60)
        return 1
    return 0


def cmd_soak(args: argparse.Namespace) -> int:
    base = args.base_seed if args.base_seed is not None else time.time_ns() % 1_000_000_007
    print(f"soak: base seed {base}, {args.minutes:g} min, {args.workers or os.cpu_count()} worker processes")

    def progress(report: SoakReport) -> None:
        print(f"  {report.summary()}", flush=True)

    report = soak(
        _config(args, base),
        base_seed=base,
        budget_s=args.minutes * 60,
        workers=args.workers,
        stop_on_failure=not args.keep_going,
        progress=progress,
    )
    print(report.summary())
    for failure in report.failures:
        _print_failure(failure, args, tail=60)
    return 1 if report.failures else 0


def cmd_log_ends(args: argparse.Namespace) -> int:
    base = args.base_seed if args.base_seed is not None else time.time_ns() % 1_000_000_007
    knobs = Knobs(**{name: True for name in args.revert})
    failed = 0
    for seed in range(base, base + args.seeds):
        result = run_log_ends_scenario(seed, knobs)
        if not result.ok:
            failed += 1
            for v in result.violations:
                print(f"FAILED seed {seed}: {v.broken.value} at {v.at:.1f} s: {v.detail} (outages {result.outages})")
    print(f"log-ends: {args.seeds} seeds from {base}, {failed} with violations")
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m laminar_dev.sim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def shape(p: argparse.ArgumentParser) -> None:
        p.add_argument("--steps", type=int, default=300, help="protocol steps with faults per scenario")
        p.add_argument("--partitions", type=int, default=2)
        p.add_argument("--nodes", type=int, default=3)
        p.add_argument("--fault-rate", type=float, default=0.05, help="probability that a store call fails")
        p.add_argument(
            "--revert", action="append", default=[], choices=_KNOBS, help="revert a fix (to see the bug found)"
        )

    p = sub.add_parser("simulate", help="run one scenario and print its verdict (and trace)")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--trace", action="store_true", help="print the whole trace")
    shape(p)
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("soak", help="run scenarios from a base seed on all cores for a while")
    p.add_argument("--minutes", type=float, required=True)
    p.add_argument("--base-seed", type=int, help="default: derived from the time (printed)")
    p.add_argument("--workers", type=int, help="worker processes (default: one per core)")
    p.add_argument("--keep-going", action="store_true", help="do not stop at the first failure")
    shape(p)
    p.set_defaults(func=cmd_soak)

    p = sub.add_parser("log-ends", help="run the log-ends scenario (a worker while the log ends are unreadable)")
    p.add_argument("--seeds", type=int, default=1000)
    p.add_argument("--base-seed", type=int, help="default: derived from the time (printed)")
    p.add_argument("--revert", action="append", default=[], choices=_KNOBS, help="revert a fix (to see it found)")
    p.set_defaults(func=cmd_log_ends)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (1 when an invariant was violated)."""
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
