"""The instance attributes request rules may reference, with their types.

A running model instance is a contract plus its deployment's facts. Rules speak about the
instance through these names only; the type checker uses this table to reject, say, a
bandwidth compared with a time, and the index plan uses it to choose a structure
(equality / set / range / boolean). `labels.<key>` names any label (type `string`).
"""

from __future__ import annotations

from .bundle import ValueType

# name -> (type, where the value comes from)
INSTANCE_ATTRIBUTES: dict[str, tuple[ValueType, str]] = {
    "model": ("name", "contract name"),
    "version": ("string", "contract version"),
    "region": ("name", "deployment: data region the instance runs in"),
    "gpu_model": ("name", "deployment: GPU class, e.g. A100-80G"),
    "gpu_arch": ("name", "deployment: GPU architecture, e.g. hopper"),
    "host": ("name", "deployment: host name"),
    "tpm": ("bool", "deployment: TPM present"),
    "memory_encryption": ("bool", "deployment: memory encryption on"),
    "hardware_firewall": ("bool", "deployment: hardware firewall in path"),
    "tee": ("bool", "deployment: trusted execution environment"),
    "numa_node": ("count", "deployment: NUMA node of the GPU"),
    "session_state": ("name", "deployment: where session state lives (nvme, host_memory, remote)"),
    "slo_latency": ("time", "contract: declared SLO latency (infinite when none)"),
    "flops_min": ("flops", "contract: FLOPs per request, low end"),
    "flops_max": ("flops", "contract: FLOPs per request, high end"),
    "bandwidth": ("bandwidth", "contract: minimum sustained memory bandwidth"),
}

LABEL_PREFIX = "labels."

# Request variables an LLM request's body gives (the gateway reads them: gateway/llm_body.py);
# absent from other requests, so a rule reads them under `has(request.prompt_tokens)` or with
# a comparison that is false when they are missing.
BODY_REQUEST_VARS: dict[str, ValueType] = {
    "prompt_tokens": "count",  # the prompt's tokens by the served model's tokenizer
    "max_tokens": "count",  # `max_tokens` / `max_completion_tokens`, when the client gave it
    "stream": "bool",  # the client asked for a stream of server-sent events
}

# Request variables that exist without a header mapping.
BUILTIN_REQUEST_VARS: dict[str, ValueType] = {
    "tenant": "name",
    "tenant_class": "name",
    **BODY_REQUEST_VARS,
}


def attribute_type(name: str) -> ValueType | None:
    if name.startswith(LABEL_PREFIX) and len(name) > len(LABEL_PREFIX):
        return "string"
    entry = INSTANCE_ATTRIBUTES.get(name)
    return entry[0] if entry else None
