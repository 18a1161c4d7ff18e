"""The one executor for dangerous self-heal steps: records everything, dry-runs by default.

GPU reset and RDMA link refresh touch hardware; they run only when an operator opted in
(`allow_real=True`: `policyc serve --self-heal execute`, or `self_heal = "execute"` in the
config, itself audited) and a command is configured for the step. Executed, the RDMA refresh
takes the port's device down, brings it up and waits for carrier (`heal_steps.refresh_link`),
and a GPU reset is refused on a host without that GPU, saying so. Rebalance is a placement
decision, not a hardware act: it always calls the rebalance hook. Every step, real or
not, becomes an audit record.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from policyc.enforcer.heal_steps import HealStepError, gpu_present, refresh_link
from policyc.enforcer.records import ActionKind, ActionRecord, Outcome

Step = Literal["gpu_reset", "rdma_link_refresh", "rebalance"]
HARDWARE_STEPS: frozenset[str] = frozenset({"gpu_reset", "rdma_link_refresh"})

# Default command templates; `{gpu_index}` and `{rdma_link}` come from the target's facts.
DEFAULT_COMMANDS: Mapping[str, Sequence[str]] = {
    "gpu_reset": ("nvidia-smi", "--gpu-reset", "-i", "{gpu_index}"),
    "rdma_link_refresh": ("policyc:refresh_link", "{rdma_link}"),  # down, up, wait for carrier (heal_steps)
}


@dataclass(frozen=True, slots=True)
class HealTarget:
    gpu_key: str  # "host/gpu3"
    node: str  # host whose instances are rebalanced
    gpu_index: str = "0"
    rdma_link: str = ""
    netns: str | None = None  # where the link lives (None: this process's namespace)


@dataclass(frozen=True, slots=True)
class StepResult:
    step: str
    outcome: Outcome
    detail: str


class FenceVerdict(Protocol):
    @property
    def allowed(self) -> bool: ...

    @property
    def token(self) -> int: ...  # the fencing token the act was checked against (0: none)

    @property
    def detail(self) -> str: ...


class RemoteAct(Protocol):
    """Where hosts run agents (policyc.cluster), a hardware step for a host is carried out
    by that host's agent: `remote(step, target, rule, dry_run)` sends it (fenced) and says
    so, or returns None for a step it does not carry (then this process runs it)."""

    def __call__(self, step: str, target: HealTarget, rule: str, dry_run: bool) -> StepResult | None: ...


class Fence(Protocol):
    """Where replicas share a fleet, one elected leader takes dangerous acts: `admit` says
    whether this process may take this one now, checked against its fencing token in the
    store (policyc.cluster). Without a fence (one process) every act is this process's."""

    def admit(self, kind: str, target: str, detail: str, *, rule: str = "", backup: str = "",
              expires_at: float | None = None) -> FenceVerdict: ...


@dataclass
class ActionExecutor:
    audit: Callable[[ActionRecord], None]
    rebalance: Callable[[str], object]
    allow_real: bool = False
    commands: Mapping[str, Sequence[str]] = field(default_factory=lambda: dict(DEFAULT_COMMANDS))
    timeout_s: float = 60.0
    fence: Fence | None = None
    remote: RemoteAct | None = None  # the host's agent carries the step out (its result is audited when it comes back)

    def run(self, steps: Sequence[str], target: HealTarget, rule: str) -> list[StepResult]:
        """Run the steps in order; a failed hardware step stops the rest (no rebalance onto a broken GPU).
        With a fence, each step is admitted first (refused: recorded, and the rest not run);
        the fencing token goes into the step's record."""
        results: list[StepResult] = []
        for step in steps:
            sent = self.remote(step, target, rule, not self.allow_real) if self.remote is not None else None
            if sent is not None:  # fenced by the sender: the order lands only under a fencing token that holds
                results.append(sent)
                self.audit(ActionRecord(time=time.time(), kind=ActionKind.SELF_HEAL_STEP, target=f"{step} {target.gpu_key}",
                                        rule=rule, outcome=sent.outcome, dry_run=not self.allow_real, detail=sent.detail,
                                        source="executor"))
                if sent.outcome in (Outcome.FAILED, Outcome.REFUSED):
                    break
                continue
            fenced = ""
            if self.fence is not None:
                verdict = self.fence.admit("self_heal_step", f"{step} {target.gpu_key}", f"rule {rule}", rule=rule)
                if not verdict.allowed:
                    results.append(StepResult(step, Outcome.REFUSED, verdict.detail))
                    self.audit(ActionRecord(time=time.time(), kind=ActionKind.SELF_HEAL_STEP, target=f"{step} {target.gpu_key}",
                                            rule=rule, outcome=Outcome.REFUSED, detail=verdict.detail, source="executor"))
                    break
                fenced = f" [fencing token {verdict.token}]"
            result = self._one(step, target)
            results.append(result)
            self.audit(ActionRecord(time=time.time(), kind=ActionKind.SELF_HEAL_STEP, target=f"{step} {target.gpu_key}",
                                    rule=rule, outcome=result.outcome, dry_run=result.outcome is Outcome.DRY_RUN,
                                    detail=result.detail + fenced, source="executor"))
            if result.outcome is Outcome.FAILED:
                break
        return results

    def _refresh(self, step: str, target: HealTarget) -> StepResult:
        if not target.rdma_link:
            return StepResult(step, Outcome.FAILED, f"no RDMA link known for {target.gpu_key}")
        try:
            r = refresh_link(target.rdma_link, target.netns, carrier_timeout=self.timeout_s)
        except HealStepError as e:
            return StepResult(step, Outcome.FAILED, str(e))
        return StepResult(step, Outcome.DONE, f"{target.rdma_link} ({r.device}) down {r.down_s * 1e3:.0f} ms, up, "
                                              f"carrier after {r.carrier_after_s * 1e3:.0f} ms")

    def _one(self, step: str, target: HealTarget) -> StepResult:
        if step == "rebalance":
            try:
                self.rebalance(target.node)
            except Exception as exc:  # the hook is someone else's code: record, never crash the guardian
                return StepResult(step, Outcome.FAILED, f"rebalance hook failed: {exc}")
            return StepResult(step, Outcome.DONE, f"rebalanced instances of node {target.node}")
        if step not in HARDWARE_STEPS:
            return StepResult(step, Outcome.FAILED, f"unknown self-heal step `{step}`")
        template = self.commands.get(step)
        if template is None:
            return StepResult(step, Outcome.FAILED, f"no command configured for `{step}`")
        argv = [part.format(gpu_index=target.gpu_index, rdma_link=target.rdma_link) for part in template]
        if not self.allow_real:
            return StepResult(step, Outcome.DRY_RUN, "would run: " + " ".join(argv))
        if argv[0] == "policyc:refresh_link":
            return self._refresh(step, target)
        # nvidia-smi on a host without that GPU: refused, saying so (an operator's own command is theirs)
        if step == "gpu_reset" and tuple(template) == tuple(DEFAULT_COMMANDS["gpu_reset"]) \
                and (why := gpu_present(target.gpu_index)) is not None:
            return StepResult(step, Outcome.REFUSED, why)
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return StepResult(step, Outcome.FAILED, f"{argv[0]}: {exc}")
        if out.returncode != 0:
            return StepResult(step, Outcome.FAILED, f"{' '.join(argv)} exited {out.returncode}: {out.stderr.strip()[:200]}")
        return StepResult(step, Outcome.DONE, " ".join(argv))
