"""Lower `breaker` blocks to circuit-break rule tables (`bundle.Breaker`).

A breaker is a row an enforcer loads without parsing anything: a conjunction of signal
conditions, how many consecutive observations make it fire, the scope it counts in, and
the actions — as data — in the order to run them. Dangerous actions (self-heal) are data
too; the enforcer's executor decides whether they run for real.
"""

from __future__ import annotations

from policyc.dsl import ast
from policyc.dsl.diagnostics import Diagnostic, did_you_mean, error

from . import units
from .actions import CANCEL_STREAM, CONFIGURED, KINDS, QUARANTINE, REDIRECT, REPORT_ANOMALY, SELF_HEAL, SCOPES
from .bundle import Action, Breaker, CancelStream, Quarantine, Redirect, ReportAnomaly, SelfHeal, SignalCondition
from .check_values import MAX_CONSECUTIVE, SIGNALS, quarantine_problem
from .fields import BlockReader, ref, shape

# what `elapsed` may be a share of: the contract's SLO, or the end-to-end latency the placer
# predicted for this very request (a request far past its own prediction is on a GPU or path
# that degraded under it, which telemetry shows only on its next tick)
SHARE_OF = ("slo", "predicted")
ACTIONS = KINDS  # the action table's words (`actions.py`)
HEAL_STEPS = ("gpu_reset", "rdma_link_refresh", "rebalance")
FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}


def lower_breaker(block: ast.Block, diags: list[Diagnostic]) -> Breaker | None:
    if len(block.labels) != 1:
        diags.append(error("E207", "a breaker is written `breaker NAME { … }`", block.kind_span))
        return None
    name = block.labels[0].text
    n_before = len(diags)
    r = BlockReader(block, f"breaker `{name}`", diags,
                    fields=("scope", "when", "consecutive", "classify", "models", "retry_budget", "actions"),
                    blocks=CONFIGURED)
    scope = r.name("scope", SCOPES, required=True)
    when = r.single("when", required=True)
    conditions = _conditions(when, diags) if when is not None else None
    consecutive = r.integer("consecutive", maximum=MAX_CONSECUTIVE) or 1
    classify = r.name("classify")
    models = r.names("models") or ()
    retry_budget = r.quantity("retry_budget", "ratio")
    if retry_budget is not None and retry_budget > 1:
        r.err("E328", "`retry_budget` is a share of active requests: at most 100 %", r.fields["retry_budget"].values[0].span)
    action_names = r.names("actions", ACTIONS, required=True)
    actions: list[Action] = []
    for a in action_names or ():
        cfg = r.block_one(a) if a in CONFIGURED else None
        if a in CONFIGURED and cfg is None:
            r.err("E211", f"breaker `{name}` lists `{a}` but has no `{a} {{ … }}` block", r.fields["actions"].span)
            continue
        if a == CANCEL_STREAM:
            actions.append(CancelStream())
        elif a == REPORT_ANOMALY:
            actions.append(ReportAnomaly())
        elif a == REDIRECT and cfg is not None:
            cr = BlockReader(cfg, f"`redirect` of breaker `{name}`", diags, fields=("backup", "variant"), blocks=("headers",))
            backup = cr.name("backup", required=True)
            variant = cr.name("variant")
            headers: list[tuple[str, str]] = []
            if (hb := cr.block_one("headers")) is not None:
                hr = BlockReader(hb, "`headers`", diags, fields=[f.key for f in hb.fields()])
                for key in hr.fields:
                    value = hr.string(key)
                    if value is not None:
                        headers.append((key, value))
            if backup is not None:
                actions.append(Redirect(backup=backup, variant=variant, headers=tuple(headers)))
        elif a == QUARANTINE and cfg is not None:
            cr = BlockReader(cfg, f"`quarantine` of breaker `{name}`", diags, fields=("duration", "max_duration", "max_share"))
            duration = cr.quantity("duration", "time", required=True)
            max_duration = cr.quantity("max_duration", "time")
            max_share = cr.quantity("max_share", "ratio")
            if duration is not None:
                q = Quarantine(duration=duration, max_duration=max_duration if max_duration is not None else duration * 16,
                               max_share=max_share if max_share is not None else 0.2)
                if (problem := quarantine_problem(q)) is not None:
                    key, message = problem
                    at = cr.fields[key].values[0].span if key in cr.fields else cfg.kind_span
                    cr.err("E329", message, at)
                else:
                    actions.append(q)
        elif a == SELF_HEAL and cfg is not None:
            cr = BlockReader(cfg, f"`self_heal` of breaker `{name}`", diags, fields=("steps",))
            steps = cr.names("steps", HEAL_STEPS, required=True)
            if steps:
                actions.append(SelfHeal(steps=steps))  # type: ignore[arg-type]
    for kind, blocks in r.blocks.items():
        if action_names is not None and kind not in action_names:
            r.err("E212", f"`{kind}` is configured but not listed in `actions`", blocks[0].kind_span,
                  f"add `{kind}` to `actions`, or remove the block")
    if len(diags) > n_before or scope is None or conditions is None or not actions:
        return None
    return Breaker(name=name, scope=scope, models=models, conditions=conditions, consecutive=consecutive,  # type: ignore[arg-type]
                   classify=classify, retry_budget=retry_budget if retry_budget is not None else 0.2,
                   actions=tuple(actions), origin=ref(block.span))


