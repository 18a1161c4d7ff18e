"""The audit log: a hash-chained, signed, durable record of every decision and action.

Public API (the rest is internal):
- `AuditLog.open(path, signing_key=None, redact=(...))` -> `append_decision`, `append_action`,
  `submit_decision`, `submit_action`, `checkpoint`, `close` (`audit/log.py`)
- `DecisionRecord`, `ActionRecord` and their parts (`audit/records.py`)
- `verify(path, public_key=None, anchor=None)` -> `VerifyReport` (`audit/verify.py`)
- `AuditReader` (queries by decision id and time range, reports) (`audit/query.py`)
- `estimate_resources(...)`, `measured(...)` (`audit/accounting.py`)
"""
