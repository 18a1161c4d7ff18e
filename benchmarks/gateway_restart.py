"""How long a gateway killed with -9 takes to serve again (issue 36's figure: within 5 s, in
10 of 10 tries, with the registry it had, no Envoy outliving its parent).

A real `policyc gateway` process (fixed ports, a state dir, an audit log), a real KServe
model server registered once through its decision API. Each try: `kill -9` the gateway,
check every child it had (Envoy, the audit writer) is gone within 5 s, start it again on
the same ports, and time from the launch to the first request answered through Envoy by
the registered instance. The baseline, measured in the same run: a cold first start (no
state dir yet), from launch to the gateway's ready line.

    python benchmarks/gateway_restart.py [--tries 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(REPO / "tests" / "gateway"))

from restart_rig import GatewayProcess, children, cpu_seconds, survivors  # noqa: E402

from policyc.compiler.pipeline import compile_paths  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tries", type=int, default=10)
    ap.add_argument("--bound", type=float, default=5.0, help="seconds a restart may take (default 5)")
    args = ap.parse_args()
    r = compile_paths([str(REPO / "policies")], analyse=False)
    assert r.ok and r.bundle is not None
    work = Path(tempfile.mkdtemp(prefix="policyc-restart-"))
    gw = GatewayProcess(r.bundle, work, extra=("--audit-log", str(work / "audit.db")))
    gw.start_models()
    took: list[float] = []
    cpu: list[float] = []  # the gateway's CPU seconds (and its Envoy's) until it served: what load cannot inflate
    outlived = 0
    try:
        t0 = gw.start()
        gw.register()
        cold = gw.serving(t0)
        for i in range(args.tries):
            kids = gw.kill9()
            left = survivors(kids)
            outlived += len(left)
            t0 = gw.start()
            took.append(gw.serving(t0))
            assert gw.proc is not None
            cpu.append(cpu_seconds(gw.proc.pid) + sum(cpu_seconds(k) for k in children(gw.proc.pid)))
            print(f"try {i + 1}: serving {took[-1]:.2f} s after launch ({cpu[-1]:.2f} CPU s in the gateway and its "
                  f"children); children outliving the killed gateway: {len(left)} of {len(kids)}", flush=True)
        code, err = gw.stop()
    finally:
        gw.close()
    within = sum(t <= args.bound for t in took)
    print(f"\ncold first start to serving (registration included): {cold:.2f} s")
    print(f"restart after kill -9 to serving, {len(took)} tries: median {statistics.median(took):.2f} s, "
          f"max {max(took):.2f} s, within {args.bound:g} s: {within} of {len(took)}; children that outlived: {outlived}; "
          f"final stop exit {code}")
    print(f"CPU seconds until serving (gateway + Envoy + audit writer): median {statistics.median(cpu):.2f}, "
          f"max {max(cpu):.2f}")
    with open("/proc/loadavg") as f:
        print(f"load average at the end: {f.read().split()[0]}")
    return 0 if within == len(took) and outlived == 0 and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
