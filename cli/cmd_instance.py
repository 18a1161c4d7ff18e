"""`policyc instance register|deregister|list`: manage the running service's fleet.

`register ID --model M --host H --gpu G [--endpoint IP:PORT] [facts…]` adds an instance
of a contract the served bundle holds. The facts not given (region, GPU class, CUDA,
security, NUMA node, session store) are read from the service's topology for that host and
GPU (`policyc topology hosts --gpus` lists them); the service checks every fact claimed.
`--endpoint` is where a gateway sends the instance's traffic (an address of its host); `--onnx MODEL.onnx` sends a model whose
metadata carries its contract (`policyc embed`), `--contract-json F` a contract in the
bundle's schema. `--file F` reads the whole `RegisterInstanceRequest` as JSON (`-`: stdin);
flags given beside it override its fields. A file of JSON Lines (one request a line, e.g.
`fleet.jsonl`) is registered in one `RegisterInstances` call: each line checked as alone, a
refused line named (`FILE:LINE`) without stopping the others. The service refuses a deployment that does not
satisfy its contract, naming each unmet requirement.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .connection import add_connection_flags, usage
from .exit_codes import Exit
from .help import add_command
from .inputs import read_bytes, read_text
from .instance_facts import FACT_HELP, FACTS, FLAGS, Refused as _Refused, call_service as _call, fill_from_topology as _fill_from_topology
from .register_lines import json_lines as _json_lines, register_lines


def register(sub: argparse._SubParsersAction) -> None:
    codes = (Exit.OK, Exit.USAGE, Exit.UNAVAILABLE, Exit.REFUSED)
    p = add_command(sub, "instance", help="register, deregister and list the service's model instances",
                    description=__doc__, codes=codes,
                    examples=["policyc topology hosts --gpus",
                              "policyc instance register fs-1 --model fraud-scorer --host host-0002 --gpu gpu0 --endpoint 127.0.0.1:9001",
                              "policyc instance list --format json", "policyc instance deregister fs-1"])
    isub = p.add_subparsers(dest="instance_command", metavar="ACTION", parser_class=type(p))
    r = add_command(isub, "register", help="add an instance (its contract, its deployment's facts)", codes=codes,
                    examples=["policyc instance register fs-1 --model fraud-scorer --host host-0002 --gpu gpu0 --endpoint 127.0.0.1:9001",
                              "policyc instance register fs-2 --onnx dist/model.onnx --host host-0003 --gpu gpu1 --endpoint 198.18.0.3:9000",
                              "policyc instance register --file instance.json"])
    r.add_argument("id", nargs="?", metavar="ID", help="instance id (unique in the fleet)")
    r.add_argument("--file", metavar="FILE", help="a RegisterInstanceRequest as JSON, or JSON Lines of them: "
                   "all in one call (`-`: stdin)")
    r.add_argument("--model", help="the contract's name in the served bundle")
    r.add_argument("--onnx", metavar="MODEL", help="an ONNX model carrying its contract (policyc embed)")
    r.add_argument("--contract-json", metavar="FILE", help="the contract as JSON, in the bundle's schema")
    for fact in FACTS:
        r.add_argument(f"--{fact.replace('_', '-')}", dest=fact, metavar="IP:PORT" if fact == "endpoint" else None,
                       help=FACT_HELP[fact])
    r.add_argument("--numa-node", type=int, help="the GPU's NUMA node")
    for flag in FLAGS:
        r.add_argument(f"--{flag.replace('_', '-')}", dest=flag, action="store_true", default=None,
                       help=f"the host has `{flag}`")
    r.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="instance label; repeatable")
    r.add_argument("--score", type=float, help="ranking score in [0, 1] (default: the GPU's live score)")
    add_connection_flags(r)
    r.set_defaults(func=_register)

    d = add_command(isub, "deregister", help="remove an instance", codes=codes,
                    examples=["policyc instance deregister fs-1"])
    d.add_argument("id", metavar="ID", help="the instance to remove")
    add_connection_flags(d)
    d.set_defaults(func=_deregister)

    ls = add_command(isub, "list", help="the registered instances, sorted by id", codes=codes,
                     examples=["policyc instance list", "policyc instance list --model fraud-scorer --format json"])
    ls.add_argument("--model", help="only this model's instances")
    add_connection_flags(ls)
    ls.set_defaults(func=_list)
    def no_action(args: argparse.Namespace) -> int:
        p.print_help()
        return Exit.USAGE

    p.set_defaults(func=no_action)


def _request(args: argparse.Namespace, text: str | None = None) -> Any:
    """The RegisterInstanceRequest the flags (and --file, or its `text`) describe, or a usage message."""
    from google.protobuf import json_format

    from policyc.server.proto import pb

    msg = pb.RegisterInstanceRequest()
    if args.file:
        try:
            json_format.Parse(read_text(args.file) if text is None else text, msg)
        except (OSError, UnicodeDecodeError) as e:
            return f"{args.file}: cannot read: {getattr(e, 'strerror', None) or e}"
        except json_format.ParseError as e:
            return f"{args.file}: not a RegisterInstanceRequest: {e}"
    if args.id:
        msg.id = args.id
    if args.model:
        msg.model = args.model
    for fact in FACTS:
        if getattr(args, fact):
            setattr(msg.deployment, fact, getattr(args, fact))
    if args.numa_node is not None:
        msg.deployment.numa_node = args.numa_node
    for flag in FLAGS:
        if getattr(args, flag):
            setattr(msg.deployment, flag, True)
    for kv in args.label:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            return f"--label `{kv}`: expected KEY=VALUE"
        msg.labels[k] = v
    if args.score is not None:
        msg.score = args.score
    try:
        if args.onnx:
            msg.onnx_model = read_bytes(args.onnx)
        elif args.contract_json:
            msg.contract_json = read_text(args.contract_json)
    except (OSError, UnicodeDecodeError) as e:
        return f"{args.onnx or args.contract_json}: cannot read: {getattr(e, 'strerror', None) or e}"
    if not msg.id:
        return "give the instance ID (or `id` in --file)"
    return msg


def _register(args: argparse.Namespace) -> int:
    text = None
    if args.file:
        try:
            text = read_text(args.file)
        except (OSError, UnicodeDecodeError) as e:
            return usage("instance register", f"{args.file}: cannot read: {getattr(e, 'strerror', None) or e}")
        lines = _json_lines(text)
        if lines is not None:
            return register_lines(args, lines)
    msg = _request(args, text)
    if isinstance(msg, str):
        return usage("instance register", msg)

    def call(c: Any) -> Any:
        return _fill_from_topology(c, msg, args.numa_node is not None) or c.register_message(msg)

    try:
        r = _call(args, "instance register", call)
    except _Refused as e:
        return e.code
    if isinstance(r, str):  # the topology does not know the host or GPU named
        if args.format == "json":
            print(json.dumps({"ok": False, "server": args.server, "error": {"code": "FAILED_PRECONDITION", "message": r}}, indent=1, sort_keys=True))
        else:
            print(f"policyc instance register: error: {r}", file=sys.stderr)
        return Exit.REFUSED
    if args.format == "json":
        print(json.dumps({"ok": True, "instance_id": r.instance_id, "model": r.model, "registry_size": r.registry_size,
                          "bundle_hash": r.bundle_hash}, indent=1, sort_keys=True))
    else:
        print(f"registered {r.instance_id} ({r.model}); {r.registry_size} instances")
    return Exit.OK


def _deregister(args: argparse.Namespace) -> int:
    try:
        r = _call(args, "instance deregister", lambda c: c.deregister(args.id))
    except _Refused as e:
        return e.code
    if args.format == "json":
        print(json.dumps({"ok": True, "instance_id": args.id, "registry_size": r.registry_size}, indent=1, sort_keys=True))
    else:
        print(f"deregistered {args.id}; {r.registry_size} instances")
    return Exit.OK


def _list(args: argparse.Namespace) -> int:
    from google.protobuf import json_format

    try:
        r = _call(args, "instance list", lambda c: c.list_instances(args.model))
    except _Refused as e:
        return e.code
    if args.format == "json":
        print(json.dumps({"ok": True, "bundle_hash": r.bundle_hash,
                          "instances": [json_format.MessageToDict(i, preserving_proto_field_name=True) for i in r.instances]},
                         indent=1, sort_keys=True))
        return Exit.OK
    print(f"{'ID':<24} {'MODEL':<20} {'HOST':<12} {'GPU':<8} {'CLASS':<6} {'REGION':<12} SCORE")
    for i in r.instances:
        d = i.deployment
        print(f"{i.id:<24} {i.model:<20} {d.host:<12} {d.gpu:<8} {d.gpu_model:<6} {d.region:<12} {i.score:.3f}")
    print(f"{len(r.instances)} instances (bundle {r.bundle_hash[:19]}…)")
    return Exit.OK
