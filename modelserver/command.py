"""The model server's command line, shared by `python -m policyc.modelserver` and
`policyc modelserver`:

    --model [NAME=]PATH        serve this ONNX model (its embedded contract names it when
                               NAME is left out); repeat for several models in one process
    --simplified NAME=PATH     the simplified variant NAME serves to retries
    --instance NAME=ID         the registered instance id NAME answers as (default NAME)
    --alias NAME=OTHER         NAME also answers requests for model OTHER (a backup takes
                               the retries of the primary's requests, whose body names it)
    --grpc-port P              one per --model, in order: each instance has its own gRPC
                               port (0: the kernel picks); one 0 covers every model
    --host H --http-port Q     the REST port serves every model of the process by name
    --stall-control            honour `x-policyc-stall-ms` (tests and the demo only)
    --ready-file F             write the bound ports and served models here once serving

Nothing here imports KServe: that import parses `sys.argv`, so it waits until our own
arguments are read and `sys.argv` is cleared.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

EXIT_USAGE = 2


class UsageError(ValueError):
    """A command line that names no model, a bad pair, or a model that cannot be served."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", action="append", default=[], metavar="[NAME=]PATH", help="an ONNX model to serve")
    p.add_argument("--simplified", action="append", default=[], metavar="NAME=PATH",
                   help="the simplified variant model NAME serves to retries")
    p.add_argument("--instance", action="append", default=[], metavar="NAME=ID",
                   help="the instance id model NAME answers as")
    p.add_argument("--alias", action="append", default=[], metavar="NAME=OTHER",
                   help="model NAME also answers requests for model OTHER")
    p.add_argument("--host", default="127.0.0.1", help="address both servers listen on (default 127.0.0.1)")
    p.add_argument("--grpc-port", type=int, action="append", default=[],
                   help="OIP v2 gRPC port, one per --model in order (0: any free port; default 8081 for one model)")
    p.add_argument("--http-port", type=int, default=8080, help="OIP v2 REST port (0: any free port; default 8080)")
    p.add_argument("--stall-control", action="store_true", help="honour the x-policyc-stall-ms request header")
    p.add_argument("--ready-file", type=Path, help="write the bound ports here (JSON) once serving")


def _pairs(values: list[str], option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        name, sep, rest = v.partition("=")
        if not sep or not name or not rest:
            raise UsageError(f"{option} `{v}`: expected NAME=VALUE")
        if name in out:
            raise UsageError(f"{option}: `{name}` given twice")
        out[name] = rest
    return out


def _ports(given: list[int], models: int) -> list[int]:
    if not given:
        if models > 1:
            raise UsageError(f"{models} models: give one --grpc-port per --model (each instance has its own), or --grpc-port 0")
        return [8081]
    if given == [0]:
        return [0] * models
    if len(given) != models:
        raise UsageError(f"{len(given)} --grpc-port for {models} --model: give one per model, in order")
    for port in given:
        if not 0 <= port <= 65535:
            raise UsageError(f"--grpc-port {port}: not a port")
    return given


def _hosted(args: argparse.Namespace):  # type: ignore[no-untyped-def]  # -> list[serve.Hosted] (imports KServe)
    from .onnx_model import ModelLoadError, OnnxModel
    from .serve import Hosted, check_names

    if not args.model:
        raise UsageError("no model to serve: give --model [NAME=]PATH")
    ports = _ports(args.grpc_port, len(args.model))
    simplified = _pairs(args.simplified, "--simplified")
    instances = _pairs(args.instance, "--instance")
    aliases: dict[str, list[str]] = {}
    for v in args.alias:
        name, sep, other = v.partition("=")
        if not sep or not name or not other:
            raise UsageError(f"--alias `{v}`: expected NAME=OTHER")
        aliases.setdefault(name, []).append(other)
    out: list[Hosted] = []
    for v, port in zip(args.model, ports):
        head, sep, tail = v.partition("=")
        name, path = (head, tail) if sep and "/" not in head else (None, v)
        small = simplified.get(name) if name else None
        try:
            m = OnnxModel(Path(path), Path(small) if small else None, name=name, stall_control=args.stall_control)
        except ModelLoadError as e:
            raise UsageError(str(e)) from None
        m.instance_id = instances.get(m.name, m.name)
        out.append(Hosted(m, tuple(aliases.get(m.name, ())), port))
    names = {h.model.name for h in out}
    for option, keyed in (("--simplified", simplified), ("--instance", instances), ("--alias", aliases)):
        for name in keyed:
            if name not in names:
                raise UsageError(f"{option} {name}=…: no --model named `{name}`")
    try:
        check_names(out)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return out


def run(args: argparse.Namespace, prog: str = "policyc modelserver") -> int:
    sys.argv = sys.argv[:1]  # KServe parses sys.argv when imported: give it nothing of ours
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    try:
        hosted = _hosted(args)
    except UsageError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    from .serve import Listen, serve

    try:
        serve(hosted, Listen(args.host, args.http_port, args.ready_file))
    except OSError as e:  # a port that cannot be bound: a bad configuration
        print(f"{prog}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m policyc.modelserver",
                                description="A KServe model server for ONNX models carrying policyc contracts.")
    add_arguments(p)
    return run(p.parse_args(argv), prog="policyc.modelserver")
