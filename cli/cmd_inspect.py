"""`policyc inspect bundle.json`: a human summary of a verified bundle (`-`: read it from stdin).

Verifies the bundle's hash, and its signature with `--public-key`, before printing its
contracts, GPU-share bounds, rules, index plan and breakers (`--format json` for machines).
"""

from __future__ import annotations

import json
import sys

from policyc.compiler import bundle_io
from policyc.compiler.bundle import Bundle, Expr
from policyc.compiler.units import format_si

from .exit_codes import Exit
from .help import add_command
from .keys import KeyError_, load_public


def register(sub) -> None:  # type: ignore[no-untyped-def]
    p = add_command(sub, "inspect", help="summarise a bundle (verifies its hash, and signature with --public-key)",
                    description=__doc__, codes=(Exit.OK, Exit.FAILED, Exit.USAGE),
                    examples=["policyc inspect bundle.json", "policyc inspect bundle.json --public-key ops.pub --format json",
                              "policyc compile policies/ -o - | policyc inspect -"])
    p.add_argument("bundle", metavar="BUNDLE", help="bundle file (`-`: stdin)")
    p.add_argument("--public-key", help="ed25519 public key the bundle must be signed with")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output as text (default) or one JSON document")
    p.set_defaults(func=run)


def run(args) -> int:
    try:
        key = load_public(args.public_key) if args.public_key else None
        if args.bundle == "-":
            import sys as _sys

            bundle = bundle_io.loads(_sys.stdin.read(), origin="<stdin>", public_key=key)
        else:
            bundle = bundle_io.load(args.bundle, public_key=key)
    except (bundle_io.BundleError, KeyError_) as e:
        print(f"policyc: error: {e}", file=sys.stderr)
        return 1
    if args.format == "json":
        print(json.dumps(summary(bundle), indent=1, sort_keys=True))
    else:
        print(render(bundle))
    return 0


def summary(b: Bundle) -> dict:
    return {
        "content_hash": b.content_hash, "schema_version": b.schema_version, "compiler_version": b.compiler_version,
        "signed": b.signature is not None, "contracts": [c.name for c in b.contracts],
        "rules": [r.id for r in b.rules], "breakers": [x.name for x in b.breakers],
        "gpu_classes": [g.name for g in b.gpu_catalog], "headers": [h.header for h in b.headers],
        "warnings": len(b.warnings),
    }


def expr_text(e: Expr | None) -> str:
    if e is None:
        return "always"
    if e.op == "atom":
        v = e.operand.value if e.operand.kind == "const" else f"request.{e.operand.name}"
        return f"{e.attr} {e.cmp.replace('_', ' ')} {_val(v)}"
    if e.op == "test":
        if e.cmp is None or e.operand is None:
            return f"has(request.{e.var})"
        return f"request.{e.var} {e.cmp.replace('_', ' ')} {_val(e.operand.value)}"
    if e.op == "not":
        return f"not ({expr_text(e.arg)})"
    word = f" {e.op} "
    return word.join(f"({expr_text(a)})" if a.op in ("and", "or") else expr_text(a) for a in e.args)


def _val(v) -> str:
    if isinstance(v, tuple):
        return "[" + ", ".join(_val(x) for x in v) + "]"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def render(b: Bundle) -> str:
    out = [f"bundle {b.content_hash}", f"  schema {b.schema_version}, compiled by policyc {b.compiler_version}",
           f"  signature: {'ed25519 by ' + b.signature.public_key[:16] + '…' if b.signature else 'unsigned'}", ""]
    out.append(f"contracts ({len(b.contracts)})")
    for c in b.contracts:
        f = c.compute.request_flops()
        slo = format_si(c.slo.latency, "time") if c.slo else "none"
        out.append(f"  {c.name} {c.version}  [{c.origin}]")
        out.append(f"    compute {f.lo:.3g}..{f.hi:.3g} FLOPs/request at {c.compute.tokens} tokens, {c.compute.precision}, "
                   f"efficiency {c.compute.efficiency:.0%}")
        out.append(f"    memory >= {format_si(c.memory.bandwidth_min, 'bandwidth')} for <= {format_si(c.memory.burst_max, 'time')}; SLO {slo}")
        deps = ", ".join(f"{s.kind} {s.name} p99<={s.p99 * 1e3:g}ms" + (f" ({s.proxy} proxy)" if s.proxy != "none" else "")
                         for s in c.dependencies.services) or "no services"
        out.append(f"    depends on {deps}; cuda {' '.join(f'{v.op}{v.version}' for v in c.dependencies.cuda)}")
        if c.regions or c.gpu_arch or c.security:
            out.append(f"    placement regions={list(c.regions) or 'any'} arch={list(c.gpu_arch) or 'any'} security={list(c.security)}")
        if c.session:
            out.append(f"    session state on {c.session.state}, colocate {c.session.colocate}")
        if c.gpu_shares:
            shares = ", ".join(f"{s.gpu} >= {s.min_share:.1%}" if s.feasible else f"{s.gpu} infeasible ({s.binding})" for s in c.gpu_shares)
            out.append(f"    GPU share: {shares}")
    out.append("")
    out.append(f"request headers ({len(b.headers)})")
    for h in b.headers:
        default = f" {h.default}" if h.on_missing == "default" else ""
        out.append(f"  {h.header} -> request.{h.var}: {h.type}; missing: {h.on_missing}{default}; malformed: {h.on_malformed}")
    out.append("tenants: " + ", ".join(f"{t.name}={t.tenant_class}" for t in b.tenants))
    out.append("")
    out.append(f"rules ({len(b.rules)})")
    for r in b.rules:
        out.append(f"  {r.id}  [{r.origin}]")
        out.append(f"    when {expr_text(r.guard)}")
        out.append(f"    require {expr_text(r.require)}")
    out.append("")
    out.append("index plan")
    for a in b.index_plan:
        fed = f" <- {', '.join(a.fed_by)}" if a.fed_by else ""
        out.append(f"  {a.attr:<20} {a.kind:<9} {a.type}{fed}")
    out.append("")
    out.append(f"circuit breakers ({len(b.breakers)})")
    for x in b.breakers:
        cond = " and ".join(f"{c.signal} {c.cmp} {c.value:g}{' of ' + c.of if c.of else ''}" for c in x.conditions)
        acts = ", ".join(a.kind for a in x.actions)
        out.append(f"  {x.name} ({x.scope}, x{x.consecutive}): when {cond} -> {acts}  [{x.origin}]")
    if b.warnings:
        out.append("")
        out.append(f"warnings ({len(b.warnings)})")
        for w in b.warnings:
            out.append(f"  {w}")
    return "\n".join(out)
