"""`policyc audit verify|report|explain|export|rotate|verify-report`: what a compliance
auditor (and the operator keeping the log) runs against a log.

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
    v.add_argument("--strict", action="store_true", help="fail (exit 1) unless the verdict is green: signatures checked, the "
                                                         "log's end proven (sealed head or anchor), every entry sealed")
    v.add_argument("--format", choices=("text", "json"), default="text", help="output as text (default) or one JSON document")
    v.add_argument("--record", metavar="ID", help="prove one record alone (a decision id, or seq:N) against --anchor, or against the "
                   "log's first signed checkpoint after it with --public-key")
    v.add_argument("--sample", metavar="FILE", help="with --record: take the record from this export (jsonl, csv or parquet) and prove it")
    v.set_defaults(func=_verify)

    x = add_command(asub, "export", help="stream individual decisions and acts, with their accounting and chain position", codes=CODES,
                    examples=["policyc audit export --from 2026-05-01 --to 2026-06-01 --format csv -o may.csv",
                              "policyc audit export --format parquet -o all.parquet   # needs pyarrow (policyc[parquet])",
                              "policyc audit export --format jsonl | head"])
    x.add_argument("--log", default=common.get_default("log"), help="audit log (default: $POLICYC_AUDIT_LOG or ./audit.db)")
    x.add_argument("--from", dest="start", help="start time, inclusive (ISO 8601 or Unix seconds)")
    x.add_argument("--to", dest="end", help="end time, exclusive")
    x.add_argument("--format", choices=("jsonl", "csv", "parquet"), default="jsonl", help="jsonl (default), csv or parquet")
    x.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout (parquet needs a file)")
    x.set_defaults(func=_export)

    ro = add_command(asub, "rotate", help="close the live segment with a signed checkpoint and start the next, chained to it",
                     codes=CODES, examples=["policyc audit rotate --log audit.db",
                                            "policyc audit rotate --log audit.db --retain 400d --public-key ops.pub"])
    ro.add_argument("--log", default=common.get_default("log"), help="audit log (default: $POLICYC_AUDIT_LOG or ./audit.db)")
    ro.add_argument("--signing-key", help="the operator's ed25519 private key, when no service holds the log (a running "
                                          "service's writer signs with its own)")
    ro.add_argument("--retain", metavar="DURATION", help="after rotating, prune closed segments whose last entry is older than "
                                                          "this (e.g. 400d), keeping their signed close records in <log>.segments/pruned.json")
    ro.add_argument("--public-key", help="with --retain: the key the log must verify with before anything is pruned")
    ro.add_argument("--no-rotate", action="store_true", help="with --retain: prune only")
    ro.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for a running writer to rotate (default 60)")
    ro.set_defaults(func=_rotate)

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
    r.add_argument("--anchor", help="with --format html: a checkpoint kept apart from the log (as for `verify --anchor`)")
    r.add_argument("--bundle", metavar="FILE", help="with --format html: the bundle in force, named with its hash and signature state")
    r.add_argument("--bundle-key", metavar="PUB", help="with --bundle: the public key its signature must verify with")
    r.add_argument("--sources", metavar="DIR", help="with --format html: the policy sources, named by their git revision or digest")
    r.add_argument("--auditor", metavar="NAME", help="with --format html: who generates the report (default: user@host)")
    r.add_argument("--sign", metavar="KEY", help="with -o: sign the written report (a detached ed25519 signature in FILE.sig)")
    r.set_defaults(func=_report)

    vr = add_command(asub, "verify-report", help="check a report's detached signature (`report --sign`)", codes=CODES,
                     examples=["policyc audit verify-report report.html --public-key auditor.pub"])
    vr.add_argument("report", metavar="REPORT", help="the report file")
    vr.add_argument("--public-key", required=True, help="the signer's ed25519 public key")
    vr.add_argument("--signature", metavar="FILE", help="the signature file (default: REPORT.sig)")
    vr.set_defaults(func=_verify_report)

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
    if args.record or args.sample:
        return _verify_record(args, logs)
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
    return 0 if result.ok and (result.verdict == "green" or not args.strict) else 1


def _verify_record(args, logs: list[str]) -> int:  # type: ignore[no-untyped-def]
    """`verify --record ID`: one record proven against an anchor (exit 0) or refused (1)."""
    import json

    from policyc.audit.record_proof import prove_record

    if not args.record:
        return _fail("--sample names an export to take the record from: give the record with --record ID")
    if len(logs) > 1 or args.etcd:
        return _fail("--record proves a record of one log: give one --log")
    try:
        key = load_public_key(args.public_key) if args.public_key else None
        anchor = _anchor(args.anchor) if args.anchor else None
        sample = _sample(args.sample, args.record) if args.sample else None
        proof = prove_record(logs[0], args.record, anchor=anchor, public_key=key, sample=sample)
    except AuditLogDamaged as e:
        print(f"policyc audit: damaged: {e}", file=sys.stderr)
        return 1
    except AuditError as e:
        return _fail(str(e))
    if args.format == "json":
        print(json.dumps({"record": args.record, "seq": proof.seq, "hash": proof.hash, "ok": proof.ok, "against": proof.anchor_kind,
                          "anchor_seq": proof.anchor_seq, "entries_rehashed": proof.walked, "message": proof.message}, indent=2))
    else:
        print(f"{logs[0]}: record {args.record}: {'PROVEN' if proof.ok else 'REFUSED'}: {proof.message}")
    return 0 if proof.ok else 1


def _sample(path: str, record: str) -> dict:
    """The row of `record` (decision id or seq:N) in an export file."""
    from policyc.audit.export import read

    key = record.removeprefix("seq:")
    for row in read(path):
        if (key.isascii() and key.isdigit() and row.get("seq") == int(key)) or (row.get("decision_id") == record and row.get("kind") == "decision"):
            return row
    raise AuditInputError(f"{path}: record `{record}` is not in this export")


def _export(args) -> int:  # type: ignore[no-untyped-def]
    from policyc.audit.export import export

    try:
        start = parse_time(args.start, what="--from") if args.start else None
        end = parse_time(args.end, what="--to") if args.end else None
        if args.format == "parquet" and not args.output:
            raise AuditInputError("parquet is written to a file: add -o FILE")
        if args.output:
            try:
                stats = export(args.log, args.format, args.output, start=start, end=end)
            except OSError as e:
                raise AuditInputError(f"{args.output}: cannot write: {e.strerror}") from None
        else:
            stats = export(args.log, args.format, sys.stdout.buffer, start=start, end=end)
            sys.stdout.flush()
    except AuditError as e:
        return _fail(str(e))
    print(f"exported {stats.rows} records ({stats.decisions} decisions, {stats.actions} acts)"
          + (f" to {args.output}" if args.output else ""), file=sys.stderr)
    return 0


def _rotate(args) -> int:  # type: ignore[no-untyped-def]
    from policyc.audit import rotation
    from policyc.audit.checkpoints import load_private_key
    from policyc.audit.times import parse_duration

    try:
        retain = parse_duration(args.retain, what="--retain") if args.retain else None
        if args.no_rotate and retain is None:
            raise AuditInputError("--no-rotate only makes sense with --retain")
        if not args.no_rotate:
            key = load_private_key(args.signing_key) if args.signing_key else None
            closed = rotation.rotate(args.log, signing_key=key, timeout=args.timeout)
            print(f"{args.log}: closed segment {closed}; writing segment {closed + 1}")
        if retain is not None:
            pub = load_public_key(args.public_key) if args.public_key else None
            gone = rotation.prune(args.log, retain, public_key=pub)
            for g in gone:
                print(f"{args.log}: pruned segment {g.segment} (entries {g.first_seq}..{g.last_seq}); its close record "
                      f"{g.close.seq}:{g.close.hash} is kept in the segments' pruned.json")
            if not gone:
                print(f"{args.log}: no closed segment is older than {args.retain}")
    except AuditError as e:
        return _fail(str(e))
    return 0


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
        html_only = [f"--{n.replace('_', '-')}" for n in ("anchor", "bundle", "bundle_key", "sources", "auditor") if getattr(args, n)]
        if args.format != "html" and html_only:
            raise AuditInputError(f"{', '.join(html_only)} name(s) the context of an html report: add --format html")
        if args.sign and not args.output:
            raise AuditInputError("--sign signs the report file: add -o FILE")
        if args.bundle_key and not args.bundle:
            raise AuditInputError("--bundle-key checks the signature of --bundle FILE: give the bundle too")
        if args.format == "html":
            from policyc.audit.html_report import Provenance, html_report
            from policyc.audit.provenance import bundle_state, generated_by, sources_revision

            key = load_public_key(args.public_key) if args.public_key else None
            anchor = _anchor(args.anchor) if args.anchor else None
            bundle = bundle_state(args.bundle, load_public_key(args.bundle_key) if args.bundle_key else None) if args.bundle else None
            prov = Provenance(bundle=bundle, sources=sources_revision(args.sources) if args.sources else None,
                              generated_by=args.auditor or generated_by())
            with progress(f"verifying {args.log} and drawing the report"):
                text = html_report(args.log, verify(args.log, public_key=key, anchor=anchor), start, end, prov)
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
        if args.sign:
            from policyc.audit.checkpoints import load_private_key
            from policyc.audit.report_signature import sign_report

            try:
                sig = sign_report(args.output, load_private_key(args.sign))
            except AuditError as e:
                return _fail(str(e))
            print(f"signed {args.output}: {sig}", file=sys.stderr)
    else:
        print(text, end="" if text.endswith("\n") else "\n")
    return 0


def _verify_report(args) -> int:  # type: ignore[no-untyped-def]
    from policyc.audit.report_signature import verify_report

    try:
        check = verify_report(args.report, load_public_key(args.public_key), args.signature)
    except AuditError as e:
        return _fail(str(e))
    print(("ok: " if check.ok else "FAILED: ") + check.message)
    return 0 if check.ok else 1


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
