"""Development tooling of laminar-orchestration, in the repository checkout only (never in the wheel).

* `laminar_dev.chaos` — the chaos suite (``python -m laminar_dev.chaos``):
  faults on purpose, then an audit of every promise;
* `laminar_dev.localcluster` — worker nodes as processes on one machine;
* `laminar_dev.faults` — a store wrapper that injects failures;
* `laminar_dev.s3server` — moto's S3 server on loopback, and the launcher the
  tests, the benchmarks and the chaos suite share.

It imports the library; the library never imports it.
"""
