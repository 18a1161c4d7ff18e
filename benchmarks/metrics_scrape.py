"""What scraping model servers' `/metrics` costs: CPU per endpoint at N endpoints (default
100) on the 50 ms tick, and the reader against prometheus_client's parser on the same page.

    .venv/bin/python benchmarks/metrics_scrape.py [--endpoints 100] [--seconds 10] [--interval 0.05]
    .venv/bin/python benchmarks/metrics_scrape.py --real-vllm      # the server's side, whole page vs narrowed

The pages served here are whole whatever the path, so the first figure is the scraper's cost of
a whole page. `--real-vllm` measures the other party: a real vLLM API server's CPU per scrape
(its process's CPU time over `--scrapes` scrapes on one kept-alive connection, idle server) of
the whole `/metrics` page against the narrowed one the scraper asks for
(`server_metric_names.narrowed_path`), in alternating rounds; the ratio is narrowed ÷ whole.

The pages are a real vLLM 0.32 `/metrics` page (tests/fixtures/llm, ~50 KB, ~600 lines),
served by a separate process (asyncio, one port per endpoint, kept-alive HTTP/1.1) so that
only the scraper's CPU is counted: the CPU time of the scraper's own thread over the run,
divided by endpoints. Baseline in the same run: reading one page with prometheus_client's
text parser (what a full parse per scrape would cost).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import time
from pathlib import Path

PAGE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "llm" / "vllm-0.32-metrics.txt"


def serve(n: int, conn) -> None:  # type: ignore[no-untyped-def]  # runs in the child process
    body = PAGE.read_bytes()
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        servers = [await asyncio.start_server(handle, "127.0.0.1", 0) for _ in range(n)]
        conn.send([s.sockets[0].getsockname()[1] for s in servers])
        await asyncio.Event().wait()

    asyncio.run(main())


def real_vllm(scrapes: int, rounds: int) -> dict[str, object]:
    """A real vLLM's API server CPU per scrape: the whole page against the narrowed one."""
    import http.client
    import os
    import statistics
    import tempfile

    from policyc.modelserver.llm_model import cached_llm_model
    from policyc.modelserver.vllm_engine import VllmServer, VllmSpec
    from policyc.placer.server_metric_names import narrowed_path, protocol

    srv = VllmServer(VllmSpec(cached_llm_model().dir, "tiny-llm"), Path(tempfile.mkdtemp(prefix="scrape-")))
    srv.spawn()
    try:
        srv.wait_ready()
        pid = srv.pid
        narrowed = narrowed_path("vllm", protocol("vllm"))
        assert narrowed is not None

        def cpu_s() -> float:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        host, port = srv.endpoint.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        per: dict[str, list[float]] = {"whole": [], "narrowed": []}
        size: dict[str, int] = {}
        for _ in range(rounds):
            for name, path in (("whole", "/metrics"), ("narrowed", narrowed)):
                c0 = cpu_s()
                for _ in range(scrapes):
                    conn.request("GET", path)
                    size[name] = len(conn.getresponse().read())
                per[name].append((cpu_s() - c0) / scrapes * 1e3)
        conn.close()
    finally:
        srv.stop()
    whole, narrow = statistics.median(per["whole"]), statistics.median(per["narrowed"])
    return {"server": "vLLM API server (real, idle)", "scrapes_per_round": scrapes, "rounds": rounds,
            "whole_page_bytes": size["whole"], "narrowed_page_bytes": size["narrowed"],
            "server_cpu_ms_per_scrape_whole": round(whole, 3), "server_cpu_ms_per_scrape_narrowed": round(narrow, 3),
            "rounds_ms_whole": [round(x, 3) for x in per["whole"]], "rounds_ms_narrowed": [round(x, 3) for x in per["narrowed"]],
            "ratio_narrowed_over_whole": round(narrow / whole, 3),
            "server_cores_at_20_scrapes_per_s_whole_narrowed": [round(whole * 0.02, 3), round(narrow * 0.02, 3)]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--real-vllm", action="store_true", help="the server's CPU per scrape on a real vLLM, whole vs narrowed")
    ap.add_argument("--scrapes", type=int, default=300, help="per round, with --real-vllm")
    ap.add_argument("--endpoints", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--interval", type=float, default=0.05)
    ap.add_argument("--fleet-budget", action="store_true",
                    help="the scraper's default fleet budget on (200 scrapes/s, 0.25 core): the tick it stretches to; "
                         "off by default, so the figure is the cost of every endpoint at --interval")
    args = ap.parse_args()
    if args.real_vllm:
        print(json.dumps(real_vllm(args.scrapes, 3), indent=1))
        return 0

    from prometheus_client.parser import text_string_to_metric_families

    from policyc.placer.metrics_scraper import MetricsScraper
    from policyc.placer.metrics_text import compile_map, read_figures
    from policyc.placer.server_metric_names import protocol

    body = PAGE.read_bytes()
    wanted = compile_map(protocol("vllm"))
    t = time.process_time()
    for _ in range(2000):
        read_figures(body, wanted)
    fast_us = (time.process_time() - t) / 2000 * 1e6
    t = time.process_time()
    for _ in range(20):
        list(text_string_to_metric_families(body.decode()))
    full_us = (time.process_time() - t) / 20 * 1e6

    parent, child = multiprocessing.Pipe()
    proc = multiprocessing.get_context("spawn").Process(target=serve, args=(args.endpoints, child), daemon=True)
    proc.start()
    ports = parent.recv()
    try:
        budget = {} if args.fleet_budget else {"max_scrapes_per_s": float("inf"), "cpu_budget": float("inf")}
        with MetricsScraper(interval_s=args.interval, **budget) as scraper:
            for p in ports:
                scraper.add(f"127.0.0.1:{p}", "vllm")
            time.sleep(1.0)  # connections made, ticks spread
            a = scraper.stats()
            time.sleep(args.seconds)
            b = scraper.stats()
            ages = [r.age_s for r in (scraper.snapshot(f"127.0.0.1:{p}") for p in ports) if r is not None]
    finally:
        proc.terminate()
        proc.join(5)
    scrapes = b.scrapes - a.scrapes
    cpu = b.cpu_s - a.cpu_s
    wall = b.wall_s - a.wall_s
    expected = args.endpoints * wall / b.tick_s  # the tick in use (the configured interval unless --fleet-budget stretched it)
    out = {
        "endpoints": args.endpoints, "interval_s": args.interval, "seconds": round(wall, 2),
        "page_bytes": len(body), "scrapes": scrapes, "scrapes_per_s": round(scrapes / wall),
        "tick_kept": round(scrapes / expected, 3), "failures": b.failures - a.failures,
        "scraper_cpu_cores": round(cpu / wall, 3),
        "cpu_per_endpoint_pct_of_a_core": round(100 * cpu / wall / args.endpoints, 3),
        "cpu_per_scrape_us": round(cpu / max(scrapes, 1) * 1e6, 1),
        "max_age_at_end_ms": round(1000 * max(ages), 1) if ages else None,
        "tick_in_use_s": round(b.tick_s, 4), "tick_set_by": b.budget,
        "measured_cpu_per_scrape_us": round(b.cpu_per_scrape_s * 1e6, 1),
        "read_figures_us_per_page": round(fast_us, 1), "prometheus_client_parse_us_per_page": round(full_us, 1),
        "ratio_full_parse_over_reader": round(full_us / fast_us, 1),
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
