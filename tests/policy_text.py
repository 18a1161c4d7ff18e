"""Shared test helpers: compile policy text in memory."""

from __future__ import annotations

import textwrap
from pathlib import Path

from policyc.compiler.pipeline import CompileResult, compile_sources
from policyc.dsl.source import Source

REPO = Path(__file__).resolve().parent.parent

# A complete, valid contract that cases edit one line of.
BASE_CONTRACT = """\
contract m version "1.0" {
  compute {
    flops_per_request: 1e12 .. 2e12
    tokens: 128
  }
  memory {
    bandwidth: >= 80 GB/s
    burst: <= 200 ms
  }
  dependencies {
    async_callbacks: no
    cuda: >= 12.1
  }
  slo {
    latency: <= 200 ms
  }
}
"""

REQUESTS = """\
request {
  header X-SLO-Latency { var: slo  type: time  missing: ignore  malformed: reject }
  header X-Data-Region { var: region  type: name  values: [us-west, eu-west]  missing: ignore  malformed: reject }
  header X-Tenant { var: tenant  type: name  missing: default  default: anon  malformed: reject }
}
tenants { bank: finance  anon: public }
"""


def compile_text(*texts: str, analyse: bool = False) -> CompileResult:
    sources = [Source(f"f{i}.contract", textwrap.dedent(t)) for i, t in enumerate(texts)]
    return compile_sources(sources, analyse=analyse)

