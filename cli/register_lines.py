"""`policyc instance register --file fleet.jsonl`: many registrations in one call.

A file of JSON Lines (one `RegisterInstanceRequest` a line) goes to the service's
`RegisterInstances` RPC in one call: each line is checked there as `RegisterInstance`
checks it, and a refused line does not stop the others. Facts a line leaves out are taken
from the service's topology as for one registration (`instance_facts.fill_from_topology`,
the host list fetched once). Refusals are printed as `FILE:LINE: ID: why`; the exit code
is REFUSED when any line was refused.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from . import instance_facts
from .connection import usage
from .exit_codes import Exit

COMMAND = "instance register"


def json_lines(text: str) -> list[tuple[int, str]] | None:
    """The (line number, line) pairs when `text` is JSON Lines of objects (more than one
    document), None when it is one JSON document (or neither: the one-request path says why)."""
    try:
        json.loads(text)
        return None
    except ValueError:
        pass
    out = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    try:
        if len(out) > 1 and all(isinstance(json.loads(line), dict) for _, line in out):
            return out
    except ValueError:
        return None
    return None


class _HostsOnce:
    """The client, its `list_hosts` answered once for every line."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._hosts: Any = None

    def list_hosts(self) -> Any:
        if self._hosts is None:
            self._hosts = self._client.list_hosts()
        return self._hosts


def register_lines(args: argparse.Namespace, lines: list[tuple[int, str]]) -> int:
    from google.protobuf import json_format

    from policyc.server.proto import pb

    given = [f"--{n.replace('_', '-')}" for n in ("id", "model", "onnx", "contract_json", "numa_node", "score",
                                                   *instance_facts.FACTS, *instance_facts.FLAGS) if getattr(args, n, None)]
    if given or args.label:
        return usage(COMMAND, f"{args.file} has one request a line: give every field there, not {(given or ['--label'])[0]}")
    msgs: list[tuple[int, Any]] = []
    for n, line in lines:
        m = pb.RegisterInstanceRequest()
        try:
            json_format.Parse(line, m)
        except json_format.ParseError as e:
            return usage(COMMAND, f"{args.file}:{n}: not a RegisterInstanceRequest: {e}")
        if not m.id:
            return usage(COMMAND, f"{args.file}:{n}: `id` is required")
        msgs.append((n, m))

    def call(c: Any) -> Any:
        hosts = _HostsOnce(c)
        for n, m in msgs:
            why = instance_facts.fill_from_topology(hosts, m, False)
            if why:
                return f"{args.file}:{n}: instance `{m.id}`: {why}"
        return c.register_batch([m for _, m in msgs])

    try:
        r = instance_facts.call_service(args, COMMAND, call)
    except instance_facts.Refused as e:
        return e.code
    if isinstance(r, str):
        print(f"policyc {COMMAND}: error: {r}", file=sys.stderr)
        return Exit.REFUSED
    refused = [(n, x) for (n, _), x in zip(msgs, r.results) if not x.registered]
    if args.format == "json":
        print(json.dumps({"ok": not refused, "registered": r.registered, "registry_size": r.registry_size,
                          "bundle_hash": r.bundle_hash,
                          "refused": [{"line": n, "instance_id": x.instance_id, "status": x.status, "field": x.field,
                                       "code": x.code, "message": x.message} for n, x in refused]},
                         indent=1, sort_keys=True))
    else:
        for n, x in refused:
            print(f"policyc {COMMAND}: {args.file}:{n}: {x.instance_id}: {x.message}", file=sys.stderr)
        print(f"registered {r.registered} of {len(msgs)} from {args.file}; {r.registry_size} instances")
    return Exit.REFUSED if refused else Exit.OK
