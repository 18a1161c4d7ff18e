"""`policyc decide --header X-SLO-Latency=150ms --header X-Data-Region=us-west`: ask a
running decision service and print the decision readably (or `--format json`).

Exit codes: 0 admitted; 3 rejected (a valid answer); 1 the server refused the request
(bad header, unknown tenant, …: the status and reason are printed); 2 usage or connection.
"""

from __future__ import annotations

import sys

EXIT_REJECTED = 3


def register(sub) -> None:
    p = sub.add_parser("decide", help="ask the decision service for one decision")
    p.add_argument("--server", default="127.0.0.1:50051", help="host:port (default 127.0.0.1:50051)")
    p.add_argument("--header", action="append", default=[], metavar="NAME=VALUE", help="request header; repeatable")
    p.add_argument("--tenant", help="the caller's tenant")
    p.add_argument("--session", help="session id (sticky placement)")
    p.add_argument("--explain", action="store_true", help="ask Explain instead: the full account")
    p.add_argument("--token", help="bearer token")
    p.add_argument("--tls-ca", help="CA certificate to verify the server (enables TLS)")
    p.add_argument("--timeout", type=float, default=10.0, help="deadline, seconds")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=run)


def run(args) -> int:
    import grpc

    from policyc.server.proto import pb, pb_grpc
    from policyc.server.render import decision_text, explanation_text, to_json

    headers: dict[str, str] = {}
    for h in args.header:
        name, sep, value = h.partition("=")
        if not sep or not name.strip():
            print(f"policyc decide: error: --header `{h}`: expected NAME=VALUE", file=sys.stderr)
            return 2
        headers[name.strip()] = value
    if args.tls_ca:
        try:
            with open(args.tls_ca, "rb") as f:
                creds = grpc.ssl_channel_credentials(f.read())
        except OSError as e:
            print(f"policyc decide: error: {args.tls_ca}: {e.strerror}", file=sys.stderr)
            return 2
        channel = grpc.secure_channel(args.server, creds)
    else:
        channel = grpc.insecure_channel(args.server)
    md = (("authorization", f"Bearer {args.token}"),) if args.token else ()
    req = pb.DecideRequest(headers=headers, tenant=args.tenant or "", session_id=args.session or "")
    stub = pb_grpc.DecisionsStub(channel)
    try:
        if args.explain:
            e = stub.Explain(req, timeout=args.timeout, metadata=md)
            print(to_json(e) if args.format == "json" else explanation_text(e))
            return 0 if e.decision.outcome == pb.ADMITTED else EXIT_REJECTED
        d = stub.Decide(req, timeout=args.timeout, metadata=md)
    except grpc.RpcError as e:
        code = e.code()
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and args.format == "text":
            print(f"policyc decide: error: {args.server}: {code.name}: {e.details()}", file=sys.stderr)
            return 2
        print(f"{code.name}: {e.details()}", file=sys.stderr)
        return 1
    finally:
        channel.close()
    print(to_json(d) if args.format == "json" else decision_text(d))
    return 0 if d.outcome == pb.ADMITTED else EXIT_REJECTED
