"""Ring-buffer events from the kernel plane, decoded into typed values.

A stream event carries the kernel's own timing of one HTTP/2 stream; the other kinds are
kernel-side actions and map changes, each of which becomes an `ActionRecord` for the audit
log (`to_record`).
"""

from __future__ import annotations

import ctypes as ct
import time
from dataclasses import dataclass

from policyc.enforcer.endpoint import Endpoint
from policyc.enforcer.kernel_abi import STREAM_F_OVER_BUDGET, STREAM_F_RST, CEvent, EventKind, MapOp
from policyc.enforcer.records import ActionKind, ActionRecord, Outcome


@dataclass(frozen=True, slots=True)
class KernelEvent:
    kind: EventKind
    ts_ns: int  # CLOCK_MONOTONIC, comparable with time.monotonic_ns()
    a: Endpoint  # stream: client; redirect: original target; drop: source; map change: key
    b: Endpoint  # stream: server; redirect: backup; drop: destination; map change: value
    rule: int
    op: MapOp | None
    stream_id: int
    flags: int
    result: int
    value: int  # stream: duration ns; drop: bytes; map change: arg
    value2: int  # stream: start ns

    @staticmethod
    def decode(raw: bytes) -> "KernelEvent":
        e = CEvent.from_buffer_copy(raw[: ct.sizeof(CEvent)])
        kind = EventKind(e.kind)
        return KernelEvent(
            kind=kind,
            ts_ns=e.ts_ns,
            a=e.a.endpoint(),
            b=e.b.endpoint(),
            rule=e.rule,
            op=MapOp(e.op) if kind is EventKind.MAP_CHANGE and e.op in MapOp._value2member_map_ else None,
            stream_id=e.stream_id,
            flags=e.flags,
            result=e.result,
            value=e.value,
            value2=e.value2,
        )

    @property
    def duration_s(self) -> float:
        return self.value / 1e9

    @property
    def reset(self) -> bool:
        return bool(self.flags & STREAM_F_RST)

    @property
    def over_budget(self) -> bool:
        return bool(self.flags & STREAM_F_OVER_BUDGET)

    def to_record(self, rule_names: dict[int, str]) -> ActionRecord | None:
        """The audit record of a kernel-side action; None for a stream within budget."""
        rule = rule_names.get(self.rule, "")
        now = time.time()
        if self.kind is EventKind.CONNECT_REDIRECT:
            ok = self.result == 0
            return ActionRecord(
                time=now, kind=ActionKind.KERNEL_REDIRECT, target=str(self.a), rule=rule,
                outcome=Outcome.DONE if ok else Outcome.FAILED, source="kernel",
                detail=f"connect to {self.a} rewritten to {self.b}" if ok else f"cannot rewrite to {self.b} (errno {-self.result})",
            )
        if self.kind is EventKind.TC_DROP:
            return ActionRecord(
                time=now, kind=ActionKind.KERNEL_DROP, target=str(self.b), rule=rule, outcome=Outcome.DONE,
                source="kernel", detail=f"dropped {self.value} bytes from {self.a}",
            )
        if self.kind is EventKind.MAP_CHANGE:
            op = self.op.name.lower() if self.op else f"op{self.rule}"
            return ActionRecord(
                time=now, kind=ActionKind.MAP_CHANGE, target=f"{op} {self.a}", rule=rule,
                outcome=Outcome.DONE if self.result == 0 else Outcome.FAILED, source="kernel",
                detail=f"{op} key={self.a} value={self.b} arg={self.value} result={self.result}",
            )
        if self.kind is EventKind.H2_DESYNC:
            return ActionRecord(
                time=now, kind=ActionKind.H2_DESYNC, target=f"{self.a}->{self.b}", rule="", outcome=Outcome.OBSERVED,
                source="kernel", detail="HTTP/2 frame walk lost its place; stream timings stop for this connection",
            )
        if self.kind is EventKind.STREAM_DONE and self.over_budget:
            return ActionRecord(
                time=now, kind=ActionKind.STREAM_OVER_BUDGET, target=f"{self.a}->{self.b}#{self.stream_id}", rule=rule,
                outcome=Outcome.OBSERVED, source="kernel", detail=f"stream took {self.value / 1e6:.1f} ms",
            )
        return None
