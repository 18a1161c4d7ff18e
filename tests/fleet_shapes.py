"""A fleet shaped like a platform team's, for benchmarks and property tests.

Fifty model families in eight regions on four GPU architectures; every deployment of a
family carries its own latency SLO between 50 and 500 ms, so each (family, SLO) is its own
contract (`<family>-<slo>ms`, label `family`): about 22,000 distinct contracts at 100,000
instances. TPM, memory encryption and the hardware firewall are each on about half of the
deployments. Requests mix four shapes, with SLOs drawn to the hundredth of a millisecond so
that most raw shapes are new:

- selective: SLO + model family + region + TPM
- compliance: SLO + region + one to three security flags + GPU architecture
- regional: SLO + region
- broad: SLO only

Benchmarks import this module with `tests/` on `sys.path` (as pytest puts it there for
the tests), so both measure and check the same fleet. The bundle is compiled from policy
text once (headers, rules, the GPU catalog, one template contract) and its contracts
expanded per (family, SLO), then sealed: compiling 22,000 contract blocks through the
parser would take longer than everything it is used for.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

from policyc.compiler import bundle_io
from policyc.compiler.bundle import Bundle, Slo
from policyc.compiler.pipeline import compile_sources
from policyc.dsl.source import Source
from policyc.matcher import Deployment, Instance
from policyc.matcher.columns import InstanceBatch

FAMILIES = tuple(f"model-{i:02d}" for i in range(50))
REGIONS = ("us-west", "us-east", "us-central", "eu-west", "eu-central", "ap-south", "ap-east", "sa-east")
ARCH_GPUS = {"ampere": ("A100-40G", "A100-80G"), "hopper": ("H100", "H200"), "ada": ("L4", "L40S"),
             "blackwell": ("B200", "GB200")}
SECURITY = ("tpm", "memory_encryption", "hardware_firewall")
SLO_MS = tuple(range(50, 501))  # one per deployment: 451 thresholds
KINDS = ("selective", "compliance", "regional", "broad")
FLAG_HEADERS = {"tpm": "X-Require-TPM", "memory_encryption": "X-Require-Encryption",
                "hardware_firewall": "X-Require-Firewall"}
INSTANCES_PER_DEPLOYMENT = 4.5  # 100,000 instances over ~22,000 (family, SLO) deployments


def _gpu(name: str, arch: str, bw: int) -> str:
    return f"gpu {name} {{ arch: {arch}  peak {{ fp16: 300 TFLOP/s  int8: 600 TFLOP/s }}  hbm_bandwidth: {bw} GB/s  memory: 80 GB }}\n"


POLICY = """
request {
  header X-SLO-Latency { var: slo  type: time  range: 1 ms .. 60 s  missing: ignore  malformed: reject }
  header X-Data-Region { var: region  type: name  values: [%(regions)s]  missing: ignore  malformed: reject }
  header X-Model { var: family  type: name  missing: ignore  malformed: reject }
  header X-GPU-Arch { var: arch  type: name  values: [%(arches)s]  missing: ignore  malformed: reject }
  header X-Require-TPM { var: need_tpm  type: bool  missing: ignore  malformed: reject }
  header X-Require-Encryption { var: need_encryption  type: bool  missing: ignore  malformed: reject }
  header X-Require-Firewall { var: need_firewall  type: bool  missing: ignore  malformed: reject }
  header X-Tenant { var: tenant  type: name  missing: default  default: anonymous  malformed: reject }
}
tenants { anonymous: public  acme-bank: finance }

policy routing {
  rule pinned-family { when: has(request.family)  require: labels.family == request.family }
  rule latency-target { when: has(request.slo)  require: slo_latency %(latency_cmp)s request.slo }
  rule data-region { when: has(request.region)  require: region == request.region }
  rule gpu-arch { when: has(request.arch)  require: gpu_arch == request.arch }
}

policy security {
  rule tpm { when: request.need_tpm  require: tpm }
  rule encryption { when: request.need_encryption  require: memory_encryption }
  rule firewall { when: request.need_firewall  require: hardware_firewall }
  rule finance-hardening { when: request.tenant_class == finance  require: tpm and memory_encryption and hardware_firewall }
}

