"""`policyc topology hosts`: the hosts the running service's topology knows — each host's
region, CUDA version, security facts, the addresses its model servers answer on and its
GPUs (class, NUMA node, session store). These are the facts `policyc instance register`
must claim truthfully (the service checks each one), read from the service itself through
`ListHosts` (an auditor's or operator's call), not from the source."""

from __future__ import annotations

import argparse
import json

from .connection import SetupError, add_connection_flags, connect, fail, usage
from .exit_codes import Exit
from .help import add_command

_SECURITY = ("tpm", "memory_encryption", "hardware_firewall", "tee")


def register(sub: argparse._SubParsersAction) -> None:
    codes = (Exit.OK, Exit.USAGE, Exit.UNAVAILABLE, Exit.REFUSED)
    p = add_command(sub, "topology", help="what the running service knows of its hosts and GPUs",
                    description=__doc__, codes=codes,
                    examples=["policyc topology hosts", "policyc topology hosts --region us-west --format json"])
    tsub = p.add_subparsers(dest="topology_command", metavar="ACTION", parser_class=type(p))
    h = add_command(tsub, "hosts", help="the hosts, their facts, addresses and GPUs, sorted by name", codes=codes,
                    examples=["policyc topology hosts", "policyc topology hosts --region us-west --gpus",
                              "policyc topology hosts --format json"])
    h.add_argument("--region", help="only this region's hosts")
    h.add_argument("--gpus", action="store_true", help="one line per GPU (text output), with the facts to register it with")
    add_connection_flags(h)
    h.set_defaults(func=_hosts)

    def no_action(args: argparse.Namespace) -> int:
        p.print_help()
        return Exit.USAGE

    p.set_defaults(func=no_action)


def _hosts(args: argparse.Namespace) -> int:
    from google.protobuf import json_format

    from policyc.client import ClientError

    try:
        client = connect(args)
    except SetupError as e:
        return usage("topology hosts", str(e))
    with client:
        try:
            r = client.list_hosts(args.region)
        except ClientError as e:
            return fail("topology hosts", args, e)
    if args.format == "json":
        print(json.dumps({"ok": True, "known": r.known,
                          "hosts": [json_format.MessageToDict(x, preserving_proto_field_name=True,
                                                              always_print_fields_with_no_presence=True) for x in r.hosts]},
                         indent=1, sort_keys=True))
        return Exit.OK
    if not r.known:
        print("the service has no topology: every deployment fact is taken as claimed (unverified)")
        return Exit.OK
    from rich.console import Console
    from rich.table import Table

    t = Table(box=None, pad_edge=False, show_edge=False)
    if args.gpus:
        for col in ("HOST", "GPU", "GPU-MODEL", "NUMA", "SESSION-STATE", "REGION", "CUDA", "SECURITY", "ADDRESSES"):
            t.add_column(col)
        for x in r.hosts:
            for g in x.gpus:
                t.add_row(x.host, g.gpu, g.gpu_model, str(g.numa_node), g.session_state, x.region, x.cuda,
                          _security(x), ",".join(x.addresses) or "-")
    else:
        for col in ("HOST", "REGION", "CUDA", "SECURITY", "GPUS", "ADDRESSES"):
            t.add_column(col)
        for x in r.hosts:
            classes: dict[str, int] = {}
            for g in x.gpus:
                classes[g.gpu_model] = classes.get(g.gpu_model, 0) + 1
            gpus = ", ".join(f"{n}x{c}" for c, n in sorted(classes.items())) or "-"
            t.add_row(x.host, x.region, x.cuda, _security(x), gpus, ",".join(x.addresses) or "-")
    Console(width=200, highlight=False, soft_wrap=True).print(t)
    print(f"{len(r.hosts)} hosts, {sum(len(x.gpus) for x in r.hosts)} GPUs")
    return Exit.OK


def _security(x: object) -> str:
    return ",".join(f.replace("_", "-") for f in _SECURITY if getattr(x, f)) or "-"
