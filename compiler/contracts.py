"""Lower `contract` blocks to `bundle.Contract`.

A contract states what a model costs and requires. Three sections are mandatory —
compute, memory, dependencies — because without them a scheduler cannot provision the
model (the contract-drift and hidden-dependency incidents); a contract missing one is an
error naming it. Consistency between fields (a FLOPs interval upside down, an SLO no GPU
can meet) is the solver's job, not this pass's.
"""

from __future__ import annotations

from policyc.dsl import ast
from policyc.dsl.diagnostics import Diagnostic

from .bundle import SECURITY_ATTRS, Compute, Contract, Dependencies, Memory, ServiceDependency, Session, Slo, SourceRef, VersionBound
from . import limits

from .check_values import ARCHS, PRECISIONS, version_bounds_problem
from .fields import BlockReader, ref, shape
from .llm_contract import lower_llm

__all__ = ["ARCHS", "PRECISIONS", "contract_header", "lower_contract"]


def contract_header(block: ast.Block, diags: list[Diagnostic]) -> tuple[str, str] | None:
    """`contract NAME version "X.Y"`: the name and version, or a diagnostic."""
    labels = block.labels
    if len(labels) == 3 and not labels[0].quoted and labels[1].text == "version" and not labels[1].quoted and labels[2].quoted:
        return labels[0].text, labels[2].text
    from policyc.dsl.diagnostics import error

    span = labels[0].span if labels else block.kind_span
    diags.append(error("E207", "a contract is written `contract NAME version \"X.Y\" { … }`", span,
                       'for example: contract fraud-scorer version "2.3.0" {'))
    return None


def lower_contract(block: ast.Block, diags: list[Diagnostic]) -> Contract | None:
    header = contract_header(block, diags)
    if header is None:
        return None
    name, version = header
    where = f"contract `{name}`"
    n_before = len(diags)
    top = BlockReader(block, where, diags, fields=(),
                      blocks=("compute", "memory", "dependencies", "slo", "placement", "session", "labels", "llm"))
    origins: dict[str, SourceRef] = {}

    def track(reader: BlockReader, section: str, key: str) -> None:
        f = reader.fields.get(key)
        if f is not None:
            origins[f"{section}.{key}"] = ref(f.span)

    compute = memory = deps = None
    if (b := top.block_one("compute", required=True)) is not None:
        r = BlockReader(b, f"`compute` of {where}", diags,
                        fields=("flops_per_request", "flops_per_token", "tokens", "precision", "efficiency"))
        per_req, per_tok = r.fields.get("flops_per_request"), r.fields.get("flops_per_token")
        if per_req and per_tok:
            r.err("E208", f"{where} gives both `flops_per_request` and `flops_per_token`", per_tok.key_span, "keep one")
        elif not per_req and not per_tok:
            r.missing("flops_per_request")
        key = "flops_per_request" if per_req else "flops_per_token"
        flops = r.interval(key, "flops") if (per_req or per_tok) else None
        tokens = r.integer("tokens", required=True, maximum=limits.MAX_TOKENS)
        precision = r.name("precision", PRECISIONS) or "fp16"
        eff = r.quantity("efficiency", "ratio")
        if eff is not None and eff > 1:
            r.err("E305", "`efficiency` cannot exceed 100 %", r.fields["efficiency"].values[0].span)
            eff = None
        if (per_req or per_tok) and (f := per_req or per_tok):
            origins["compute.flops"] = ref(f.span)
        for k in ("tokens", "precision", "efficiency"):
            track(r, "compute", k)
        if flops is not None and tokens is not None:
            compute = Compute(flops=flops, per="request" if per_req else "token", tokens=tokens,
                              precision=precision, efficiency=eff if eff is not None else 0.5)
    if (b := top.block_one("memory", required=True)) is not None:
        r = BlockReader(b, f"`memory` of {where}", diags, fields=("bandwidth", "burst"))
        bw = r.bound("bandwidth", "bandwidth", "min", required=True)
        burst = r.bound("burst", "time", "max", required=True)
        track(r, "memory", "bandwidth")
        track(r, "memory", "burst")
        if bw is not None and burst is not None:
            memory = Memory(bandwidth_min=bw, burst_max=burst)
    if (b := top.block_one("dependencies", required=True)) is not None:
        deps = _dependencies(b, where, diags, origins)
    slo = None
    if (b := top.block_one("slo")) is not None:
        r = BlockReader(b, f"`slo` of {where}", diags, fields=("latency", "allowance"))
        latency = r.bound("latency", "time", "max", required=True)
        allowance = r.quantity("allowance", "time", positive=False)
        track(r, "slo", "latency")
        track(r, "slo", "allowance")
        if latency is not None:
            slo = Slo(latency=latency, allowance=allowance or 0.0)
    regions: tuple[str, ...] = ()
    archs: tuple[str, ...] = ()
    security: tuple[str, ...] = ()
    if (b := top.block_one("placement")) is not None:
        r = BlockReader(b, f"`placement` of {where}", diags, fields=("regions", "gpu_arch", "security"))
        regions = r.names("regions") or ()
        archs = r.names("gpu_arch", ARCHS) or ()
        security = r.names("security", SECURITY_ATTRS) or ()
        for k in ("regions", "gpu_arch", "security"):
            track(r, "placement", k)
    session = None
    if (b := top.block_one("session")) is not None:
        r = BlockReader(b, f"`session` of {where}", diags, fields=("state", "colocate"))
        state = r.name("state", ("nvme", "host_memory", "remote"), required=True)
        colocate = r.name("colocate", ("same_numa", "same_host", "none")) or "none"
        track(r, "session", "state")
        if state is not None:
            session = Session(state=state, colocate=colocate)  # type: ignore[arg-type]
    labels: list[tuple[str, str]] = []
    if (b := top.block_one("labels")) is not None:
        r = BlockReader(b, f"`labels` of {where}", diags, fields=[f.key for f in b.fields()])
        for key in r.fields:
            value = r.string(key)
            if value is not None:
                labels.append((key, value))
    llm = lower_llm(b, where, diags, origins) if (b := top.block_one("llm")) is not None else None
    if len(diags) > n_before or compute is None or memory is None or deps is None:
        return None
    return Contract(
        name=name, version=version, compute=compute, memory=memory, dependencies=deps, slo=slo,
        regions=regions, gpu_arch=archs, security=security, session=session,  # type: ignore[arg-type]
        labels=tuple(sorted(labels)), llm=llm, origin=ref(block.span),
        field_origins=tuple(sorted(origins.items())),
    )