contract template version "1.0" {
  compute { flops_per_request: 1e11 .. 2e11  tokens: 128 }
  memory { bandwidth: >= 100 GB/s  burst: <= 100 ms }
  dependencies { async_callbacks: no  cuda: >= 12.1 }
  slo { latency: <= 200 ms  allowance: 10 ms }
}
"""


@lru_cache(maxsize=None)
def base_bundle(latency_cmp: str = "<=") -> Bundle:
    """The compiled policy with its one template contract (compiled once per process and
    comparison). `latency_cmp`: how the latency rule compares an instance's SLO with the
    request's (`<=` as a platform writes it; the others for tests of every ordering)."""
    gpus = "".join(_gpu(g, arch, 1500 + 500 * i) for arch, names in ARCH_GPUS.items() for i, g in enumerate(names))
    text = POLICY % {"regions": ", ".join(REGIONS), "arches": ", ".join(ARCH_GPUS), "latency_cmp": latency_cmp}
    result = compile_sources([Source("fleet.contract", text), Source("gpus.contract", gpus)], analyse=False)
    if not result.ok:
        raise RuntimeError("the fleet policy does not compile: " + "; ".join(str(d) for d in result.diagnostics))
    assert result.bundle is not None
    return result.bundle


def contract_name(family: str, slo_ms: int) -> str:
    return f"{family}-{slo_ms}ms"


def fleet_bundle(deployments: list[tuple[str, int]], latency_cmp: str = "<=") -> Bundle:
    """The base policy with one contract per (family, SLO in ms), sealed."""
    base = base_bundle(latency_cmp)
    template = base.contracts[0]
    contracts = []
    for family, slo_ms in sorted(set(deployments)):
        contracts.append(template.model_copy(update={
            "name": contract_name(family, slo_ms),
            "slo": Slo(latency=slo_ms / 1000, allowance=template.slo.allowance if template.slo else 0.0),
            "labels": (("family", family),),
        }))
    return bundle_io.seal(base.model_copy(update={"contracts": tuple(contracts)}))


@dataclass(frozen=True, slots=True)
class Fleet:
    bundle: Bundle
    instances: list[Instance]
    scores: dict[str, float]


def make_fleet(n: int, seed: int = 0, *, families: int = len(FAMILIES), score_levels: int = 0,
               latency_cmp: str = "<=") -> Fleet:
    """`n` instances in deployments of 1-8 GPUs on one host each; each deployment draws a
    distinct (family, SLO) while they last, its region, architecture, GPU class and
    security flags (each on with probability one half). `score_levels`: 0 for scores drawn
    from [0, 1), otherwise scores from that many levels (ties, as a fleet with few placer
    scores has). `latency_cmp`: the latency rule's comparison (`base_bundle`)."""
    rng = random.Random(seed)
    fams = FAMILIES[:families]
    pairs = [(f, s) for f in fams for s in SLO_MS]
    rng.shuffle(pairs)
    want = max(1, round(n / INSTANCES_PER_DEPLOYMENT))
    insts: list[Instance] = []
    used: list[tuple[str, int]] = []
    d = 0
    while len(insts) < n:
        family, slo_ms = pairs[d % len(pairs)] if d < want else rng.choice(pairs[:want])
        used.append((family, slo_ms))
        arch = rng.choice(tuple(ARCH_GPUS))
        tpm, enc, fw = (rng.random() < 0.5 for _ in SECURITY)
        region = rng.choice(REGIONS)
        gpu_model = rng.choice(ARCH_GPUS[arch])
        size = min(rng.randint(1, 8), n - len(insts))
        host = f"h{d:05d}"
        name = contract_name(family, slo_ms)
        for g in range(size):
            dep = Deployment(host=host, gpu=f"gpu{g}", gpu_model=gpu_model, region=region, numa_node=g // 4,
                             tpm=tpm, memory_encryption=enc, hardware_firewall=fw)
            insts.append(Instance(id=f"{name}-{host}-{g}", model=name, deployment=dep))
        d += 1
    if score_levels:
        scores = {i.id: rng.randrange(score_levels) / max(1, score_levels - 1) for i in insts}
    else:
        scores = {i.id: rng.random() for i in insts}
    return Fleet(fleet_bundle(used, latency_cmp), insts, scores)


