"""Replays a `slo_attainment.py` trace with inference-perf (the Inference Extension's load
generator): run by `.venv-perf/bin/python` (inference-perf needs Python >= 3.12), never
imported by the project.

    .venv-perf/bin/python benchmarks/inference_perf_replay.py -c CONFIG.yaml

inference-perf replays arrival times itself (`load.type: trace_replay`, the i-th request of
its data generator at the i-th timestamp of the trace CSV) and measures each request's time
to its first content token; what it lacks is a data source whose requests carry their own
headers: its file sources (ShareGPT) send one header set for the whole run (`api.headers`),
and the TTFT SLO here is each tenant's (`x-slo-ttft-ms`: 300, 1000 or 4000 ms). This file adds
that source through inference-perf's own `DataGenerator` interface: each line of
`data.path` (JSON lines, in arrival order: messages, max_tokens, the SLO header, the tenant)
is one `ChatCompletionAPIData` with its own headers and labels (inference-perf merges a
request's headers over the global ones and writes its labels into each request's lifecycle
record). inference-perf picks a data generator by `data.type` from names bound in its
`main` module, with no registry for others: this one is bound in place of its `mock` type
(`data.type: mock`), the one type that reads nothing of its own.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Iterator

import inference_perf.main as inference_perf_main
from inference_perf.apis import ChatCompletionAPIData, ChatMessage
from inference_perf.config import APIType
from inference_perf.datagen.base import DataGenerator


class TraceRequests(DataGenerator):  # type: ignore[misc]  # inference-perf ships no type information
    """The trace's requests, in arrival order, each with its own SLO header and labels."""

    def __init__(self, api_config: Any, config: Any, tokenizer: Any) -> None:
        super().__init__(api_config, config, tokenizer)
        with open(config.path, encoding="utf-8") as f:
            self.rows = [json.loads(line) for line in f if line.strip()]

    def get_supported_apis(self) -> list[Any]:
        return [APIType.Chat]

    def is_io_distribution_supported(self) -> bool:
        return False

    def is_shared_prefix_supported(self) -> bool:
        return False  # the prefixes are the trace's own (a system prompt shared by a group)

    def get_data(self) -> Iterator[ChatCompletionAPIData]:
        for r in self.rows:
            yield ChatCompletionAPIData(
                messages=[ChatMessage(role=m["role"], content=m["content"]) for m in r["messages"]],
                max_tokens=r["max_tokens"],
                headers=r["headers"],
                labels={"id": str(r["id"]), "tenant": r["tenant"]},
            )


inference_perf_main.MockDataGenerator = TraceRequests

if __name__ == "__main__":
    sys.exit(inference_perf_main.main_cli())
