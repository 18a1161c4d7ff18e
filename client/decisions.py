"""A thin typed client of the `policyc.decision.v1.Decisions` service.

One method per RPC, taking plain Python values and returning the generated messages
(typed by the committed `.pyi`). A refused call raises `ClientError` with the gRPC status
and the structured details of its `google.rpc.Status` (`BadRequest` field violations,
`ErrorInfo` reason and metadata), read with `grpc_status.rpc_status.from_call`; servers
that only send the older `policyc-problem` trailers are read too. A server that cannot be
reached in time raises `Unavailable`, so callers tell "down" from "refused".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import grpc

from policyc.server.proto import pb, pb_grpc

UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


@dataclass(frozen=True)
class FieldViolation:
    field: str
    description: str


@dataclass(eq=False)  # exceptions keep identity equality and hashing
class ClientError(Exception):
    """The service refused the call: its status code, message and details."""

    code: grpc.StatusCode
    message: str
    violations: tuple[FieldViolation, ...] = ()
    reason: str = ""  # ErrorInfo.reason, a stable machine-readable cause
    domain: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)
    problems: tuple[str, ...] = ()  # one line per problem (violations, or the legacy trailers)

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"

    def as_json(self) -> dict[str, Any]:
        return {"code": self.code.name, "message": self.message, "reason": self.reason, "domain": self.domain,
                "metadata": dict(self.metadata), "problems": list(self.problems),
                "violations": [{"field": v.field, "description": v.description} for v in self.violations]}


class Unavailable(ClientError):
    """The service could not be reached (connection refused, no answer before the deadline)."""


def error_from(e: grpc.RpcError) -> ClientError:
    """A ClientError from a failed call, with every detail the server sent."""
    code: grpc.StatusCode = e.code()  # type: ignore[attr-defined]
    message: str = e.details() or ""  # type: ignore[attr-defined]
    violations: list[FieldViolation] = []
    reason = domain = ""
    metadata: dict[str, str] = {}
    try:
        from grpc_status import rpc_status

        status = rpc_status.from_call(e)  # type: ignore[arg-type]
    except (ImportError, ValueError):
        status = None
    if status is not None:
        from google.rpc import error_details_pb2

        for any_ in status.details:
            if any_.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                br = error_details_pb2.BadRequest()
                any_.Unpack(br)
                violations += [FieldViolation(v.field, v.description) for v in br.field_violations]
            elif any_.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                any_.Unpack(info)
                reason, domain, metadata = info.reason, info.domain, dict(info.metadata)
    trailers = e.trailing_metadata() or ()  # type: ignore[attr-defined]
    legacy = tuple(str(v) for k, v in trailers if k == "policyc-problem")
    problems = tuple(f"{v.field}: {v.description}" if v.field else v.description for v in violations) or legacy
    cls = Unavailable if code in UNREACHABLE else ClientError
    return cls(code, message, tuple(violations), reason, domain, metadata, problems)


class DecisionClient:
    """`with DecisionClient("127.0.0.1:50051", token=…) as c: c.decide({"X-SLO-Latency": "150ms"})`."""

    def __init__(self, target: str = "127.0.0.1:50051", *, token: str | None = None, tls_ca: bytes | None = None,
                 timeout: float = 10.0) -> None:
        self.target = target
        self.timeout = timeout
        self._channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(tls_ca)) if tls_ca is not None \
            else grpc.insecure_channel(target)
        self._stub = pb_grpc.DecisionsStub(self._channel)
        self._md: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "DecisionClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: Any, request: Any) -> Any:
        try:
            return method(request, timeout=self.timeout, metadata=self._md)
        except grpc.RpcError as e:
            raise error_from(e) from None

    # ------------------------------------------------------------------ RPCs
    @staticmethod
    def request(headers: Mapping[str, str] | None = None, *, tenant: str | None = None, session: str | None = None,
                retry_count: int = 0) -> pb.DecideRequest:
        return pb.DecideRequest(headers=dict(headers or {}), tenant=tenant or "", session_id=session or "",
                                retry_count=retry_count)

    def decide(self, headers: Mapping[str, str] | None = None, *, tenant: str | None = None, session: str | None = None,
               request: pb.DecideRequest | None = None) -> pb.Decision:
        """One decision (admitted or rejected: both are answers, not errors)."""
        return self._call(self._stub.Decide, request or self.request(headers, tenant=tenant, session=session))

    def explain(self, headers: Mapping[str, str] | None = None, *, tenant: str | None = None, session: str | None = None,
                request: pb.DecideRequest | None = None) -> pb.Explanation:
        return self._call(self._stub.Explain, request or self.request(headers, tenant=tenant, session=session))

    def register(self, instance_id: str, deployment: Mapping[str, Any] | pb.Deployment, *, model: str = "",
                 labels: Mapping[str, str] | None = None, contract_json: str | None = None, onnx_model: bytes | None = None,
                 score: float | None = None) -> pb.RegisterInstanceResponse:
        dep = deployment if isinstance(deployment, pb.Deployment) else pb.Deployment(**dict(deployment))
        msg = pb.RegisterInstanceRequest(id=instance_id, model=model, deployment=dep, labels=dict(labels or {}))
        if contract_json is not None:
            msg.contract_json = contract_json
        if onnx_model is not None:
            msg.onnx_model = onnx_model
        if score is not None:
            msg.score = score
        return self.register_message(msg)

    def register_message(self, msg: pb.RegisterInstanceRequest) -> pb.RegisterInstanceResponse:
        """Register from a request built elsewhere (e.g. read from JSON)."""
        return self._call(self._stub.RegisterInstance, msg)

    def register_batch(self, msgs: Sequence[pb.RegisterInstanceRequest]) -> pb.RegisterInstancesResponse:
        """Register many in one call (`RegisterInstances`): one result per item, in order; a
        refused item does not stop the others."""
        return self._call(self._stub.RegisterInstances, pb.RegisterInstancesRequest(instances=list(msgs)))

    def deregister(self, instance_id: str) -> pb.DeregisterInstanceResponse:
        return self._call(self._stub.DeregisterInstance, pb.DeregisterInstanceRequest(instance_id=instance_id))

    def list_instances(self, model: str | None = None) -> pb.ListInstancesResponse:
        return self._call(self._stub.ListInstances, pb.ListInstancesRequest(model=model or ""))

    def list_hosts(self, region: str | None = None) -> pb.ListHostsResponse:
        """The hosts the service's topology knows (their facts, GPUs, addresses)."""
        return self._call(self._stub.ListHosts, pb.ListHostsRequest(region=region or ""))

    def reload(self, *, bundle_json: str | None = None, path: str | None = None, evict_inadmissible: bool = False) -> pb.ReloadBundleResponse:
        if (bundle_json is None) == (path is None):
            raise ValueError("give exactly one of `bundle_json` and `path`")
        msg = pb.ReloadBundleRequest(evict_inadmissible=evict_inadmissible)
        if bundle_json is not None:
            msg.bundle_json = bundle_json
        else:
            msg.path = path or ""
        return self._call(self._stub.ReloadBundle, msg)

    def health(self, service: str = "") -> str:
        """The health status name (`SERVING`, `NOT_SERVING`, …) of `service`."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        resp = self._call(health_pb2_grpc.HealthStub(self._channel).Check, health_pb2.HealthCheckRequest(service=service))
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