@dataclass(frozen=True, slots=True)
class FleetBatch:
    """`make_fleet`'s fleet as columns (`matcher.columns.InstanceBatch`, scores in it):
    what a store snapshot or a batch registration hands the registry, with no object per
    instance (a million instances as objects take ~1 GB and ~36 s to make)."""

    bundle: Bundle
    batch: InstanceBatch


def make_fleet_batch(n: int, seed: int = 0, *, families: int = len(FAMILIES), score_levels: int = 0,
                     latency_cmp: str = "<=") -> FleetBatch:
    """`make_fleet(n, seed, ...)` as columns: the same draws in the same order, so the same
    ids, deployments and scores (a test holds the two equal)."""
    rng = random.Random(seed)
    fams = FAMILIES[:families]
    pairs = [(f, s) for f in fams for s in SLO_MS]
    rng.shuffle(pairs)
    want = max(1, round(n / INSTANCES_PER_DEPLOYMENT))
    ids: list[str] = []
    models: list[str] = []
    strs: dict[str, list[str]] = {k: [] for k in ("host", "gpu", "gpu_model", "region", "session_state", "cuda", "endpoint")}
    numa: list[int] = []
    flags: dict[str, list[bool]] = {k: [] for k in ("tpm", "memory_encryption", "hardware_firewall", "tee")}
    used: list[tuple[str, int]] = []
    gpus = [f"gpu{g}" for g in range(8)]
    d = 0
    while len(ids) < n:
        family, slo_ms = pairs[d % len(pairs)] if d < want else rng.choice(pairs[:want])
        used.append((family, slo_ms))
        arch = rng.choice(tuple(ARCH_GPUS))
        tpm, enc, fw = (rng.random() < 0.5 for _ in SECURITY)
        region = rng.choice(REGIONS)
        gpu_model = rng.choice(ARCH_GPUS[arch])
        size = min(rng.randint(1, 8), n - len(ids))
        host = f"h{d:05d}"
        name = contract_name(family, slo_ms)
        ids.extend([f"{name}-{host}-{g}" for g in range(size)])
        models.extend([name] * size)
        for key, value in (("host", host), ("gpu_model", gpu_model), ("region", region), ("session_state", "remote"),
                           ("cuda", "12.4"), ("endpoint", "")):
            strs[key].extend([value] * size)
        strs["gpu"].extend(gpus[:size])
        numa.extend([g // 4 for g in range(size)])
        for key, flag in (("tpm", tpm), ("memory_encryption", enc), ("hardware_firewall", fw), ("tee", False)):
            flags[key].extend([flag] * size)
        d += 1
    if score_levels:
        scores: list[float | None] = [rng.randrange(score_levels) / max(1, score_levels - 1) for _ in ids]
    else:
        scores = [rng.random() for _ in ids]
    batch = InstanceBatch(ids, models, strs, numa, flags, [None] * len(ids), scores)
    return FleetBatch(fleet_bundle(used, latency_cmp), batch)


def request_headers(kind: str, rng: random.Random, families: int = len(FAMILIES)) -> dict[str, str]:
    """One request of `kind` (see the module docstring) as headers."""
    h = {"X-SLO-Latency": f"{rng.uniform(40.0, 520.0):.2f}ms"}
    if kind == "selective":
        h["X-Model"] = rng.choice(FAMILIES[:families])
        h["X-Data-Region"] = rng.choice(REGIONS)
        h["X-Require-TPM"] = "yes"
    elif kind == "compliance":
        h["X-Data-Region"] = rng.choice(REGIONS)
        for flag in rng.sample(SECURITY, rng.randint(1, 3)):
            h[FLAG_HEADERS[flag]] = "yes"
        h["X-GPU-Arch"] = rng.choice(tuple(ARCH_GPUS))
    elif kind == "regional":
        h["X-Data-Region"] = rng.choice(REGIONS)
    elif kind != "broad":
        raise ValueError(f"unknown request kind `{kind}` (one of: {', '.join(KINDS)})")
    return h


def request_mix(n: int, seed: int = 1, families: int = len(FAMILIES)) -> list[tuple[str, dict[str, str]]]:
    """`n` requests cycling through the four kinds."""
    rng = random.Random(seed)
    return [(KINDS[i % len(KINDS)], request_headers(KINDS[i % len(KINDS)], rng, families)) for i in range(n)]
