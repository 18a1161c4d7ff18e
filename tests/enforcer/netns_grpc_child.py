"""Run inside a test network namespace (nsenter --net) and cgroup: the gRPC side of the
kernel tests. Protocol on stdin/stdout, one JSON object per line.

argv: cgroup.procs path. Prints {"primary": port, "backup": port, "calls": [[start_ns, dur_ns, reply]...]}
then waits for "reconnect" and prints {"after": [reply, ...]} once calls reach the backup.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import grpc  # noqa: E402
from grpc_rig import start_server, stub  # noqa: E402

Path(sys.argv[1]).write_text(str(os.getpid()))
primary, p_port = start_server("primary")
backup, b_port = start_server("backup")
channel = grpc.insecure_channel(f"127.0.0.1:{p_port}")
call = stub(channel)
grpc.channel_ready_future(channel).result(timeout=5)
call(b"0", timeout=5)  # warm-up: the timed calls then measure streams, not connection set-up
calls = []
for delay in ("20", "60", "40"):
    t0 = time.monotonic_ns()
    reply = call(delay.encode(), timeout=5).decode()
    calls.append([t0, time.monotonic_ns() - t0, reply])
print(json.dumps({"primary": p_port, "backup": b_port, "calls": calls}), flush=True)
assert sys.stdin.readline().strip() == "reconnect"
after = []
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    try:
        after.append(call(b"0", timeout=2, wait_for_ready=True).decode())
    except grpc.RpcError as exc:
        after.append(f"error:{exc.code().name}")
    if after[-1].startswith("backup"):
        break
    time.sleep(0.05)
print(json.dumps({"after": after}), flush=True)
channel.close()
primary.stop(0)
backup.stop(0)
