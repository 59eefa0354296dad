"""The control plane: deciding and driving moves of partitions between nodes.

The migration coordinator (with what it records of a move and what it waits for
between phases), driving moves with deadlines and limits, placement (where
partitions should run), operations over the whole cluster (rebalance, a node's
failover), the failovers of every dead owner's partitions the control plane's
periodic look drives, the retry policy of failed migrations, the
cluster snapshot the sensors and `status` read, and what the Dagster assets show
of it: the ownership rows and what the nodes have committed. The Dagster code
location only translates these decisions.

May import: `protocol`, `store` and the package root. Never the data plane, the
operator tools or the CLI.
"""
