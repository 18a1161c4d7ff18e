"""The model servers' metrics scraping, as flags of `policyc serve` and `policyc gateway`:
`--scrape-interval SECONDS` (the tick each registered endpoint whose instance names its
server kind in a `metrics` label is scraped on, default 50 ms, the Inference Extension's),
`--scrape-budget SCRAPES_PER_S` (the whole fleet's scrapes a second: a large fleet's tick is
stretched to stay within it, placer/metrics_scraper.py) and `--no-scrape` (the placer's
model alone). See placer/measured.py `ScrapedFleet`."""

from __future__ import annotations

import argparse
import math
from typing import Callable

DEFAULT_S = 0.05
BOUNDS_S = (0.005, 60.0)
DEFAULT_BUDGET = 200.0  # placer/metrics_scraper.py DEFAULT_MAX_SCRAPES_PER_S (a test holds them equal)
BUDGET_BOUNDS = (1.0, 1e6)


def _bounded(noun: str, unit: str, bounds: tuple[float, float]) -> Callable[[str], float]:
    """An argparse type: a finite number within `bounds`, or an error naming the value."""
    lo, hi = bounds

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"`{text}` is not a number of {noun}") from None
        if not (math.isfinite(v) and lo <= v <= hi):
            raise argparse.ArgumentTypeError(f"{text} {unit}: expected a number in [{lo:g}, {hi:g}]")
        return v
    return parse


_interval = _bounded("seconds", "s", BOUNDS_S)
_budget = _bounded("scrapes a second", "scrapes/s", BUDGET_BOUNDS)


def add_scrape_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scrape-interval", type=_interval, default=DEFAULT_S, metavar="SECONDS",
                   help="scrape each registered model server's /metrics (instances labelled metrics=vllm, sglang, "
                        f"triton-trtllm, ...) this often and place on their queues (default {DEFAULT_S:g})")
    p.add_argument("--scrape-budget", type=_budget, default=DEFAULT_BUDGET, metavar="SCRAPES_PER_S",
                   help="scrapes a second over the whole fleet: with more endpoints than it allows at --scrape-interval, "
                        f"each endpoint's tick is stretched to fit, and staleness bounds follow (default {DEFAULT_BUDGET:g})")
    p.add_argument("--no-scrape", action="store_true",
                   help="scrape no model server: the placer's modelled queues alone")


def scrape_interval(args: argparse.Namespace) -> float | None:
    """ServeConfig.metrics_scrape_interval from the flags (None: off)."""
    return None if args.no_scrape else float(args.scrape_interval)


def scrape_budget(args: argparse.Namespace) -> float:
    """ServeConfig.metrics_scrape_budget from the flags."""
    return float(args.scrape_budget)


__all__ = ["add_scrape_flags", "scrape_budget", "scrape_interval"]
