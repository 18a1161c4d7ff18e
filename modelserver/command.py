"""The model server's command line, shared by `python -m policyc.modelserver` and
`policyc modelserver`. Each `--model` starts one instance; the options after it, up to
the next `--model`, are that instance's:

    --model [NAME=]PATH        serve this ONNX model as one instance (its embedded
                               contract names the OIP model when NAME is left out)
      --instance ID            the registered instance id it answers as (default NAME)
      --simplified PATH        the simplified variant it serves to retries
      --alias OTHER            it also answers requests for model OTHER (a backup takes
                               the retries of the primary's requests, whose body names it)
      --grpc-port P            its own gRPC port, its endpoint (0: the kernel picks;
                               given before any --model: every instance's default)
    --host H                   where every server listens (default 127.0.0.1)
    --http-port Q              the process's REST port (every instance whose model name
                               no other instance of the process answers)
    --stall-control            honour `x-policyc-stall-ms` (tests and the demo only)
    --max-answer-bytes N       the largest answer sent, computed before running (default
                               4 MiB; REST answers counted as JSON, 25 bytes a value)
    --ready-file F             write the bound ports and served instances here once serving

    policyc modelserver --model fraud-scorer=a.onnx --instance fs@host-01/gpu0 \\
                        --model fraud-scorer=a.onnx --instance fs@host-02/gpu0 --grpc-port 0 --http-port 0

Nothing here imports KServe: that import parses `sys.argv`, so it waits until our own
arguments are read and `sys.argv` is cleared.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

EXIT_USAGE = 2
DEFAULT_GRPC_PORT = 8081


class UsageError(ValueError):
    """A command line that names no model, a misplaced option, or a model that cannot be served."""


@dataclass
class InstanceArgs:
    """One `--model` and the options that followed it."""

    model: str
    instance: str | None = None
    simplified: str | None = None
    aliases: list[str] = field(default_factory=list)
    grpc_port: int | None = None


class _NewInstance(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace, value: Any,
                 option: str | None = None) -> None:
        ns.instances = [*ns.instances, InstanceArgs(str(value))]


class _OfInstance(argparse.Action):
    """An option of the instance the last `--model` started (`--grpc-port` before any: the default)."""

    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace, value: Any,
                 option: str | None = None) -> None:
        if not ns.instances:
            if self.dest == "grpc_port":
                ns.default_grpc_port = value
                return
            parser.error(f"{option} `{value}` comes before any --model: it belongs to the --model it follows")
        last: InstanceArgs = ns.instances[-1]
        if self.dest == "aliases":
            last.aliases.append(str(value))
        elif getattr(last, self.dest) is not None:
            parser.error(f"{option} given twice for --model `{last.model}`")
        else:
            setattr(last, self.dest, value)


def listen_host(text: str) -> str:
    """argparse `type=` for `--host`: an IP address or `localhost`, never a name to resolve
    (a typo is a usage error naming the flag, not a server that cannot bind)."""
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    if bare == "localhost":
        return bare
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        shown = text[:64].encode("unicode_escape").decode("ascii")
        raise argparse.ArgumentTypeError(f"`{shown}` is not an IP address: give one such as 127.0.0.1, ::1 "
                                         "or 0.0.0.0, or localhost") from None
    return bare


def answer_bytes(text: str) -> int:
    """argparse `type=` for `--max-answer-bytes`: 1 KiB up to what one gRPC answer may carry."""
    from .bounds import ANSWER_ENVELOPE, GRPC_MAX_SEND

    top = GRPC_MAX_SEND - ANSWER_ENVELOPE
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"`{text[:40]}` is not a number of bytes") from None
    if not 1024 <= value <= top:
        raise argparse.ArgumentTypeError(f"{value} is outside 1024 .. {top} bytes")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.set_defaults(instances=[], default_grpc_port=None)
    p.add_argument("--model", action=_NewInstance, metavar="[NAME=]PATH", help="serve this ONNX model as one instance")
    p.add_argument("--instance", action=_OfInstance, dest="instance", metavar="ID",
                   help="the instance id the last --model answers as")
    p.add_argument("--simplified", action=_OfInstance, dest="simplified", metavar="PATH",
                   help="the simplified variant the last --model serves to retries")
    p.add_argument("--alias", action=_OfInstance, dest="aliases", metavar="OTHER",
                   help="the last --model also answers requests for model OTHER")
    p.add_argument("--grpc-port", action=_OfInstance, dest="grpc_port", type=int, metavar="P",
                   help=f"the last --model's gRPC port (0: any free port; before any --model: the default, {DEFAULT_GRPC_PORT})")
    p.add_argument("--host", type=listen_host, default="127.0.0.1",
                   help="address every server listens on: an IP address or localhost (default 127.0.0.1)")
    p.add_argument("--http-port", type=int, default=8080, help="the process's OIP v2 REST port (0: any free port; default 8080)")
    p.add_argument("--stall-control", action="store_true", help="honour the x-policyc-stall-ms request header")
    p.add_argument("--ready-file", type=Path, help="write the bound ports here (JSON) once serving")
    p.add_argument("--max-answer-bytes", type=answer_bytes, default=None, metavar="N",
                   help="the largest answer sent, computed from the output shape before running "
                        "(default 4 MiB; REST answers counted as JSON, 25 bytes a value)")


def _ports(args: argparse.Namespace) -> list[int]:
    default = args.default_grpc_port
    given = [i.grpc_port for i in args.instances]
    if default is None and len(given) > 1 and any(g is None for g in given):
        raise UsageError(f"{len(given)} models: give each its own --grpc-port (each instance is its own endpoint), "
                         "or --grpc-port 0 before the first --model")
    out = [g if g is not None else (default if default is not None else DEFAULT_GRPC_PORT) for g in given]
    for port in out:
        if not 0 <= port <= 65535:
            raise UsageError(f"--grpc-port {port}: not a port")
    fixed = [p for p in out if p]
    if len(set(fixed)) != len(fixed):
        raise UsageError("two instances given the same --grpc-port")
    return out


def _split(model: str) -> tuple[str | None, str]:
    head, sep, tail = model.partition("=")
    return (head, tail) if sep and "/" not in head else (None, model)


def _hosted(args: argparse.Namespace):  # type: ignore[no-untyped-def]  # -> list[serve.Hosted] (imports KServe)
    if not args.instances:
        raise UsageError("no model to serve: give --model [NAME=]PATH")
    ports = _ports(args)
    for i in args.instances:  # before importing KServe (a second of CPU) for a command line that cannot serve
        for path in (_split(i.model)[1], i.simplified):
            if path is not None and not Path(path).is_file():
                raise UsageError(f"{path}: no such model file")
    from .onnx_model import ModelLoadError, OnnxModel
    from .serve import Hosted, check_names

    out: list[Hosted] = []
    answer = {} if getattr(args, "max_answer_bytes", None) is None else {"max_answer_bytes": args.max_answer_bytes}
    for i, port in zip(args.instances, ports):
        name, path = _split(i.model)
        try:
            m = OnnxModel(Path(path), Path(i.simplified) if i.simplified else None, name=name, instance_id=i.instance,
                          stall_control=args.stall_control, **answer)
        except ModelLoadError as e:
            raise UsageError(str(e)) from None
        out.append(Hosted(m, tuple(i.aliases), port))
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


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m policyc.modelserver",
                                description="A KServe model server for ONNX models carrying policyc contracts.")
    add_arguments(p)
    return run(p.parse_args(argv), prog="policyc.modelserver")
