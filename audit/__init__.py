"""The audit log: a hash-chained, signed, durable record of every decision and action.

Public API (the rest is internal):
- `AuditLog.open(path, signing_key=None, redact=(...), checkpoint_every=, checkpoint_interval=,
  durability="full"|"normal")` -> `submit_decision(record)`, `submit_decision_draft(draft)`,
  `submit_action(record)`, `submit_body(bytes)`, `submit_bodies(iterable)` (each returns a
  `Receipt`; `receipt.wait(timeout=None)` -> seq once durable), `submit_decision_drafts(drafts)`
  (one hand-over; returns the first ticket), `append_decision`,
  `append_action` (submit + wait), `checkpoint`, `close`, `last_seq`, `commits`, `failures`,
  and what a fail-closed caller reads: `stopped` (why the writer is gone), `lost`, `acked`,
  `queued_bytes`, `on_settled(fn)`, `settled(ticket)`, `commit_seconds`
  (`audit/log.py`; the chain, SQLite and fsync run in a writer process, `writer_process.py`;
  open() returns once that process holds the log and sealed its opening checkpoint)
- `decision_draft(...)` -> `DecisionDraft` (a decision record as plain values) (`audit/drafts.py`)
- `DecisionRecord`, `ActionRecord` and their parts (`audit/records.py`)
- `verify(path, public_key=None, anchor=None, workers=None, expect_closed=False)` -> `VerifyReport`
  (`audit/verify.py`: the first bad entry and how, rewrites re-hashed included; appends after
  a close record; truncation against an anchor; damage; `durable_end`, `closed`; a large log
  is walked by one process per CPU, `audit/verify_parallel.py`)
- `VerifyReport.verdict`: red (a problem) / amber (nothing wrong found, but not everything
  verified: no key, the log's end unproven, unsealed entries) / green; the log's end is
  proven by the sealed head the writer keeps beside it (`audit/head.py`) or an anchor
- `AuditLog.rotate()`, `rotation.rotate(path)`, `rotation.prune(path, retain)`: segments and
  retention (`audit/segments.py`: closed segments, the pruned record); verify, reports and
  export walk them
- `export.export(path, fmt, out, start=, end=)` (jsonl / csv / parquet), `export.read(file)`;
  `record_proof.prove_record(path, id, anchor=, public_key=, sample=)`: one record proven alone
- `html_report.html_report(path, verdict, start, end, Provenance(...))`, `provenance.py`
  (bundle state, sources revision), `report_signature.sign_report / verify_report`
- `AuditReader` (queries by decision id and time range, reports) (`audit/query.py`)
- `estimate_resources(...)`, `estimated_figures(...)` (plain values, for drafts), `measured(...)`
  (`audit/accounting.py`)
"""