def _conditions(v: ast.Value, diags: list[Diagnostic]) -> tuple[SignalCondition, ...] | None:
    parts = v.args if isinstance(v, ast.And) else (v,)
    out: list[SignalCondition] = []
    for p in parts:
        c = _condition(p, diags)
        if c is None:
            return None
        out.append(c)
    return tuple(out)


def _condition(p: ast.Value, diags: list[Diagnostic]) -> SignalCondition | None:
    if not isinstance(p, ast.Compare) or p.op not in FLIP:
        diags.append(error("E323", "a breaker condition compares a signal with a quantity, e.g. `elapsed >= 185 ms`",
                           p.span, "conditions are joined with `and`; `or` and `not` are not allowed here"))
        return None
    left, op, right = p.left, p.op, p.right
    if not isinstance(left, ast.Name) and isinstance(right, ast.Name):
        left, right, op = right, left, FLIP[op]
    if not isinstance(left, ast.Name) or left.dotted not in SIGNALS:
        word = left.dotted if isinstance(left, ast.Name) else shape(left)
        diags.append(error("E412", f"unknown signal `{word}`", left.span,
                           did_you_mean(word, SIGNALS) or f"signals: {', '.join(SIGNALS)}"))
        return None
    signal, t = left.dotted, SIGNALS[left.dotted]
    if not isinstance(right, ast.Quantity):
        diags.append(error("E301", f"`{signal}` is compared with {units.describe(t)}, found {shape(right)}", right.span))
        return None
    if right.of is not None:
        if signal != "elapsed" or right.of.dotted not in SHARE_OF or right.unit != "%":
            diags.append(error("E324", "only `elapsed` may be written as a share of the SLO or of the placement's predicted "
                               "latency: `elapsed >= 92.5 % of slo`, `elapsed >= 300 % of predicted`", right.span))
            return None
        return SignalCondition(signal=signal, cmp=op, value=right.number / 100, of=right.of.dotted, origin=ref(p.span))  # type: ignore[arg-type]
    si = units.to_si(right.number, right.unit, t)
    if si is None:
        diags.append(error("E303", f"`{signal}` is {units.describe(t)}, found {units.describe(units.quantity_type(right.unit))}", right.span))
        return None
    if t == "ratio" and si > 1:
        diags.append(error("E328", f"`{signal}` is a percentage: compare it with at most 100 %", right.span))
        return None
    return SignalCondition(signal=signal, cmp=op, value=si, origin=ref(p.span))  # type: ignore[arg-type]
