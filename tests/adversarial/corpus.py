"""Run one class of the adversarial corpus under a memory limit; print one JSON line per case.

    python tests/adversarial/corpus.py CLASS [--mem-mib N]

Classes: contract, bundle, onnx, grpc, cli, modelserver (see README.md for what each holds and the
memory bound each runs under). The process limits its own address space
(`RLIMIT_AS`) once its imports are done and before the first case, and gives each case
a wall-clock limit (`SIGALRM`), so a case that would take gigabytes fails with
MemoryError and one that would hang fails on the alarm, instead of taking the machine
down. Any exception other than the refusal the case expects is a failure: that is the
"no traceback" rule, checked by the caller (`test_corpus.py`).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import re
import resource
import signal
import sys
import tempfile
import time
import tomllib
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

HERE = Path(__file__).resolve().parent
CASES = HERE / "cases"
REPO = HERE.parents[1]

# address-space bound per class, MiB (what `import` of the class's stack already takes,
# measured, plus the headroom a case may use); stated in README.md
MEMORY_MIB = {"contract": 768, "bundle": 768, "onnx": 1024, "grpc": 1536, "cli": 1536, "modelserver": 2048}
CASE_SECONDS = 20


@dataclass
class Outcome:
    """What one case did: `ok` when it gave exactly the expected refusal (or success)."""

    case: str
    ok: bool
    got: str
    seconds: float = 0.0
    peak_mib: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class Timeout(Exception):
    pass


def _alarm(_signum: int, _frame: object) -> None:
    raise Timeout(f"took more than {CASE_SECONDS} s")


_current: list[tuple[str, float]] = []  # the case running now and since when, for the watchdog


def _watchdog() -> None:
    """A case the alarm cannot interrupt (one stuck in C, or in an event loop that swallows
    the alarm's exception) is reported as a hang and the runner exits, never waits forever."""
    while True:
        time.sleep(1)
        if _current and time.monotonic() - _current[0][1] > 2 * CASE_SECONDS:
            name = _current[0][0]
            print(json.dumps(Outcome(name, False, f"HANG: still running after {2 * CASE_SECONDS} s").__dict__), flush=True)
            os._exit(3)


def run_case(name: str, fn: Callable[[], tuple[bool, str]]) -> Outcome:
    _current[:] = [(name, time.monotonic())]
    t0 = time.perf_counter()
    signal.alarm(CASE_SECONDS)
    try:
        ok, got = fn()
    except Timeout as e:
        ok, got = False, f"HANG: {e}"
    except MemoryError:
        ok, got = False, "MEMORY: exceeded the class's address-space bound"
    except BaseException as e:  # noqa: BLE001 - a traceback is exactly what the corpus hunts for
        ok, got = False, "TRACEBACK: " + "".join(traceback.format_exception(e))[-1500:]
    finally:
        signal.alarm(0)
        _current.clear()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return Outcome(name, ok, got[:2000], round(time.perf_counter() - t0, 3), round(peak, 1))


# ====================================================================== contracts

def _contract_generators() -> dict[str, Callable[[int], str | bytes]]:
    head = ('contract m version "1" {\n  compute { flops_per_request: 1 .. 2  tokens: 1 }\n'
            '  memory { bandwidth: >= 1 GB/s  burst: <= 1 ms }\n  dependencies { async_callbacks: no  cuda: >= 12 }\n}\n')

    def rule(require: str) -> str:
        return head + f"policy p {{\n  rule r {{ require: {require} }}\n}}\n"

    return {
        "or_terms": lambda n: rule(" or ".join(["tpm"] * n)),
        "and_terms": lambda n: rule(" and ".join(["tpm"] * n)),
        "nots": lambda n: rule("not " * n + "tpm"),
        "parens": lambda n: rule("(" * n + "tpm" + ")" * n),
        "lists": lambda n: head.replace("cuda: >= 12", "cuda: >= 12\n    libraries: " + "[" * n + "]" * n),
        "blocks": lambda n: "a { " * n + "}" * n,
        "and_or_nest": lambda n: rule("(tpm and (tee or " * n + "tpm" + "))" * n),
        "big_string": lambda n: head.replace("cuda: >= 12", 'cuda: >= 12\n    libraries: ["' + "x" * n + '"]'),
        "long_list": lambda n: head.replace("cuda: >= 12", "cuda: >= 12\n  }\n  placement { regions: [" +
                                            ", ".join(f"r{i}" for i in range(n)) + "]").replace("}\n}\n", "}\n}\n", 1),
        "many_values": lambda n: head.replace("cuda: >= 12", "cuda: " + ", ".join([">= 12"] * n)),
        "padding": lambda n: head + "#" + "x" * n + "\n",
        "comments": lambda n: "# a comment\n" * n + head,
        "whitespace": lambda n: " " * n + head,
        "garbage": lambda n: b"\xff" + random.Random(n).randbytes(n),
        "nuls": lambda n: "\x00" * n,
        "contracts": lambda n: "".join(head.replace("contract m ", f"contract m{i} ") for i in range(n)),
        "big_numbers": lambda n: head.replace("tokens: 1 ", "tokens: " + "9" * n + " "),
    }


def _contract_cases() -> Iterator[tuple[str, dict[str, Any], str | bytes]]:
    base = (CASES / "contract" / "base.contract").read_text(encoding="utf-8")
    spec = tomllib.loads((CASES / "contract" / "edits.toml").read_text(encoding="utf-8"))
    fill = {"{digits5000}": "9" * 5000, "{long_string}": "y" * 65537}
    for c in spec.get("case", []):
        text = base
        if "replace" in c:
            old, new = c["replace"]
            for k, v in fill.items():
                new = new.replace(k, v)
            assert text.count(old) == 1, f"{c['name']}: `{old}` is not in base.contract exactly once"
            text = text.replace(old, new)
        text = c.get("prepend", "") + text + c.get("append", "")
        if c.get("crlf"):
            text = text.replace("\n", "\r\n")
        yield c["name"], c, text
    for fam in spec.get("family", []):
        old, new = fam["replace"]
        assert base.count(old) == 1, f"family {fam['name']}: `{old}` is not in base.contract exactly once"
        for i, (value, code) in enumerate(fam["values"]):
            c = {"code": code} if code else {"valid": True}
            yield f"{fam['name']}-{i}", c, base.replace(old, new.replace("{}", value))
    gens = _contract_generators()
    for c in tomllib.loads((CASES / "contract" / "generated.toml").read_text(encoding="utf-8"))["case"]:
        yield c["name"], c, gens[c["make"]](c["n"])


def check_contract(c: dict[str, Any], text: str | bytes, workdir: Path) -> tuple[bool, str]:
    from policyc.compiler.pipeline import compile_paths
    from policyc.dsl.diagnostics import render_json, render_text
    from policyc.dsl.parser import parse
    from policyc.dsl.printer import format_file
    from policyc.dsl.source import Source

    path = workdir / "case.contract"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    result = compile_paths([str(path)], analyse=bool(c.get("analyse")))
    rendered = render_text(result.diagnostics, result.sources)
    render_json(result.diagnostics)
    if len(rendered) > 200_000:
        return False, f"diagnostics rendered to {len(rendered):,} characters"
    src = result.sources.get(next(iter(result.sources), ""), None)
    if src is not None:
        tree, _ = parse(Source(src.name, src.text))
        if tree is not None:
            format_file(tree)  # the printer must not recurse without bound either
    errors = result.errors
    if c.get("valid"):
        return (not errors, "compiled" if not errors else f"refused: {errors[0].code} {errors[0].message[:300]}")
    if not errors:
        return False, "ACCEPTED: compiled without an error"
    want, frag, line = c["code"], c.get("message"), c.get("line")
    hit = next((d for d in errors if d.code.startswith(want) and (frag is None or frag in d.message)
                and (line is None or (d.span is not None and d.span.line == line))), None)
    top = errors[0]
    got = f"{top.code} {top.location()}: {top.message[:300]}"
    if hit is None:
        return False, f"expected {want} {frag or ''} (line {line}); got {got}"
    located = hit.span is not None or hit.code.startswith("E0")
    return located, got if located else f"not located: {got}"


# ====================================================================== bundles

def _base_bundle() -> dict[str, Any]:
    from policyc.compiler import bundle_io
    from policyc.compiler.pipeline import compile_paths

    r = compile_paths([str(CASES / "contract" / "base.contract")], analyse=False)
    assert r.ok and r.bundle is not None
    return json.loads(bundle_io.dumps(r.bundle))


def _walk(data: Any, path: str) -> tuple[Any, str | int]:
    parts = path.split(".")
    for p in parts[:-1]:
        data = data[int(p)] if isinstance(data, list) else data[p]
    last = parts[-1]
    return data, (int(last) if isinstance(data, list) else last)


def _rehash(data: dict[str, Any]) -> dict[str, Any]:
    from policyc.compiler import bundle_io

    from policyc.compiler.bundle import Bundle

    data["signature"] = None
    try:  # what an attacker does: let the schema fill its defaults, then hash as the loader will
        data["content_hash"] = bundle_io.content_hash(Bundle.model_validate(data))
    except Exception:  # noqa: BLE001 - not even the schema takes it: the loader must say so
        data["content_hash"] = "sha256:" + "0" * 64
    return data


def _deep_rule(data: dict[str, Any], depth: int, width: int = 0) -> None:
    origin = {"file": "x", "line": 1, "col": 1}
    leaf: dict[str, Any] = {"op": "atom", "attr": "tpm", "cmp": "==", "operand": {"kind": "const", "value": True}, "origin": origin}
    e = leaf
    for _ in range(depth):
        e = {"op": "not", "arg": e}
    if width:
        e = {"op": "or", "args": [leaf] * width}
    data["rules"][2]["require"] = e
    from policyc.compiler.bundle import RequestRule
    from policyc.compiler.index import plan_index
    from policyc.compiler.bundle import HeaderMapping

    try:  # keep the index plan consistent, so the depth/width check is what refuses
        rules = [RequestRule.model_validate(r) for r in data["rules"]]
        heads = [HeaderMapping.model_validate(h) for h in data["headers"]]
        data["index_plan"] = [a.model_dump(mode="json") for a in plan_index(rules, heads)]
    except Exception:  # noqa: BLE001 - too deep for pydantic: the loader must say so too
        pass


RAW_BUNDLES: dict[str, tuple[Callable[[str], str | bytes], str]] = {
    "empty": (lambda t: "", "invalid JSON"),
    "null": (lambda t: "null", "expected a JSON object"),
    "list": (lambda t: "[]", "expected a JSON object"),
    "truncated": (lambda t: t[: len(t) // 2], "invalid JSON"),
    "nan-literal": (lambda t: t.replace('"efficiency": 0.5', '"efficiency": NaN', 1), "not a JSON number"),
    "infinity-literal": (lambda t: t.replace('"hi": 1500000000000.0', '"hi": Infinity', 1), "not a JSON number"),
    "int-5000-digits": (lambda t: t.replace('"tokens": 128', '"tokens": ' + "9" * 5000, 1), "not a bundle"),
    "deep-array-100000": (lambda t: "[" * 100_000 + "]" * 100_000, "not a bundle"),
    "deep-object-100000": (lambda t: '{"a":' * 100_000 + "1" + "}" * 100_000, "not a bundle"),
    "invalid-utf8": (lambda t: t.encode()[:100] + b"\xff\xfe" + t.encode()[100:], "not UTF-8"),
    "bom": (lambda t: "\ufeff" + t, "invalid JSON"),
    "oversized-129mib": (lambda t: " " * (129 * 1024 * 1024), "at most"),
    "hash-not-recomputed": (lambda t: t.replace('"tokens": 128', '"tokens": 256', 1), "does not match its hash"),
    "schema-version-missing": (lambda t: re.sub(r'"schema_version": "[^"]*",', "", t, count=1), "unsupported bundle schema"),
    "schema-version-v1": (lambda t: re.sub(r'"schema_version": "[^"]*"', '"schema_version": "policyc.bundle/v1"', t, count=1),
                          "unsupported bundle schema"),
    "lone-surrogate-escape": (lambda t: t.replace('"risk"', '"\\udc00"', 1), "bundle"),
    "control-chars": (lambda t: t.replace('"risk"', '"\x01\x02"', 1), "invalid JSON"),
}


def _bundle_cases() -> Iterator[tuple[str, dict[str, Any], Callable[[], str | bytes]]]:
    base = _base_bundle()
    spec = json.loads((CASES / "bundle" / "mutations.json").read_text(encoding="utf-8"))
    for c in spec["cases"]:
        def make(c: dict[str, Any] = c) -> str:
            data = copy.deepcopy(base)
            for path, value in c.get("set", {}).items():
                parent, key = _walk(data, path)
                parent[key] = value
            for path in c.get("delete", []):
                parent, key = _walk(data, path)
                del parent[key]
            for path, what in c.get("append", {}).items():
                parent, key = _walk(data, path)
                src_parent, src_key = _walk(data, what["copy_of"])
                parent[key].append(copy.deepcopy(src_parent[src_key]))
            if "deep_rule" in c:
                _deep_rule(data, c["deep_rule"])
            if "wide_rule" in c:
                _deep_rule(data, 0, c["wide_rule"])
            return json.dumps(_rehash(data), indent=1)
        yield c["name"], c, make
    text = json.dumps(base, indent=2)
    for name, (mk, frag) in RAW_BUNDLES.items():
        yield f"raw-{name}", {"code": "raw", "message": frag}, (lambda mk=mk: mk(text))


def check_bundle(c: dict[str, Any], make: Callable[[], str | bytes]) -> tuple[bool, str]:
    from policyc.compiler import bundle_io

    text = make()
    try:
        bundle_io.loads(text, origin="<case>")
    except bundle_io.BundleError as e:
        msg = str(e)
        if c.get("valid"):
            return False, f"refused: {msg[:300]}"
        want, frag = c["code"], c.get("message")
        if want.startswith("E") and f"error[{want}" not in msg:
            return False, f"expected {want}; got {msg[:400]}"
        if frag is not None and frag not in msg:
            return False, f"expected `{frag}`; got {msg[:400]}"
        return True, msg[:400]
    return bool(c.get("valid")), "loaded" if c.get("valid") else "ACCEPTED: the bundle loaded"


# ====================================================================== driver

def _cases(cls: str, workdir: Path) -> Iterator[tuple[str, Callable[[], tuple[bool, str]]]]:
    if cls == "contract":
        for name, c, text in _contract_cases():
            yield name, (lambda c=c, text=text: check_contract(c, text, workdir))
    elif cls == "bundle":
        for name, c, make in _bundle_cases():
            yield name, (lambda c=c, make=make: check_bundle(c, make))
    else:
        from corpus_services import service_cases  # the ONNX gate, gRPC and CLI classes

        yield from service_cases(cls, workdir)


def _warm(cls: str) -> None:
    """Import what the class uses before the memory limit is set (the bound is for the cases)."""
    import policyc.compiler.pipeline  # noqa: F401
    from policyc.dsl.parser import parse
    from policyc.dsl.source import Source

    parse(Source("warm", "a { }"))
    if cls != "contract" and cls != "bundle":
        sys.path.insert(0, str(HERE))
        import corpus_services

        corpus_services.warm(cls)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("cls", choices=sorted(MEMORY_MIB))
    ap.add_argument("--mem-mib", type=int)
    ap.add_argument("--only", help="run the cases whose name contains this")
    args = ap.parse_args(argv)
    os.chdir(REPO)
    sys.setrecursionlimit(10_000)  # deeper than the default, so an unbounded recursion shows as slow or MemoryError, not as luck
    _warm(args.cls)
    limit = (args.mem_mib or MEMORY_MIB[args.cls]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _alarm)
    import threading

    threading.Thread(target=_watchdog, name="corpus-watchdog", daemon=True).start()
    with tempfile.TemporaryDirectory(prefix="policyc-adversarial-") as tmp:
        for name, fn in _cases(args.cls, Path(tmp)):
            if args.only and args.only not in name:
                continue
            out = run_case(name, fn)
            print(json.dumps(out.__dict__), flush=True)
    print(f"# {args.cls}: address space at most {_vm_peak_mib():.0f} MiB of the {limit >> 20} MiB bound", flush=True)
    return 0


def _vm_peak_mib() -> float:
    """The process's peak virtual size (what RLIMIT_AS bounds), from /proc."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmPeak:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


if __name__ == "__main__":
    sys.exit(main())
