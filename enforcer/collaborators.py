"""The guardian's collaborators, as small protocols the server wires in.

The placer provides `report_anomaly`, the scheduler a rebalance hook, the audit log a sink
for action records. Keeping them protocols lets tests and the simulator plug in plain
callables, and keeps `enforcer/` free of imports from the packages that implement them.
"""

from __future__ import annotations

from typing import Protocol

from policyc.enforcer.records import ActionRecord


class AnomalySink(Protocol):
    def report_anomaly(self, gpu: str, signal: str, value: float, /) -> object: ...


class RebalanceHook(Protocol):
    def __call__(self, node: str) -> None: ...


class AuditSink(Protocol):
    def __call__(self, record: ActionRecord) -> None: ...


class StreamHandle(Protocol):
    """One in-flight stream the guardian may cancel: a grpc call/context or an HTTP/2 stream."""

    def cancel(self) -> object: ...


class MemoryAudit:
    """An audit sink that keeps records in memory (tests, benchmarks, the CLI's dry runs)."""

    def __init__(self) -> None:
        self.records: list[ActionRecord] = []

    def __call__(self, record: ActionRecord) -> None:
        self.records.append(record)

    def of_kind(self, kind: str) -> list[ActionRecord]:
        return [r for r in self.records if r.kind.value == kind]
