"""`policyc audit verify|report|explain`: what a compliance auditor runs against a log.

Exit codes: 0 ok; 1 the log failed verification: tampered, damaged (a zeroed page, a
truncated file), or, with `--expect-closed`, not closed cleanly (or the decision is not in
it); 2 usage or input errors (no log, bad time, bad key, bad anchor), printed as one line,
never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from policyc.audit.checkpoints import Checkpoint, load_public_key
from policyc.audit.errors import AuditError, AuditInputError, AuditLogDamaged
from policyc.audit.query import GROUP_BY, AuditReader
from policyc.audit.render import dumps, explain_json, explain_text, report_csv, report_json, report_table, verify_json, verify_text
from policyc.audit.times import parse_time
from policyc.audit.verify import verify

from .exit_codes import Exit
from .help import add_command
from .progress import progress

DEFAULT_LOG = "audit.db"
CODES = (Exit.OK, Exit.FAILED, Exit.USAGE)


def register(sub) -> None:  # type: ignore[no-untyped-def]
    p = add_command(sub, "audit", help="verify, report on and explain the audit log", codes=CODES, description=__doc__,
                    examples=["policyc audit verify --log audit.db --public-key ops.pub",
                              "policyc audit report --log audit.db --by tenant --format csv",
                              "policyc audit report --log audit.db --format html -o report.html"])
    asub = p.add_subparsers(dest="audit_command", metavar="ACTION", parser_class=type(p))
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log", default=os.environ.get("POLICYC_AUDIT_LOG", DEFAULT_LOG), help="audit log (default: $POLICYC_AUDIT_LOG or ./audit.db)")

    v = add_command(asub, "verify", help="check the hash chain and checkpoints; name the first bad entry", codes=CODES,
                    examples=["policyc audit verify --log audit.db", "policyc audit verify --public-key ops.pub --format json > anchor.json",
                              "policyc audit verify --anchor anchor.json"])
    v.add_argument("--log", action="append", help="audit log (default: $POLICYC_AUDIT_LOG or ./audit.db); repeat it to "
                   "verify several replicas' logs")
    v.add_argument("--etcd", nargs="+", metavar="URL", help="replicas sharing a fleet: check each log against the "
                   "checkpoint its replica anchored in etcd, and that no anchored log is missing")
    v.add_argument("--etcd-prefix", default="/policyc/", help="the cluster's key prefix in etcd (default /policyc/)")
    v.add_argument("--public-key", help="operator's ed25519 public key: every checkpoint must be signed by it")
    v.add_argument("--anchor", help="a checkpoint the log must still contain, kept apart from it: a JSON file (an earlier "
                                    "`verify --format json`, or its `last_checkpoint`) or the value SEQ:HASH that `verify` prints")
    v.add_argument("--expect-closed", action="store_true",
                   help="the log must end with its close record (the service was stopped cleanly): fail otherwise")
    v.add_argument("--format", choices=("text", "json"), default="text", help="output as text (default) or one JSON document")
    v.set_defaults(func=_verify)

    r = add_command(asub, "report", help="decisions and resources per model, tenant or region", codes=CODES,
                    examples=["policyc audit report --by model", "policyc audit report --by tenant --from 2026-05-01 --format csv",
                              "policyc audit report --format html -o report.html   # a page to hand to a regulator"])
    r.add_argument("--log", default=common.get_default("log"), help="audit log (default: $POLICYC_AUDIT_LOG or ./audit.db)")
    r.add_argument("--from", dest="start", help="start time, inclusive (ISO 8601 or Unix seconds)")
    r.add_argument("--to", dest="end", help="end time, exclusive")
    r.add_argument("--by", choices=GROUP_BY, default="model", help="group by model (default), tenant or region")
    r.add_argument("--format", choices=("table", "csv", "json", "html"), default="table",
                   help="table (default), csv, json, or html: a self-contained page with the chain's verdict, tables and charts")
    r.add_argument("-o", "--output", metavar="FILE", help="write the report here instead of stdout")
    r.add_argument("--public-key", help="with --format html: the operator's public key the verdict checks checkpoints against")
    r.set_defaults(func=_report)

    e = add_command(asub, "explain", help="one decision: why, where, what it cost, what followed", codes=CODES,
                    examples=["policyc audit explain --log audit.db dec-000009", "policyc audit explain dec-000009 --format json"])
    e.add_argument("--log", default=common.get_default("log"), help="audit log (default: $POLICYC_AUDIT_LOG or ./audit.db)")
    e.add_argument("decision_id", metavar="DECISION_ID", help="the decision's id (from Decide, or a report)")
    e.add_argument("--format", choices=("text", "json"), default="text", help="output as text (default) or one JSON document")
    e.set_defaults(func=_explain)

    p.set_defaults(func=lambda args: _help(p))


def _help(parser: argparse.ArgumentParser) -> int:
    """`policyc audit` alone: the sub-commands' help, usage exit."""
    parser.print_help()
    return 2


