"""ShouldRateLimit on a 3-master Redis Cluster: p50/p99 for 1, 3 and 6 descriptors.

Usage::

    python tests/bench/bench_cluster.py [bench_rls.py's flags]

It starts a Redis Cluster of three masters (no replicas) on free loopback ports and runs
``bench_rls.py --backend redis+cluster://... --descriptors 1,3,6 --half-rate`` against it
(add ``--pin --repeat 3`` as for the other figures, ``--paced-rate 800`` to pace the latency
runs at one rate for every case; any other flag goes to bench_rls.py).
A request's descriptors land on different slots, most often on different nodes: ferryman
asks every node it needs at once, one write per node, so the latency should hardly grow with
the count (the reference asks the slots one after another). The figures are req/s against
the ceiling at full load, and p50/p99 at half the ceiling's req/s. This is a benchmark, not
a test: pytest does not collect this directory.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests/ helpers
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_rls
from helpers.redis_procs import RedisCluster


def main(argv: Sequence[str] | None = None) -> int:
    extra = list(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="ferryman-cluster-") as tmp:
        cluster = RedisCluster(Path(tmp), masters=3).start()
        try:
            args = ["--backend", cluster.url, "--descriptors", "1,3,6", "--half-rate", *extra]
            return bench_rls.main(args)
        finally:
            cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