def _dependencies(b: ast.Block, where: str, diags: list[Diagnostic], origins: dict[str, SourceRef]) -> Dependencies | None:
    r = BlockReader(b, f"`dependencies` of {where}", diags,
                    fields=("async_callbacks", "cuda", "libraries"), blocks=("service",))
    n_before = len(diags)
    services: list[ServiceDependency] = []
    seen: dict[str, int] = {}
    for s in r.blocks.get("service", []):
        if len(s.labels) != 1 or s.labels[0].quoted:
            r.err("E207", "a service is written `service NAME { kind: …  p99: <= … }`", s.kind_span)
            continue
        sname = s.labels[0].text
        if sname in seen:
            r.err("E209", f"service `{sname}` is declared twice in {where}", s.labels[0].span,
                  f"first declared at line {seen[sname]}")
            continue
        seen[sname] = s.span.line
        sr = BlockReader(s, f"service `{sname}`", diags, fields=("kind", "p99", "proxy"))
        kind = sr.name("kind", required=True)
        p99 = sr.bound("p99", "time", "max", required=True)
        proxy = sr.name("proxy", ("none", "shared", "dedicated")) or "none"
        if kind is not None and p99 is not None:
            services.append(ServiceDependency(name=sname, kind=kind, p99=p99, proxy=proxy, origin=ref(s.span)))  # type: ignore[arg-type]
    async_cb = r.boolean("async_callbacks", required=True)
    cuda = _version_bounds(r)
    libraries = r.strings("libraries") or ()
    for k in ("cuda", "async_callbacks"):
        f = r.fields.get(k)
        if f is not None:
            origins[f"dependencies.{k}"] = ref(f.span)
    if len(diags) > n_before or async_cb is None or cuda is None:
        return None
    return Dependencies(services=tuple(sorted(services, key=lambda s: s.name)), async_callbacks=async_cb,
                        cuda=cuda, libraries=tuple(libraries))


def _version_bounds(r: BlockReader) -> tuple[VersionBound, ...] | None:
    f = r.field("cuda", required=True)
    if f is None:
        return None
    out: list[VersionBound] = []
    for v in f.values:
        if isinstance(v, ast.Bound) and isinstance(v.operand, ast.Quantity) and v.operand.unit is None and v.operand.of is None:
            out.append(VersionBound(op=v.op, version=v.operand.text))  # type: ignore[arg-type]
        elif isinstance(v, ast.Quantity) and v.unit is None and v.of is None:
            out.append(VersionBound(op="==", version=v.text))
        else:
            r.err("E315", f"`cuda` expects version bounds such as `>= 12.1, < 13`, found {shape(v)}", v.span)
            return None
    if (problem := version_bounds_problem(out)) is not None:
        r.err("E326", f"`cuda`: {problem}", f.span, "a version must satisfy every bound, e.g. `>= 12.1, < 13.0`")
        return None
    return tuple(out)
