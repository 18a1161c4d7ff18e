"""`RegisterInstance`: the instance's facts are checked against the topology that knows
them (`check_facts`); the instance's contract, given inline or inside an ONNX model, must
be the bundle's contract of that name. A model whose embedded contract lacks a required
field is refused naming the field (`INVALID_ARGUMENT`); one whose contract differs from the
bundle's (contract drift) is refused naming the fields that differ (`FAILED_PRECONDITION`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from pydantic import ValidationError

from policyc.compiler.bundle import Bundle, Contract
from policyc.compiler.check_values import check_values

from policyc.compiler.diagnostic import error
from policyc.matcher.admission_cache import AdmissionCache
from policyc.matcher.errors import AdmissionError
from policyc.matcher.instance import Instance
from policyc.placer.topology import Topology

from .errors import ServiceError, Status

# Where a contract was written and what the solver derived from it are not the promise itself.
_NOT_COMPARED = {"origin", "field_origins", "gpu_shares"}


def _promise(c: Contract) -> dict:
    def strip(x):  # type: ignore[no-untyped-def]
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in ("origin",)}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x
    return {k: strip(v) for k, v in c.model_dump(mode="json").items() if k not in _NOT_COMPARED}


def _differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    out: list[str] = []
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        path = f"{prefix}{k}"
        if isinstance(x, dict) and isinstance(y, dict):
            out.extend(_differences(x, y, path + "."))
        elif x != y:
            out.append(path)
    return out


MAX_CONTRACT_JSON = 1024 * 1024


def _not_a_number(name: str) -> float:
    raise ValueError(f"`{name}` is not a JSON number")


def contract_from_json(text: str) -> Contract:
    """A contract as JSON, checked as the compiler and the ONNX gate check one: bounded,
    strict types (a token count as a string is refused), no NaN or Infinity, no nesting
    that recurses, then the compiler's value checks (`check_values`)."""
    if len(text) > MAX_CONTRACT_JSON:
        raise ServiceError(Status.INVALID_ARGUMENT, f"contract_json: {len(text):,} characters; at most {MAX_CONTRACT_JSON:,}",
                           field="contract_json")
    try:
        json.loads(text, parse_constant=_not_a_number)
    except json.JSONDecodeError as e:
        raise ServiceError(Status.INVALID_ARGUMENT, f"contract_json: not JSON at column {e.colno}: {e.msg}", field="contract_json") from None
    except RecursionError:
        raise ServiceError(Status.INVALID_ARGUMENT, "contract_json: nested too deeply", field="contract_json") from None
    except ValueError as e:  # NaN / Infinity, a 5,000-digit integer
        raise ServiceError(Status.INVALID_ARGUMENT, f"contract_json: {str(e).split(';')[0]}", field="contract_json") from None
    try:
        contract = Contract.model_validate_json(text, strict=True)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])[:200]
        raise ServiceError(Status.INVALID_ARGUMENT, f"contract_json: `{where}`: {first['msg']}", field=where) from None
    diags: list = []
    check_values([contract], (), (), (), (), diags)
    if diags:
        d = diags[0]
        raise ServiceError(Status.INVALID_ARGUMENT, f"contract_json: error[{d.code}]: {d.message}", field="contract_json")
    return contract


def contract_from_onnx(data: bytes) -> Contract:
    # imported here: ONNX (with numpy's ml_dtypes) is ~0.6 CPU s of a service's start, and only a
    # registration that carries a model needs it (a restarted gateway serving again in seconds)
    from policyc.onnxgate.contract_metadata import load_contract
    from policyc.onnxgate.errors import ContractMetadataError

    try:
        return load_contract(data)
    except ContractMetadataError as e:
        raise ServiceError(Status.INVALID_ARGUMENT, str(e), field=e.field) from None


def check_counted_cost(data: bytes) -> None:
    """The ONNX gate at registration: the model an instance registers with is recounted at its
    contract's token count (cached per file digest, `onnxgate.registration_check`), and a
    count outside the declared FLOPs widened by the gate's tolerance, or a model the gate
    cannot count, is refused (`FAILED_PRECONDITION`) with `policyc validate`'s message.
    Done here, where the whole file arrives, so that no model server can register a model
    whose contract it does not meet; call it after `check_against_bundle` (the contract
    counted against is then the bundle's)."""
    from policyc.onnxgate.registration_check import recount_model

    r = recount_model(data).report
    if r.ok:
        return
    if r.verdict.value in ("bad_model", "bad_contract"):
        raise ServiceError(Status.INVALID_ARGUMENT, r.message, field=r.field or "onnx_model")
    code = "E726" if r.verdict.value == "drift" else "E727"
    raise ServiceError(Status.FAILED_PRECONDITION, f"the ONNX gate refuses the model: {r.message}", r.problems[:20],
                       field="compute.flops", diagnostics=(error(code, r.message, field="compute.flops"),))


