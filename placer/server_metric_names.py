"""What each kind of model server calls the load figures the placer reads: one table,
declared once (the Inference Extension's model-server protocol table, `docs/proposals/
003-model-server-protocol`, plus the prefix-cache and time-to-first-token series the
servers expose), read by the metrics parser and the scraper.

A *key* is the placer's name for a figure (what a signal `consumes`: `queue_depth`,
`running`, `kv_cache_usage`, ...); a protocol maps each key it knows to the series that
carries it on that server's `/metrics`. A key a server does not expose is absent from its
protocol, so its readings never carry it (never a zero passed off as a measurement).

| key | vLLM | SGLang | Triton TensorRT-LLM | trtllm-serve |
| --- | --- | --- | --- | --- |
| queue_depth | `vllm:num_requests_waiting` | `sglang:num_queue_reqs` | `nv_trt_llm_request_metrics{request_type="waiting"}` | `trtllm_num_requests_waiting` |
| running | `vllm:num_requests_running` | `sglang:num_running_reqs` | `nv_trt_llm_request_metrics{request_type="scheduled"}` | `trtllm_num_requests_running` |
| kv_cache_usage (0-1) | `vllm:kv_cache_usage_perc` | `sglang:token_usage` | `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}` | `trtllm_kv_cache_utilization` |
| prefix_cache_hits / _queries (tokens, counters) | `vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total` | | | |
| ttft_sum_s / ttft_count (histogram) | `vllm:time_to_first_token_seconds` | `sglang:time_to_first_token_seconds` | | |
| block_size (tokens) | `vllm:cache_config_info` label `block_size` | `sglang:cache_config_info` label `page_size` | `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per"}` | `trtllm_kv_cache_tokens_per_block` |

**The narrowed page.** vLLM mounts prometheus_client's ASGI app at `/metrics/`, which renders
only the series named in `name[]` query parameters: the scraper asks for just the series of
its map (`narrowed_path`). On vLLM 0.32 that page is 2.4 KB and costs its API server 0.60 ms
of CPU, against 49 KB and 3.7 ms for the whole page (`benchmarks/metrics_scrape.py
--real-vllm`): the server's cost of being measured, 20 times a second. vLLM's plain
`/metrics` route (prometheus-fastapi-instrumentator's) ignores the query: hence the slash.
SGLang mounts the same app the same way (its `add_prometheus_middleware`; not run here). A
server that answers the narrowed page with anything but the series is scraped whole from
then on (`metrics_scraper`), so a kind wrongly listed in `NARROWS` costs one scrape.

Several series of one name (vLLM's `engine` label, one per data-parallel engine) are summed
for counts and counters and the largest taken for a fraction (`Agg`). The policyc emulator
(`modelserver/emulator.py`) speaks `vllm`. An endpoint may name its own protocol: a mapping
of keys to `Series` (`custom_protocol`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Mapping
from urllib.parse import quote


class Agg(Enum):
    """How several series of one name (one per engine or model) become one figure."""

    SUM = "sum"  # requests waiting, running; counters
    MAX = "max"  # a fraction of a cache: the fullest engine bounds what fits


@dataclass(frozen=True, slots=True)
class Series:
    """One metric on a server's `/metrics`: its sample name, the labels a sample must carry
    (all of them, exactly), how several samples combine, and — for an info metric whose
    figure is a label — the label to read instead of the sample's value."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()
    agg: Agg = Agg.SUM
    value_label: str | None = None

    def __post_init__(self) -> None:
        if not self.name or any(c in self.name for c in " {}\n\"") or self.name.startswith("#"):
            raise ValueError(f"metric name `{self.name}`: not a Prometheus sample name")


# the placer's keys (what signals consume)
QUEUE_DEPTH = "queue_depth"
RUNNING = "running"
KV_CACHE_USAGE = "kv_cache_usage"
PREFIX_CACHE_HITS = "prefix_cache_hits"
PREFIX_CACHE_QUERIES = "prefix_cache_queries"
TTFT_SUM_S = "ttft_sum_s"
TTFT_COUNT = "ttft_count"
BLOCK_SIZE = "block_size"
KEYS = (QUEUE_DEPTH, RUNNING, KV_CACHE_USAGE, PREFIX_CACHE_HITS, PREFIX_CACHE_QUERIES, TTFT_SUM_S, TTFT_COUNT, BLOCK_SIZE)

MetricMap = Mapping[str, Series]  # key -> the series carrying it


def _histogram(name: str) -> dict[str, Series]:
    return {TTFT_SUM_S: Series(f"{name}_sum"), TTFT_COUNT: Series(f"{name}_count")}


def _p(table: dict[str, Series]) -> MetricMap:
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ValueError(f"unknown keys {unknown}: the keys are {KEYS}")
    return MappingProxyType(table)


