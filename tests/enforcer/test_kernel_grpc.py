"""Real-kernel gRPC tests: HTTP/2 stream timing and reconnection of an existing channel.

gRPC opens its connections from its own threads, so the client and servers run in a child
process entered into the test's namespace and cgroup; the kernel plane stays in this one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from policyc.enforcer.collaborators import MemoryAudit
from policyc.enforcer.endpoint import Endpoint
from policyc.enforcer.kernel_events import KernelEvent
from policyc.enforcer.kernel_plane import KernelPlane, monotonic_deadline_ns
from policyc.enforcer.kernel_abi import EventKind
from policyc.enforcer.records import ActionKind

CHILD = Path(__file__).with_name("netns_grpc_child.py")


def test_grpc_stream_timings_and_reconnect_to_backup(
    kernel_plane: KernelPlane, netns: str, cgroup: Path, kernel_audit: MemoryAudit
) -> None:
    streams: list[KernelEvent] = []
    lock = threading.Lock()

    def on_event(ev: KernelEvent) -> None:
        if ev.kind is EventKind.STREAM_DONE:
            with lock:
                streams.append(ev)

    unsubscribe = kernel_plane.subscribe(on_event)
    child = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{netns}", sys.executable, str(CHILD), str(cgroup / "cgroup.procs")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        first = json.loads(child.stdout.readline())
        p_ep, b_ep = Endpoint.of("127.0.0.1", first["primary"]), Endpoint.of("127.0.0.1", first["backup"])
        assert all(c[2].startswith("primary") for c in first["calls"])
        kernel_plane.drain()
        time.sleep(0.05)
        kernel_plane.drain()
        with lock:
            timed = sorted((e for e in streams if e.b == p_ep and not e.reset), key=lambda e: e.value2)
        assert len(timed) == 4, f"kernel timed {len(timed)} streams to {p_ep} (warm-up + 3)"
        timed = timed[1:]
        # Both clocks are CLOCK_MONOTONIC: the kernel's stream lies inside the client's call (the client reads its
        # clock before it sends and after it has read the answer) and spans the server's delay. (Within 4 ms of
        # the client's figures on a quiet machine; at load 20 the client's own scheduling added 5 ms and more.)
        for ev, (start_ns, dur_ns, _reply), delay_ms in zip(timed, first["calls"], (20, 60, 40)):
            said = f"kernel {ev.value2}+{ev.value / 1e6:.2f} ms vs client {start_ns}+{dur_ns / 1e6:.2f} ms"
            assert start_ns <= ev.value2 and ev.value2 + ev.value <= start_ns + dur_ns, said
            assert ev.value >= delay_ms * 1e6, said

        before = len(kernel_audit.records)
        kernel_plane.quarantine(p_ep, b_ep, 9, monotonic_deadline_ns(30))
        ended = kernel_plane.end_connections(p_ep)
        assert ended >= 1
        child.stdin.write("reconnect\n")
        child.stdin.flush()
        after = json.loads(child.stdout.readline())["after"]
        assert after[-1].startswith("backup"), after
        kernel_plane.drain()
        time.sleep(0.05)
        kernel_plane.drain()
        redirects = [r for r in kernel_audit.records[before:] if r.kind is ActionKind.KERNEL_REDIRECT]
        assert redirects and redirects[0].target == str(p_ep)
    finally:
        unsubscribe()
        child.kill()
        child.wait()