def check_against_bundle(given: Contract, model: str, bundle: Bundle) -> str:
    """The model name to register under; ServiceError when the given contract is not the bundle's."""
    name = model or given.name
    if model and given.name != model:
        raise ServiceError(Status.INVALID_ARGUMENT, f"the contract is `{given.name}` but the instance says model `{model}`", field="model")
    ours = bundle.contract(name)
    if ours is None:
        raise ServiceError(Status.NOT_FOUND, f"unknown model `{name}`: the bundle has no contract of that name", field="model",
                           code="E720")
    diff = _differences(_promise(given), _promise(ours))
    if diff:
        shown = ", ".join(f"`{d}`" for d in diff[:6])
        raise ServiceError(Status.FAILED_PRECONDITION,
                           f"contract drift: the given contract `{name}` differs from the bundle's in {shown}", tuple(diff), field=diff[0],
                           diagnostics=tuple(error("E722", f"`{d}` differs from the bundle's contract", field=d) for d in diff))
    return name


# ---------------------------------------------------------------------- facts

def check_facts(inst: Instance, topology: Topology | None) -> tuple[str, ...]:
    """Check an instance's deployment facts against the telemetry that knows them (the
    placer's topology: built from the simulated cluster, or from /sys and NVML for
    `--cluster local`). Returns the facts no source could tell (unverified); raises
    ServiceError (FAILED_PRECONDITION) naming the first fact that disagrees and both values.

    The host, its GPU, the GPU's class and NUMA node, and the host's region, CUDA version
    and security facts (TPM, memory encryption, hardware firewall, TEE) and the NUMA
    node's session store are all known to a topology; with none, every fact is unverified."""
    d = inst.deployment
    facts = ("host", "gpu", "gpu_model", "numa_node", "region", "cuda", "tpm", "memory_encryption",
             "hardware_firewall", "tee", "session_state")
    if topology is None:
        return facts
    hosts = topology.host_index
    h = hosts.get(d.host)
    if h is None:
        raise _fact_refused(inst, "host", d.host, f"no such host among the topology's {len(hosts)}")
    g = topology.gpu_index.get((d.host, d.gpu))
    if g is None:
        known = sorted(x.gpu_id for x in topology.gpus if x.host == h)
        raise _fact_refused(inst, "gpu", d.gpu, f"{d.host} has {', '.join(known) or 'no GPU'}")
    gpu, host = topology.gpus[g], topology.hosts[h]
    numa = topology.numa[gpu.numa]
    where = f"{d.host}/{d.gpu}"
    known_facts: tuple[tuple[str, object, object, str], ...] = (
        ("gpu_model", d.gpu_model, gpu.model, where),
        ("numa_node", d.numa_node, numa.node, where),
        ("region", d.region, host.region, d.host),
        ("cuda", d.cuda, host.cuda, d.host),
        ("tpm", d.tpm, host.tpm, d.host),
        ("memory_encryption", d.memory_encryption, host.memory_encryption, d.host),
        ("hardware_firewall", d.hardware_firewall, host.hardware_firewall, d.host),
        ("tee", d.tee, host.tee, d.host),
        ("session_state", d.session_state, numa.store.value, f"{d.host} NUMA node {numa.node}"),
    )
    for fact, claimed, truth, of in known_facts:
        if claimed != truth:
            raise _fact_refused(inst, fact, claimed, f"the topology knows {of} as `{_show(truth)}`")
    return ()


def _show(v: object) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _fact_refused(inst: Instance, fact: str, claimed: object, known: str) -> ServiceError:
    field = f"deployment.{fact}"
    return ServiceError(Status.FAILED_PRECONDITION,
                        f"instance `{inst.id}`: `{field}` is `{_show(claimed)}` but {known}", (field,), field=field)


def admissible(inst: Instance, bundle: Bundle) -> bool:
    """Whether the deployment can serve its contract at all (the registry's own check, which
    refuses first and says what the contract requires)."""
    try:
        AdmissionCache(bundle).attributes(inst)
    except AdmissionError:
        return False
    return True


# ---------------------------------------------------------------------- request ids, unconfirmed writes

REQUEST_ID_HEADER = "x-request-id"


def request_id_of(metadata: "Iterable[tuple[str, str | bytes]] | None") -> str:
    """The caller's request id (the `x-request-id` metadata, as Envoy names it), "" when it
    gave none. A retry that carries the id of an earlier attempt gets that attempt's settled
    result instead of a second write. INVALID_ARGUMENT for an id that cannot name a request."""
    from policyc.cluster.registry_ledger import valid_request_id

    for key, value in metadata or ():
        if key == REQUEST_ID_HEADER:
            text = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
            if not valid_request_id(text):
                raise ServiceError(Status.INVALID_ARGUMENT, f"`{REQUEST_ID_HEADER}`: `{text[:80]}` is not a request id "
                                   "(1-128 letters, digits, `.`, `_`, `:`, `-`)", field=REQUEST_ID_HEADER, code="E723")
            return text
    return ""


def outcome_unknown(what: str, instance_id: str, request_id: str, why: str) -> ServiceError:
    """UNAVAILABLE for a registry write the fleet store did not confirm: it may still take
    effect, so it is never reported as not done. The ErrorInfo (reason E730) carries
    `outcome: unknown` and the request id to retry with; the replica logs the outcome once
    the store answers again."""
    message = (f"instance `{instance_id}`: the {what} was not confirmed by the fleet store ({why}); its outcome is "
               f"unknown and it may still take effect. Retry with {REQUEST_ID_HEADER} `{request_id}`: the retry "
               "converges to one result, and the replica logs the outcome once the store answers")
    return ServiceError(Status.UNAVAILABLE, message, code="E730",
                        info={"outcome": "unknown", "request_id": request_id, "instance_id": instance_id, "operation": what})