def _fail(message: str) -> int:
    print(f"policyc audit: error: {message}", file=sys.stderr)
    return 2


def _anchor(path: str) -> Checkpoint:
    """The anchor from a file, or from its value `SEQ:HASH` (64 hex digits)."""
    seq, sep, digest = path.partition(":")
    if sep and seq.isascii() and seq.isdigit() and not os.path.exists(path):
        if len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest.lower()):
            raise AuditInputError(f"--anchor {path}: expected SEQ:HASH with 64 hex digits of hash")
        return Checkpoint(id=0, seq=int(seq), hash=digest.lower(), time=0.0, final=False)
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
    logs = args.log or [common_log()]
    if len(logs) > 1 or args.etcd:
        return _verify_many(args, logs)
    args.log = logs[0]
    try:
        key = load_public_key(args.public_key) if args.public_key else None
        anchor = _anchor(args.anchor) if args.anchor else None
        with progress(f"verifying {args.log}"):  # a spinner on a terminal, nothing otherwise
            result = verify(args.log, public_key=key, anchor=anchor, expect_closed=args.expect_closed)
    except AuditLogDamaged as e:
        print(f"policyc audit: damaged: {e}", file=sys.stderr)
        return 1
    except AuditError as e:
        return _fail(str(e))
    print(dumps(verify_json(result)) if args.format == "json" else verify_text(result))
    return 0 if result.ok else 1


def common_log() -> str:
    return os.environ.get("POLICYC_AUDIT_LOG", DEFAULT_LOG)


def _verify_many(args, logs: list[str]) -> int:  # type: ignore[no-untyped-def]
    """Several replicas' logs: each chain verified on its own, each against the checkpoint
    its replica anchored in etcd (a log cut or rewritten since fails), and every anchored
    log accounted for (`policyc.cluster.anchors`)."""
    import json

    from policyc.cluster.store import StoreError

    if args.anchor:
        return _fail("--anchor names one log's checkpoint; with several logs or --etcd the anchors come from etcd")
    try:
        key = load_public_key(args.public_key) if args.public_key else None
        anchors, ids = {}, []
        if args.etcd:
            from policyc.cluster.anchors import fetch_anchors, log_id_of

            anchors = fetch_anchors(args.etcd, args.etcd_prefix)
            ids = [log_id_of(p) for p in logs]
        results, notes, ok = [], [], True
        for i, path in enumerate(logs):
            a = anchors.get(ids[i]) if ids else None
            if args.etcd and a is None:
                notes.append(f"{path}: no checkpoint of this log (id {ids[i]}) is anchored in etcd")
                ok = False
            r = verify(path, public_key=key, anchor=a.checkpoint if a else None, expect_closed=args.expect_closed)
            ok = ok and r.ok
            results.append((path, a, r))
        for lid, a in sorted(anchors.items()):
            if lid not in ids:
                notes.append(f"replica {a.replica}'s log (id {lid}, anchored at entry {a.checkpoint.seq}) was not given")
                ok = False
    except AuditLogDamaged as e:
        print(f"policyc audit: damaged: {e}", file=sys.stderr)
        return 1
    except (AuditError, StoreError, ValueError) as e:
        return _fail(str(e))
    if args.format == "json":
        print(json.dumps({"ok": ok, "logs": [{"path": p, "replica": a.replica if a else None, **verify_json(r)}
                                             for p, a, r in results], "problems": notes}, indent=2, default=str))
    else:
        for p, a, r in results:
            print(f"== {p}" + (f" (replica {a.replica}, anchored at entry {a.checkpoint.seq})" if a else ""))
            print(verify_text(r))
        for n in notes:
            print(f"problem: {n}")
        print("all logs verify" if ok else "verification FAILED")
    return 0 if ok else 1


def _report(args) -> int:
    try:
        start = parse_time(args.start, what="--from") if args.start else None
        end = parse_time(args.end, what="--to") if args.end else None
        if args.format == "html":
            from policyc.audit.html_report import html_report

            key = load_public_key(args.public_key) if args.public_key else None
            with progress(f"verifying {args.log} and drawing the report"):
                text = html_report(args.log, verify(args.log, public_key=key), start, end)
        else:
            with AuditReader.open(args.log) as reader:
                rep = reader.report(by=args.by, start=start, end=end)
            text = dumps(report_json(rep)) if args.format == "json" else report_csv(rep) if args.format == "csv" \
                else report_table(rep)
    except AuditError as e:
        return _fail(str(e))
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text if text.endswith("\n") else text + "\n")
        except OSError as e:
            return _fail(f"{args.output}: cannot write: {e.strerror}")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(text, end="" if text.endswith("\n") else "\n")
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
