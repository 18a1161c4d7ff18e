"""The model servers' metrics scraping, as flags of `policyc serve` and `policyc gateway`:
`--scrape-interval SECONDS` (the tick each registered endpoint whose instance names its
server kind in a `metrics` label is scraped on, default 50 ms, the Inference Extension's)
and `--no-scrape` (the placer's model alone). See placer/measured.py `ScrapedFleet`."""

from __future__ import annotations

import argparse
import math

DEFAULT_S = 0.05
BOUNDS_S = (0.005, 60.0)


def _interval(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"`{text}` is not a number of seconds") from None
    lo, hi = BOUNDS_S
    if not (math.isfinite(v) and lo <= v <= hi):
        raise argparse.ArgumentTypeError(f"{text} s: expected seconds in [{lo:g}, {hi:g}]")
    return v


def add_scrape_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scrape-interval", type=_interval, default=DEFAULT_S, metavar="SECONDS",
                   help="scrape each registered model server's /metrics (instances labelled metrics=vllm, sglang, "
                        f"triton-trtllm, ...) this often and place on their queues (default {DEFAULT_S:g})")
    p.add_argument("--no-scrape", action="store_true",
                   help="scrape no model server: the placer's modelled queues alone")


def scrape_interval(args: argparse.Namespace) -> float | None:
    """ServeConfig.metrics_scrape_interval from the flags (None: off)."""
    return None if args.no_scrape else float(args.scrape_interval)


__all__ = ["add_scrape_flags", "scrape_interval"]
