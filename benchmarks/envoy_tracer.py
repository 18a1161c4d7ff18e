"""What Envoy's OpenTelemetry tracer costs by itself: the gateway's own Envoy configuration
(`gateway/bootstrap.py`, round-robin, no picker) in front of an upstream that answers at
once (a second Envoy's `direct_response`), traced and untraced, Envoy's CPU per request.

Why: `benchmarks/gateway.py --otlp` measures tracing on the whole gateway path (Envoy, the
picker, the model servers), where the round-by-round throughput ratio moves more with the
machine's load than with tracing. This takes policyc and the model servers out, so what is
left is the cost the gateway's tracing configuration puts on Envoy, per span it makes:
`untraced` (no tracing section), `traced` (as `policyc gateway --otlp-endpoint` configures it:
the request's span and the router's upstream span, exported in batches over OTLP/gRPC); then
the same two with the ext_proc call in front, to a no-op ext_proc server (the one
`benchmarks/gateway.py` uses as its baseline, in this process) in place of policyc's picker:
Envoy then makes three spans, the request's, its ext_proc call's and the upstream's; and
`ext_proc, no upstream span` (`spawn_upstream_span: false`: the upstream request carries the
request span's context).

    .venv/bin/python benchmarks/envoy_tracer.py [--rounds 5] [--seconds 2] [--concurrency 8]

Modes alternate round by round so each sees the same machine; the OTLP receiver
(`benchmarks/otlp_sink.py`) runs in a process of its own and is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "gateway"))


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _upstream(listen: str, admin: str) -> dict[str, Any]:
    """An Envoy that answers every request itself (200, a short body): the cheapest upstream."""
    host, _, port = listen.rpartition(":")
    ahost, _, aport = admin.rpartition(":")
    hcm = {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
           "stat_prefix": "upstream", "codec_type": "AUTO",
           "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
               {"match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": "ok"}}}]}]},
           "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
               "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}
    return {"admin": {"address": {"socket_address": {"address": ahost, "port_value": int(aport)}}},
            "static_resources": {"listeners": [{"name": "upstream", "address": {"socket_address": {"address": host, "port_value": int(port)}},
                                                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                                                "typed_config": hcm}]}]}]}}


def _hcm(bootstrap: dict[str, Any]) -> dict[str, Any]:
    return bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]  # type: ignore[no-any-return]


def _round(target: str, concurrency: int, seconds: float) -> tuple[float, int]:
    """h2load, one connection carrying `concurrency` streams, closed loop: (req/s, failed)."""
    out = subprocess.run(["h2load", "-t", "1", "-c", "1", "-m", str(concurrency), "-D", f"{int(seconds * 1000)}ms",
                          "--warm-up-time", "300ms", f"http://{target}/"], capture_output=True, text=True, timeout=seconds + 60)
    rate = re.search(r"finished in [\d.]+m?s, ([\d.]+) req/s", out.stdout)
    done = re.search(r"requests: \d+ total, \d+ started, \d+ done, \d+ succeeded, (\d+) failed", out.stdout)
    if out.returncode != 0 or rate is None or done is None:
        raise SystemExit(f"h2load failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    return float(rate.group(1)), int(done.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args()
    if shutil.which("h2load") is None:
        raise SystemExit("benchmarks/envoy_tracer.py: `h2load` is not installed (Debian: nghttp2-client, which scripts/setup.sh installs)")
    from gateway_rig import free_port

    from policyc.gateway.bootstrap import GatewaySpec, build_bootstrap
    from policyc.gateway.envoy_process import EnvoyProcess

    work = Path(tempfile.mkdtemp(prefix="policyc-bench-tracer-"))
    noop_at = f"unix:{work / 'noop.sock'}"
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="noop-ext-proc", daemon=True).start()
    sink = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "otlp_sink.py")], stdout=subprocess.PIPE, text=True)
    envoys: list[EnvoyProcess] = []
    noop: Any = None
    try:
        assert sink.stdout is not None
        otlp_at = f"127.0.0.1:{sink.stdout.readline().split()[1]}"
        up_at = f"127.0.0.1:{free_port()}"
        envoys.append(EnvoyProcess(_upstream(up_at, f"127.0.0.1:{free_port()}"), work / "upstream").start())
        from gateway import _start_noop  # benchmarks/gateway.py's no-op ext_proc server

        noop, _ = asyncio.run_coroutine_threadsafe(_start_noop((up_at,), noop_at[5:]), loop).result(30)  # kept: served while referenced
        modes: dict[str, dict[str, Any]] = {}
        for mode in ("untraced", "traced", "ext_proc, untraced", "ext_proc, traced", "ext_proc, no upstream span"):
            spec = GatewaySpec(picker=noop_at, listen=f"127.0.0.1:{free_port()}", admin=f"127.0.0.1:{free_port()}",
                               endpoints=(up_at,), use_picker=mode.startswith("ext_proc"), retries=0,
                               otlp_endpoint=None if mode.endswith("untraced") else otlp_at)
            boot = build_bootstrap(spec)
            if mode.endswith("no upstream span"):
                boot = copy.deepcopy(boot)
                _hcm(boot)["tracing"]["spawn_upstream_span"] = False
            modes[mode] = boot
        targets = {}
        for mode, boot in modes.items():
            e = EnvoyProcess(boot, work / mode.replace(" ", "-")).start()
            envoys.append(e)
            targets[mode] = (spec_listen(boot), e)
        rates: dict[str, list[float]] = {m: [] for m in modes}
        cpu: dict[str, float] = dict.fromkeys(modes, 0.0)
        served: dict[str, int] = dict.fromkeys(modes, 0)
        failed = 0
        name = "http.policyc_gateway.downstream_rq_total"
        print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; {args.rounds} rounds x {args.seconds:g} s a mode, "
              f"{args.concurrency} streams on one HTTP/2 connection (h2load)")
        for _ in range(args.rounds):
            for mode, (target, envoy) in targets.items():
                c0, q0 = _cpu_s(envoy.pid or 0), envoy.stats(name).get(name, 0)
                rate, bad = _round(target, args.concurrency, args.seconds)
                cpu[mode] += _cpu_s(envoy.pid or 0) - c0
                served[mode] += envoy.stats(name).get(name, 0) - q0
                rates[mode].append(rate)
                failed += bad
        per = {m: cpu[m] / max(served[m], 1) * 1e6 for m in modes}
        for mode in modes:
            print(f"  {mode:>26}: {statistics.median(rates[mode]):7.0f} req/s (rounds {min(rates[mode]):.0f}-{max(rates[mode]):.0f}), "
                  f"gateway Envoy CPU {per[mode]:.1f} us a request ({served[mode]:,} requests)")
        two = per["traced"] - per["untraced"]
        three, no_up = per["ext_proc, traced"] - per["ext_proc, untraced"], per["ext_proc, no upstream span"] - per["ext_proc, untraced"]
        print(f"  tracing's CPU a request in Envoy: {two:+.1f} us without ext_proc (2 spans); with the ext_proc call {three:+.1f} us "
              f"(3 spans), {no_up:+.1f} us without the upstream span (2 spans); failed requests {failed}; "
              f"load average {os.getloadavg()[0]:.2f}")
    finally:
        for e in envoys:
            e.stop()
        sink.terminate()
        sink.wait(10)
        if noop is not None:
            asyncio.run_coroutine_threadsafe(noop.stop(0.1), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        shutil.rmtree(work, ignore_errors=True)


def spec_listen(boot: dict[str, Any]) -> str:
    """The `ip:port` a bootstrap's listener is on."""
    a = boot["static_resources"]["listeners"][0]["address"]["socket_address"]
    return f"{a['address']}:{a['port_value']}"


if __name__ == "__main__":
    main()