PROTOCOLS: Mapping[str, MetricMap] = MappingProxyType({
    "vllm": _p({
        QUEUE_DEPTH: Series("vllm:num_requests_waiting"),
        RUNNING: Series("vllm:num_requests_running"),
        KV_CACHE_USAGE: Series("vllm:kv_cache_usage_perc", agg=Agg.MAX),
        PREFIX_CACHE_HITS: Series("vllm:prefix_cache_hits_total"),
        PREFIX_CACHE_QUERIES: Series("vllm:prefix_cache_queries_total"),
        **_histogram("vllm:time_to_first_token_seconds"),
        BLOCK_SIZE: Series("vllm:cache_config_info", agg=Agg.MAX, value_label="block_size"),
    }),
    "sglang": _p({
        QUEUE_DEPTH: Series("sglang:num_queue_reqs"),
        RUNNING: Series("sglang:num_running_reqs"),
        KV_CACHE_USAGE: Series("sglang:token_usage", agg=Agg.MAX),
        **_histogram("sglang:time_to_first_token_seconds"),
        BLOCK_SIZE: Series("sglang:cache_config_info", agg=Agg.MAX, value_label="page_size"),
    }),
    "triton-trtllm": _p({
        QUEUE_DEPTH: Series("nv_trt_llm_request_metrics", (("request_type", "waiting"),)),
        RUNNING: Series("nv_trt_llm_request_metrics", (("request_type", "scheduled"),)),
        KV_CACHE_USAGE: Series("nv_trt_llm_kv_cache_block_metrics", (("kv_cache_block_type", "fraction"),), agg=Agg.MAX),
        BLOCK_SIZE: Series("nv_trt_llm_kv_cache_block_metrics", (("kv_cache_block_type", "tokens_per"),), agg=Agg.MAX),
    }),
    "trtllm-serve": _p({
        QUEUE_DEPTH: Series("trtllm_num_requests_waiting"),
        RUNNING: Series("trtllm_num_requests_running"),
        KV_CACHE_USAGE: Series("trtllm_kv_cache_utilization", agg=Agg.MAX),
        BLOCK_SIZE: Series("trtllm_kv_cache_tokens_per_block", agg=Agg.MAX),
    }),
})


# How a GPU's figure is made from the figures of several servers on it (copies of a model on
# one GPU, each its own engine: `measured.by_endpoint`): the rule of several engines on one
# server's page, read from the vLLM row, which names every key. A key no table names is taken
# as the largest (a figure of the GPU that each of its servers reports is counted once).
COMBINE: Mapping[str, Agg] = MappingProxyType({k: s.agg for k, s in PROTOCOLS["vllm"].items()})
if set(COMBINE) != set(KEYS):  # a key added to KEYS needs its vLLM series (and so its rule here)
    raise ImportError(f"server_metric_names: the vLLM protocol lacks {sorted(set(KEYS) - set(COMBINE))}")


def combine(values: list[Mapping[str, float]]) -> dict[str, float]:
    """One GPU's values from its servers' (each key over the servers that report it)."""
    out: dict[str, float] = {}
    for v in values:
        for k, x in v.items():
            if k not in out:
                out[k] = x
            elif COMBINE.get(k, Agg.MAX) is Agg.SUM:
                out[k] += x
            elif x > out[k]:
                out[k] = x
    return out


NARROWS = frozenset({"vllm", "sglang"})  # kinds whose `/metrics/` is prometheus_client's ASGI app (`name[]`)


def narrowed_path(kind: str, m: MetricMap) -> str | None:
    """The path of a page carrying only `m`'s series, for a kind that serves one; else None."""
    if kind not in NARROWS:
        return None
    return "/metrics/?" + "&".join(f"name[]={quote(n, safe='')}" for n in sorted({s.name for s in m.values()}))


def protocol(kind: str) -> MetricMap:
    """The table's protocol for a server kind; ValueError naming the kinds it knows."""
    try:
        return PROTOCOLS[kind]
    except KeyError:
        raise ValueError(f"unknown model-server kind `{kind}`: one of {', '.join(sorted(PROTOCOLS))}") from None


def custom_protocol(table: Mapping[str, Series]) -> MetricMap:
    """An endpoint's own mapping (a server with other names), checked like the table's."""
    return _p(dict(table))


__all__ = ["Agg", "COMBINE", "KEYS", "combine", "NARROWS", "PROTOCOLS", "narrowed_path", "MetricMap", "Series", "custom_protocol", "protocol", "BLOCK_SIZE", "KV_CACHE_USAGE",
           "PREFIX_CACHE_HITS", "PREFIX_CACHE_QUERIES", "QUEUE_DEPTH", "RUNNING", "TTFT_COUNT", "TTFT_SUM_S"]
