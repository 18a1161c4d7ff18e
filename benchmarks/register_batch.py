"""Registering N instances into a real `policyc serve` (a subprocess on a fresh state dir,
the embedded fleet store, its operator token): one `RegisterInstances` call against N
`RegisterInstance` calls one after another, each on its own fresh server, same instances.

    .venv/bin/python benchmarks/register_batch.py            # 10,000 instances
    .venv/bin/python benchmarks/register_batch.py --n 2000   # quicker

Instances: every (contract, GPU) pair the topology's facts and the bundle admit, on hosts
that claim no TPM (a `tpm` claim is attested one by one in either path), repeated with
new ids until N. Both runs must register all N. Reported: the wall time of the calls, and
the server process's CPU per instance (during the calls; and 2 s later, with the replica's
watch applying its own writes again), its idle rate subtracted: on a loaded machine the
wall time is mostly waiting for a core.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from policyc.client import operator_channel
from policyc.compiler import bundle_io
from policyc.compiler.bundle import Bundle
from policyc.compiler.pipeline import compile_paths
from policyc.matcher import Deployment, Instance, admission_problems
from policyc.server.proto import pb, pb_grpc

ROOT = Path(__file__).resolve().parents[1]


def _serve(d: Path, bundle: Bundle) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (d / "bundle.json").write_text(bundle_io.dumps(bundle))
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLICYC_")}
    proc = subprocess.Popen([sys.executable, "-m", "policyc.cli.main", "serve", "--bundle", str(d / "bundle.json"),
                             "--port", str(port), "--state-dir", str(d / "state")],
                            stdout=open(d / "serve.log", "w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    server = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if (d / "state" / "operator-token").exists():
            try:
                with operator_channel(server) as ch:
                    pb_grpc.DecisionsStub(ch).ListHosts(pb.ListHostsRequest(), timeout=5)
                return proc, server
            except grpc.RpcError:
                pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit("serve did not answer: " + (d / "serve.log").read_text()[-2000:])


def _items(stub: pb_grpc.DecisionsStub, bundle: Bundle, n: int) -> list[pb.RegisterInstanceRequest]:
    pairs = []
    for h in stub.ListHosts(pb.ListHostsRequest(), timeout=30).hosts:
        if h.tpm:
            continue
        for g in h.gpus:
            d = Deployment(host=h.host, gpu=g.gpu, gpu_model=g.gpu_model, region=h.region, numa_node=g.numa_node,
                           tpm=False, memory_encryption=h.memory_encryption, hardware_firewall=h.hardware_firewall,
                           tee=h.tee, session_state=g.session_state or "remote", cuda=h.cuda or "12.4")
            pairs += [(c.name, d) for c in bundle.contracts
                      if not admission_problems(Instance(id="probe", model=c.name, deployment=d), bundle)]
    if not pairs:
        raise SystemExit("no admissible (contract, GPU) pair on a host without TPM")
    out = []
    for k in range(n):
        model, d = pairs[k % len(pairs)]
        out.append(pb.RegisterInstanceRequest(id=f"bench-{k:06d}", model=model, deployment=pb.Deployment(**d.model_dump())))
    return out


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _count(stub: pb_grpc.DecisionsStub) -> int:
    return len(stub.ListInstances(pb.ListInstancesRequest(), timeout=120).instances)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000)
    args = ap.parse_args()
    r = compile_paths([str(ROOT / "policies")], analyse=False)
    assert r.ok and r.bundle is not None
    bundle = r.bundle
    opts = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
    for how in ("batch", "one by one"):
        with tempfile.TemporaryDirectory() as tmp:
            proc, server = _serve(Path(tmp), bundle)
            try:
                with operator_channel(server, opts) as ch:
                    stub = pb_grpc.DecisionsStub(ch)
                    items = _items(stub, bundle, args.n)
                    c0, t0 = _cpu_s(proc.pid), time.perf_counter()
                    time.sleep(1.0)  # the server's idle rate (its refresher, the store's sweep), subtracted below
                    idle = (_cpu_s(proc.pid) - c0) / (time.perf_counter() - t0)
                    c0 = _cpu_s(proc.pid)
                    t = time.perf_counter()
                    if how == "batch":
                        got = stub.RegisterInstances(pb.RegisterInstancesRequest(instances=items), timeout=600)
                        refused = [x.message for x in got.results if not x.registered]
                        if refused:
                            raise SystemExit(f"{len(refused)} refused, e.g. {refused[0]}")
                    else:
                        for item in items:
                            stub.RegisterInstance(item, timeout=60)
                    wall = time.perf_counter() - t
                    cpu = _cpu_s(proc.pid) - c0 - idle * wall
                    time.sleep(2.0)  # the replica applies its own writes again from the store's watch
                    settled = _cpu_s(proc.pid) - c0 - idle * (time.perf_counter() - t)
                    n = _count(stub)
                    print(f"{how:>10}: {args.n:,} instances in {wall:.2f} s ({wall / args.n * 1e6:.0f} µs each); "
                          f"server CPU {cpu / args.n * 1e6:.0f} µs each during the calls, {settled / args.n * 1e6:.0f} µs "
                          f"with the watch's echo 2 s after (idle {idle * 1e3:.0f} ms/s subtracted); the service lists {n:,}")
                    if n != args.n:
                        raise SystemExit(f"{how}: the service lists {n:,} of {args.n:,}")
            finally:
                proc.terminate()
                proc.wait(timeout=60)


if __name__ == "__main__":
    main()
