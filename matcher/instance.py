"""A model instance: a contract from the bundle plus the facts of its deployment.

The contract says what the model *requires*; `Deployment` says what the place it runs
*provides*. Registering an instance whose deployment does not satisfy its contract is
refused (`admission_problems`). Requests are matched against `attributes()`, the flat
view named by `policyc.compiler.attributes.INSTANCE_ATTRIBUTES`.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field, field_validator

from policyc.compiler.bundle import Bundle, Contract, Scalar
from policyc.compiler.meaning import instance_attributes


class Deployment(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str
    gpu: str  # GPU id within the host, e.g. "gpu3"
    gpu_model: str  # catalog class, e.g. "A100-80G"
    region: str
    numa_node: int = 0
    tpm: bool = False
    memory_encryption: bool = False
    hardware_firewall: bool = False
    tee: bool = False
    session_state: str = "remote"  # nvme | host_memory | remote
    cuda: str = "12.4"
    # Where a gateway sends this instance's traffic (`ip:port`, canonical: see
    # `canonical_endpoint`); empty for an instance that takes part in placement only (the
    # simulated fleet). Only instances with an endpoint are candidates for gateway traffic.
    endpoint: str = ""

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        return canonical_endpoint(v) if v else v


class Instance(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    model: str  # contract name in the bundle
    deployment: Deployment
    labels: dict[str, str] = Field(default_factory=dict)


def canonical_endpoint(text: str) -> str:
    """`text` as the `ip:port` a gateway names hosts by (`127.0.0.1:8001`, `[::1]:8001`), or
    ValueError saying what is wrong with it. An IP literal, not a host name: Envoy's
    override-host load balancer looks the chosen endpoint up among the addresses of a static
    cluster, so a name would never match."""
    if not text:
        raise ValueError("is empty; expected `ip:port`, e.g. `127.0.0.1:8001`")
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
    else:
        host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"`{text}` is not `ip:port` (e.g. `127.0.0.1:8001`, `[::1]:8001`)")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"`{text}`: port `{port}` is not a number in 1..65535")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"`{text}`: `{host}` is not an IP address (a gateway routes to addresses, not names)") from None
    if ip.is_unspecified or ip.is_multicast:
        raise ValueError(f"`{text}`: `{host}` cannot receive traffic (unspecified or multicast address)")
    return f"[{ip.compressed}]:{int(port)}" if ip.version == 6 else f"{ip}:{int(port)}"


@lru_cache(maxsize=256)
def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split(".") if p.isdigit())


def admission_problems(instance: Instance, bundle: Bundle) -> list[str]:
    """Why this instance may not be registered under this bundle (empty: it may)."""
    contract = bundle.contract(instance.model)
    if contract is None:
        return [f"unknown model `{instance.model}`: the bundle has no contract of that name"]
    d = instance.deployment
    problems: list[str] = []
    gpu = bundle.gpu(d.gpu_model)
    if gpu is None:
        problems.append(f"unknown GPU class `{d.gpu_model}`: not in the bundle's GPU catalog")
    if contract.regions and d.region not in contract.regions:
        problems.append(f"region `{d.region}` is not allowed by contract `{contract.name}` ({', '.join(contract.regions)})")
    if gpu is not None and contract.gpu_arch and gpu.arch not in contract.gpu_arch:
        problems.append(f"GPU architecture `{gpu.arch}` is not allowed by contract `{contract.name}` ({', '.join(contract.gpu_arch)})")
    for attr in contract.security:
        if not getattr(d, attr):
            problems.append(f"contract `{contract.name}` requires `{attr}`, which the deployment does not provide")
    if gpu is not None and gpu.hbm_bandwidth < contract.memory.bandwidth_min:
        problems.append(
            f"GPU `{gpu.name}` offers {gpu.hbm_bandwidth / 1e9:g} GB/s, below the contract's {contract.memory.bandwidth_min / 1e9:g} GB/s"
        )
    if contract.session is not None and contract.session.state != "remote" and d.session_state != contract.session.state:
        problems.append(f"contract `{contract.name}` keeps session state on `{contract.session.state}`, deployment has `{d.session_state}`")
    have = _version_tuple(d.cuda)
    for b in contract.dependencies.cuda:
        want = _version_tuple(b.version)
        ok = {"<": have < want, "<=": have <= want, ">": have > want, ">=": have >= want, "==": have == want}[b.op]
        if not ok:
            problems.append(f"CUDA {d.cuda} does not satisfy the contract's `cuda {b.op} {b.version}`")
    return problems


def attributes(instance: Instance, contract: Contract, bundle: Bundle) -> dict[str, Scalar]:
    """The flat attribute view that request rules are evaluated against (SI units): the
    deployment's facts here, the contract's from `policyc.compiler.meaning`."""
    return deployment_attributes(instance.deployment, contract, bundle, instance.labels)


def deployment_attributes(d: Deployment, contract: Contract, bundle: Bundle,
                          labels: dict[str, str] | None = None) -> dict[str, Scalar]:
    """`attributes` of an instance with this deployment and these labels."""
    return instance_attributes(contract, deployment_facts(d, bundle), labels)


def deployment_facts(d: Deployment, bundle: Bundle) -> dict[str, Scalar]:
    """The deployment's own attributes (`attributes` adds the contract's and the labels)."""
    gpu = bundle.gpu(d.gpu_model)
    return {
        "region": d.region,
        "gpu_model": d.gpu_model,
        "gpu_arch": gpu.arch if gpu else "unknown",
        "host": d.host,
        "tpm": d.tpm,
        "memory_encryption": d.memory_encryption,
        "hardware_firewall": d.hardware_firewall,
        "tee": d.tee,
        "numa_node": float(d.numa_node),
        "session_state": d.session_state,
    }
