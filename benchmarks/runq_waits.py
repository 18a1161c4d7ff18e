"""Which threads waited for a core while a command ran, how long, and behind whom.

A scheduler tracer (BPF on the `sched_wakeup`, `sched_wakeup_new` and `sched_switch`
tracepoints, bcc; root): every time a thread became runnable and waited at least
`--min-us` before it got a core, the wait and the task that ran on that core just before
it. Printed per process kind and thread name (a vLLM API server's threads, Envoy's, the
policyc gateway's, the load generator's, by their command lines) and per (waiter, task
before it). What it answers: on this 2-core machine, real vLLM's workers busy-poll their
queue for a second after each step (vLLM's `SpinCondition`), and every other thread's
wake-up queues behind them; a router with more thread hops per request pays that wait
more often (benchmarks/RESULTS.md, "the cores, not the placement").

    sudo .venv/bin/python benchmarks/runq_waits.py -- .venv/bin/python benchmarks/slo_attainment.py --real-vllm 2 ...

The tracepoints' formats are read from tracefs; where debugfs is not mounted this mounts it
(bcc looks for /sys/kernel/debug/tracing). The tracer costs a few microseconds a context
switch: compare routers under it, not with runs without it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

PROGRAM = r"""
BPF_HASH(start, u32, u64, 65536);
struct wait_t { u32 pid; u32 prev_pid; u64 delta_us; u64 ts; char task[16]; char prev_task[16]; };
BPF_PERF_OUTPUT(waits);
TRACEPOINT_PROBE(sched, sched_wakeup) {
    u32 pid = args->pid; u64 ts = bpf_ktime_get_ns();
    if (pid) start.update(&pid, &ts);
    return 0;
}
TRACEPOINT_PROBE(sched, sched_wakeup_new) {
    u32 pid = args->pid; u64 ts = bpf_ktime_get_ns();
    if (pid) start.update(&pid, &ts);
    return 0;
}
TRACEPOINT_PROBE(sched, sched_switch) {
    u32 prev_pid = args->prev_pid, pid = args->next_pid;
    u64 now = bpf_ktime_get_ns();
    if (args->prev_state == 0 && prev_pid) start.update(&prev_pid, &now);  /* preempted: runnable from now */
    u64 *tsp = start.lookup(&pid);
    if (tsp == 0) return 0;
    u64 delta_us = (now - *tsp) / 1000;
    start.delete(&pid);
    if (delta_us < MIN_US) return 0;
    struct wait_t w = {};
    w.pid = pid; w.prev_pid = prev_pid; w.delta_us = delta_us; w.ts = now;
    __builtin_memcpy(&w.task, args->next_comm, 16);
    __builtin_memcpy(&w.prev_task, args->prev_comm, 16);
    waits.perf_submit(args, &w, sizeof(w));
    return 0;
}
"""

KINDS = (("vllm.entrypoints", "vllm-api"), ("policyc.cli.main gateway", "policyc-gateway"), ("envoy", "envoy"),
         ("inference_perf", "client"), ("inference-perf", "client"), ("router", "router"))


def kind_of(tid: int, cache: dict[int, str]) -> str:
    """The process kind of thread `tid`, by its process's command line ("" when none matches
    or it is gone); cached: the thread is alive when its wait is reported."""
    if tid in cache:
        return cache[tid]
    kind = ""
    try:
        tgid = next(int(line.split()[1]) for line in Path(f"/proc/{tid}/status").read_text().splitlines()
                    if line.startswith("Tgid:"))
        cmd = Path(f"/proc/{tgid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        kind = next((k for needle, k in KINDS if needle in cmd), "")
    except (OSError, StopIteration, ValueError):
        pass
    cache[tid] = kind
    return kind


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-us", type=int, default=1000, help="report waits of at least this many microseconds")
    ap.add_argument("--out", type=Path, default=None, help="every wait as a JSON line, for your own cuts")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run while tracing")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("a command to run, after --")
    try:
        from bcc import BPF  # Debian's python3-bpfcc: run with /usr/bin/python3 or a venv with system site packages
    except ImportError:
        print("runq_waits: bcc is missing (Debian's python3-bpfcc; scripts/setup.sh installs it)", file=sys.stderr)
        return 2
    if not Path("/sys/kernel/debug/tracing").exists():
        subprocess.run(["mount", "-t", "debugfs", "none", "/sys/kernel/debug"], check=False)
    bpf = BPF(text=PROGRAM.replace("MIN_US", str(args.min_us)))
    by_kind: Counter[str] = Counter()
    count: Counter[str] = Counter()
    behind: Counter[tuple[str, str]] = Counter()
    kinds: dict[int, str] = {}
    out = open(args.out, "w") if args.out else None

    def on_wait(cpu: int, data: object, size: int) -> None:
        w = bpf["waits"].event(data)
        who = f"{kind_of(w.pid, kinds) or '-'}/{w.task.decode(errors='replace')}"
        ms = w.delta_us / 1e3
        by_kind[who] += ms
        count[who] += 1
        behind[(who, w.prev_task.decode(errors="replace"))] += ms
        if out is not None:
            out.write(json.dumps({"ts": w.ts / 1e9, "tid": w.pid, "who": who, "wait_ms": ms,
                                  "behind": w.prev_task.decode(errors="replace")}) + "\n")

    bpf["waits"].open_perf_buffer(on_wait, page_cnt=256)
    proc = subprocess.Popen(command)
    done = threading.Event()

    def reap() -> None:
        proc.wait()
        done.set()

    threading.Thread(target=reap, daemon=True).start()
    while not done.is_set():
        bpf.perf_buffer_poll(timeout=200)
    bpf.perf_buffer_poll(timeout=0)
    if out is not None:
        out.close()
    print(f"waits of at least {args.min_us} us for a core, summed, while `{' '.join(command)[:80]!r}` ran")
    print(f"{'process kind/thread':40s} {'ms':>10s} {'waits':>7s}")
    for who, ms in by_kind.most_common(args.top):
        print(f"{who[:40]:40s} {ms:10.1f} {count[who]:7d}")
    print(f"\n{'waiter':40s} {'behind':16s} {'ms':>10s}")
    for (who, prev), ms in behind.most_common(args.top):
        print(f"{who[:40]:40s} {prev[:16]:16s} {ms:10.1f}")
    return proc.returncode or 0


if __name__ == "__main__":
    sys.exit(main())
