"""`policyc audit verify|report|explain`: what a compliance auditor runs against a log.

Exit codes: 0 ok; 1 the log failed verification (or the decision is not in it); 2 usage or
input errors (no log, bad time, bad key), printed as one line, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from policyc.audit.checkpoints import Checkpoint, load_public_key
from policyc.audit.errors import AuditError, AuditInputError
from policyc.audit.query import GROUP_BY, AuditReader
from policyc.audit.render import dumps, explain_json, explain_text, report_csv, report_json, report_table, verify_json, verify_text
from policyc.audit.times import parse_time
from policyc.audit.verify import verify

DEFAULT_LOG = "audit.db"


def register(sub) -> None:
    p = sub.add_parser("audit", help="verify, report on and explain the audit log")
    asub = p.add_subparsers(dest="audit_command", metavar="ACTION", parser_class=type(p))
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log", default=os.environ.get("POLICYC_AUDIT_LOG", DEFAULT_LOG), help="audit log (default: $POLICYC_AUDIT_LOG or ./audit.db)")

    v = asub.add_parser("verify", parents=[common], help="check the hash chain and checkpoints; name the first bad entry")
    v.add_argument("--public-key", help="operator's ed25519 public key: every checkpoint must be signed by it")
    v.add_argument("--anchor", help="a checkpoint (JSON, from an earlier `verify --format json`) the log must still contain")
    v.add_argument("--format", choices=("text", "json"), default="text")
    v.set_defaults(func=_verify)

    r = asub.add_parser("report", parents=[common], help="decisions and resources per model, tenant or region")
    r.add_argument("--from", dest="start", help="start time, inclusive (ISO 8601 or Unix seconds)")
    r.add_argument("--to", dest="end", help="end time, exclusive")
    r.add_argument("--by", choices=GROUP_BY, default="model")
    r.add_argument("--format", choices=("table", "csv", "json"), default="table")
    r.set_defaults(func=_report)

    e = asub.add_parser("explain", parents=[common], help="one decision: why, where, what it cost, what followed")
    e.add_argument("decision_id", metavar="DECISION_ID")
    e.add_argument("--format", choices=("text", "json"), default="text")
    e.set_defaults(func=_explain)

    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _fail(message: str) -> int:
    print(f"policyc audit: error: {message}", file=sys.stderr)
    return 2


def _anchor(path: str) -> Checkpoint:
    try:
        with open(path, encoding="utf-8") as f:
            import json

            raw = json.load(f)
        if isinstance(raw, dict) and "last_checkpoint" in raw:
            raw = raw["last_checkpoint"]
        return Checkpoint.model_validate(raw)
    except OSError as e:
        raise AuditInputError(f"{path}: cannot read anchor: {e.strerror}") from None
    except ValueError as e:
        raise AuditInputError(f"{path}: not a checkpoint ({str(e).splitlines()[0]})") from None


def _verify(args) -> int:
    try:
        key = load_public_key(args.public_key) if args.public_key else None
        anchor = _anchor(args.anchor) if args.anchor else None
        result = verify(args.log, public_key=key, anchor=anchor)
    except AuditError as e:
        return _fail(str(e))
    print(dumps(verify_json(result)) if args.format == "json" else verify_text(result))
    return 0 if result.ok else 1


def _report(args) -> int:
    try:
        start = parse_time(args.start, what="--from") if args.start else None
        end = parse_time(args.end, what="--to") if args.end else None
        with AuditReader.open(args.log) as reader:
            rep = reader.report(by=args.by, start=start, end=end)
    except AuditError as e:
        return _fail(str(e))
    if args.format == "json":
        print(dumps(report_json(rep)))
    elif args.format == "csv":
        print(report_csv(rep))
    else:
        print(report_table(rep))
    return 0


def _explain(args) -> int:
    try:
        with AuditReader.open(args.log) as reader:
            ex = reader.explain(args.decision_id)
    except AuditError as e:
        return _fail(str(e))
    if ex is None:
        print(f"policyc audit: decision `{args.decision_id}` is not in {args.log}", file=sys.stderr)
        return 1
    print(dumps(explain_json(ex)) if args.format == "json" else explain_text(ex))
    return 0
