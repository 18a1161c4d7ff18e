"""`policyc decide --header X-SLO-Latency=150ms --header X-Data-Region=us-west`: ask a
running decision service (through `policyc.client`) and print the decision readably, or
as one JSON document with `--format json`. `--request-file F` sends a `DecideRequest`
written as JSON (proto3 JSON mapping; `-` reads stdin); `--header`, `--tenant` and
`--session` are laid over it.
"""

from __future__ import annotations

import argparse

from .connection import SetupError, add_connection_flags, connect, fail, usage
from .exit_codes import Exit
from .help import add_command
from .inputs import read_text


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "decide", help="ask the decision service for one decision", description=__doc__,
                    examples=["policyc decide --header X-SLO-Latency=150ms --header X-Data-Region=us-west",
                              "policyc decide --request-file request.json --format json",
                              "echo '{\"headers\": {\"X-Tenant\": \"acme-bank\"}}' | policyc decide --request-file - --explain"],
                    codes=(Exit.OK, Exit.USAGE, Exit.NEGATIVE, Exit.UNAVAILABLE, Exit.REFUSED))
    p.add_argument("--header", action="append", default=[], metavar="NAME=VALUE", help="request header; repeatable")
    p.add_argument("--request-file", metavar="FILE", help="a DecideRequest as JSON (`-`: stdin)")
    p.add_argument("--tenant", help="the caller's tenant")
    p.add_argument("--session", help="session id (sticky placement)")
    p.add_argument("--explain", action="store_true", help="ask Explain instead: the full account")
    add_connection_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from google.protobuf import json_format

    from policyc.client import ClientError
    from policyc.server.proto import pb
    from policyc.server.render import decision_text, explanation_text, to_json

    req = pb.DecideRequest()
    if args.request_file:
        try:
            json_format.Parse(read_text(args.request_file), req)
        except (OSError, UnicodeDecodeError) as e:
            return usage("decide", f"{args.request_file}: cannot read: {getattr(e, 'strerror', None) or e}")
        except json_format.ParseError as e:
            return usage("decide", f"{args.request_file}: not a DecideRequest: {e}")
    for h in args.header:
        name, sep, value = h.partition("=")
        if not sep or not name.strip():
            return usage("decide", f"--header `{h}`: expected NAME=VALUE")
        req.headers[name.strip()] = value
    if args.tenant:
        req.tenant = args.tenant
    if args.session:
        req.session_id = args.session
    try:
        client = connect(args)
    except SetupError as e:
        return usage("decide", str(e))
    with client:
        try:
            if args.explain:
                ex = client.explain(request=req)
                print(to_json(ex) if args.format == "json" else explanation_text(ex))
                return Exit.OK if ex.decision.outcome == pb.ADMITTED else Exit.NEGATIVE
            d = client.decide(request=req)
        except ClientError as err:
            return fail("decide", args, err)
    print(to_json(d) if args.format == "json" else decision_text(d))
    return Exit.OK if d.outcome == pb.ADMITTED else Exit.NEGATIVE
