"""How long a replica takes to start on a fleet store that already holds N instances: a
real one-member etcd on loopback, N instance records put under a fresh prefix (untimed),
then a `policyc serve` replica (in process, `ServerThread`) started on that prefix,
timed from `start()` to serving, with the registry's size checked.

    .venv/bin/python benchmarks/replica_start.py               # 100,000 instances
    .venv/bin/python benchmarks/replica_start.py --n 10000     # quicker

The fleet is `benchmarks/match.py`'s (hosts of 8 GPUs, one model and region per host,
every instance admitted), with a score on one instance in ten.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from match import fleet  # noqa: E402

from policyc.cluster import instance_codec  # noqa: E402
from policyc.cluster.config import FleetConfig  # noqa: E402
from policyc.cluster.etcd_store import EtcdStore  # noqa: E402
from policyc.cluster.keys import Keys  # noqa: E402
from policyc.cluster.local_etcd import LocalEtcd  # noqa: E402
from policyc.cluster.store import Put  # noqa: E402
from policyc.compiler.pipeline import compile_paths  # noqa: E402
from policyc.server.app import DecisionServer, ServerThread  # noqa: E402
from policyc.server.config import ClusterSpec, EnforcerMode, ServeConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


async def _fill(endpoints: list[str], records: list[tuple[str, bytes]]) -> None:
    s = EtcdStore(endpoints, op_timeout=60.0, call_timeout=30.0)
    await s.connect()
    try:
        sem = asyncio.Semaphore(8)

        async def txn(chunk: list[tuple[str, bytes]]) -> None:
            async with sem:
                await s.transact([], [Put(k, v) for k, v in chunk])
        await asyncio.gather(*(txn(records[i:i + 100]) for i in range(0, len(records), 100)))
    finally:
        await s.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    args = ap.parse_args()
    r = compile_paths([str(REPO / "policies")], analyse=False)
    assert r.ok and r.bundle is not None
    bundle = r.bundle
    insts = fleet(bundle, args.n, random.Random(7))
    prefix = f"/bench-replica-start-{os.getpid()}/"
    keys = Keys(prefix)
    records = [(keys.instance(i.id), instance_codec.encode(i, 0.5 if n % 10 == 0 else None)) for n, i in enumerate(insts)]
    etcd = LocalEtcd.start(1)
    try:
        t = time.perf_counter()
        asyncio.run(_fill(etcd.endpoints, records))
        print(f"{args.n:,} instance records ({sum(len(v) for _, v in records) / 1e6:.1f} MB) put in "
              f"{time.perf_counter() - t:.1f} s (untimed)")
        del records, insts
        fleet_cfg = FleetConfig(etcd=tuple(etcd.endpoints), name="bench", prefix=prefix, op_timeout=60.0, lease_ttl=int(os.environ.get("LEASE_TTL", "5")))
        cfg = ServeConfig(cluster=ClusterSpec(seed=1, hosts=8, gpus_per_host=4, hosts_per_rack=4),  # type: ignore[call-arg]
                          enforcer=EnforcerMode.USERSPACE, watch_gpus=False, fleet=fleet_cfg, open_fleet=True)
        th = ServerThread(DecisionServer(bundle, cfg))
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        cpu0, t = time.process_time(), time.perf_counter()
        th.start()
        wall, cpu = time.perf_counter() - t, time.process_time() - cpu0
        size = len(th.server.state.registry)
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(f"replica start on {args.n:,} stored instances: {wall:.2f} s wall, {cpu:.2f} s CPU (this process, "
              f"all threads), registry {size:,} instances, peak RSS +{(rss1 - rss0) / 1024:.0f} MB")
        th.stop()
        if size != args.n:
            raise SystemExit(f"the replica registered {size:,} of {args.n:,} instances")
    finally:
        etcd.stop()


if __name__ == "__main__":
    main()
