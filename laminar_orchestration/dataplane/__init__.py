"""The data plane: the node process, its partition workers and their local state.

The node (heartbeat, reconcile loop), the worker (fenced batch loop and its side
of a migration), batches and the Spark engine, the local keyed store,
checkpoints, restoring state from the manifest chain, warm standbys and
backpressure.

May import: `protocol`, `store` and the package root. Never the control plane,
the operator tools or the CLI.
"""
