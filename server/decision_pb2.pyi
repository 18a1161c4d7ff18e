from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_UNSPECIFIED: _ClassVar[Outcome]
    ADMITTED: _ClassVar[Outcome]
    REJECTED: _ClassVar[Outcome]

class Stage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STAGE_UNSPECIFIED: _ClassVar[Stage]
    FEASIBILITY: _ClassVar[Stage]
    MATCH: _ClassVar[Stage]
    PLACEMENT: _ClassVar[Stage]
OUTCOME_UNSPECIFIED: Outcome
ADMITTED: Outcome
REJECTED: Outcome
STAGE_UNSPECIFIED: Stage
FEASIBILITY: Stage
MATCH: Stage
PLACEMENT: Stage

class Value(_message.Message):
    __slots__ = ("number", "text", "flag")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FLAG_FIELD_NUMBER: _ClassVar[int]
    number: float
    text: str
    flag: bool
    def __init__(self, number: _Optional[float] = ..., text: _Optional[str] = ..., flag: _Optional[bool] = ...) -> None: ...

class DecideRequest(_message.Message):
    __slots__ = ("headers", "attributes", "session_id", "tenant", "retry_count")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    RETRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    headers: _containers.ScalarMap[str, str]
    attributes: _containers.MessageMap[str, Value]
    session_id: str
    tenant: str
    retry_count: int
    def __init__(self, headers: _Optional[_Mapping[str, str]] = ..., attributes: _Optional[_Mapping[str, Value]] = ..., session_id: _Optional[str] = ..., tenant: _Optional[str] = ..., retry_count: _Optional[int] = ...) -> None: ...

class DecideBatchRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[DecideRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[DecideRequest, _Mapping]]] = ...) -> None: ...

class DecideBatchResponse(_message.Message):
    __slots__ = ("decisions",)
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[Decision]
    def __init__(self, decisions: _Optional[_Iterable[_Union[Decision, _Mapping]]] = ...) -> None: ...

class MatchAllRequest(_message.Message):
    __slots__ = ("request", "limit")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    request: DecideRequest
    limit: int
    def __init__(self, request: _Optional[_Union[DecideRequest, _Mapping]] = ..., limit: _Optional[int] = ...) -> None: ...

class MatchAllResponse(_message.Message):
    __slots__ = ("count", "instance_ids", "rules", "bundle_hash")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_IDS_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_HASH_FIELD_NUMBER: _ClassVar[int]
    count: int
    instance_ids: _containers.RepeatedScalarFieldContainer[str]
    rules: _containers.RepeatedCompositeFieldContainer[MatchedRule]
    bundle_hash: str
    def __init__(self, count: _Optional[int] = ..., instance_ids: _Optional[_Iterable[str]] = ..., rules: _Optional[_Iterable[_Union[MatchedRule, _Mapping]]] = ..., bundle_hash: _Optional[str] = ...) -> None: ...

class SourceSpan(_message.Message):
    __slots__ = ("file", "line", "col")
    FILE_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    COL_FIELD_NUMBER: _ClassVar[int]
    file: str
    line: int
    col: int
    def __init__(self, file: _Optional[str] = ..., line: _Optional[int] = ..., col: _Optional[int] = ...) -> None: ...

class MatchedRule(_message.Message):
    __slots__ = ("id", "origin")
    ID_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    id: str
    origin: SourceSpan
    def __init__(self, id: _Optional[str] = ..., origin: _Optional[_Union[SourceSpan, _Mapping]] = ...) -> None: ...

class PredictedLatency(_message.Message):
    __slots__ = ("network_ms", "queueing_ms", "compute_ms", "dependencies_ms", "sigma_ms", "total_ms")
    NETWORK_MS_FIELD_NUMBER: _ClassVar[int]
    QUEUEING_MS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    DEPENDENCIES_MS_FIELD_NUMBER: _ClassVar[int]
    SIGMA_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    network_ms: float
    queueing_ms: float
    compute_ms: float
    dependencies_ms: float
    sigma_ms: float
    total_ms: float
    def __init__(self, network_ms: _Optional[float] = ..., queueing_ms: _Optional[float] = ..., compute_ms: _Optional[float] = ..., dependencies_ms: _Optional[float] = ..., sigma_ms: _Optional[float] = ..., total_ms: _Optional[float] = ...) -> None: ...

class GpuRejection(_message.Message):
    __slots__ = ("gpu", "constraint", "detail")
    GPU_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    gpu: str
    constraint: str
    detail: str
    def __init__(self, gpu: _Optional[str] = ..., constraint: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class DependencyBinding(_message.Message):
    __slots__ = ("service", "endpoint", "role", "predicted_ms", "bound_ms")
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_MS_FIELD_NUMBER: _ClassVar[int]
    BOUND_MS_FIELD_NUMBER: _ClassVar[int]
    service: str
    endpoint: str
    role: str
    predicted_ms: float
    bound_ms: float
    def __init__(self, service: _Optional[str] = ..., endpoint: _Optional[str] = ..., role: _Optional[str] = ..., predicted_ms: _Optional[float] = ..., bound_ms: _Optional[float] = ...) -> None: ...

class SessionMove(_message.Message):
    __slots__ = ("session", "from_gpu", "to_gpu", "reason")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    FROM_GPU_FIELD_NUMBER: _ClassVar[int]
    TO_GPU_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    session: str
    from_gpu: str
    to_gpu: str
    reason: str
    def __init__(self, session: _Optional[str] = ..., from_gpu: _Optional[str] = ..., to_gpu: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("instance_id", "model", "host", "gpu", "gpu_model", "numa_node", "rdma_port", "queue_depth", "share", "share_source", "predicted", "reasons", "rejected", "dependencies", "session_move", "stale", "snapshot_version", "probes", "region", "endpoint")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    NUMA_NODE_FIELD_NUMBER: _ClassVar[int]
    RDMA_PORT_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    SHARE_SOURCE_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    DEPENDENCIES_FIELD_NUMBER: _ClassVar[int]
    SESSION_MOVE_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROBES_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    model: str
    host: str
    gpu: str
    gpu_model: str
    numa_node: int
    rdma_port: str
    queue_depth: int
    share: float
    share_source: str
    predicted: PredictedLatency
    reasons: _containers.RepeatedScalarFieldContainer[str]
    rejected: _containers.RepeatedCompositeFieldContainer[GpuRejection]
    dependencies: _containers.RepeatedCompositeFieldContainer[DependencyBinding]
    session_move: SessionMove
    stale: bool
    snapshot_version: int
    probes: _containers.RepeatedScalarFieldContainer[str]
    region: str
    endpoint: str
    def __init__(self, instance_id: _Optional[str] = ..., model: _Optional[str] = ..., host: _Optional[str] = ..., gpu: _Optional[str] = ..., gpu_model: _Optional[str] = ..., numa_node: _Optional[int] = ..., rdma_port: _Optional[str] = ..., queue_depth: _Optional[int] = ..., share: _Optional[float] = ..., share_source: _Optional[str] = ..., predicted: _Optional[_Union[PredictedLatency, _Mapping]] = ..., reasons: _Optional[_Iterable[str]] = ..., rejected: _Optional[_Iterable[_Union[GpuRejection, _Mapping]]] = ..., dependencies: _Optional[_Iterable[_Union[DependencyBinding, _Mapping]]] = ..., session_move: _Optional[_Union[SessionMove, _Mapping]] = ..., stale: _Optional[bool] = ..., snapshot_version: _Optional[int] = ..., probes: _Optional[_Iterable[str]] = ..., region: _Optional[str] = ..., endpoint: _Optional[str] = ...) -> None: ...

class PredicateCount(_message.Message):
    __slots__ = ("predicate", "origin", "failing")
    PREDICATE_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    FAILING_FIELD_NUMBER: _ClassVar[int]
    predicate: str
    origin: SourceSpan
    failing: int
    def __init__(self, predicate: _Optional[str] = ..., origin: _Optional[_Union[SourceSpan, _Mapping]] = ..., failing: _Optional[int] = ...) -> None: ...

class RuleExplanation(_message.Message):
    __slots__ = ("id", "origin", "applied", "why", "eliminated", "eliminated_in_order", "predicates")
    ID_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    ELIMINATED_FIELD_NUMBER: _ClassVar[int]
    ELIMINATED_IN_ORDER_FIELD_NUMBER: _ClassVar[int]
    PREDICATES_FIELD_NUMBER: _ClassVar[int]
    id: str
    origin: SourceSpan
    applied: bool
    why: str
    eliminated: int
    eliminated_in_order: int
    predicates: _containers.RepeatedCompositeFieldContainer[PredicateCount]
    def __init__(self, id: _Optional[str] = ..., origin: _Optional[_Union[SourceSpan, _Mapping]] = ..., applied: _Optional[bool] = ..., why: _Optional[str] = ..., eliminated: _Optional[int] = ..., eliminated_in_order: _Optional[int] = ..., predicates: _Optional[_Iterable[_Union[PredicateCount, _Mapping]]] = ...) -> None: ...

class Rejection(_message.Message):
    __slots__ = ("stage", "reason", "rule_ids", "spans", "eliminations", "binding_constraint", "gpus")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RULE_IDS_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    ELIMINATIONS_FIELD_NUMBER: _ClassVar[int]
    BINDING_CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    stage: Stage
    reason: str
    rule_ids: _containers.RepeatedScalarFieldContainer[str]
    spans: _containers.RepeatedCompositeFieldContainer[SourceSpan]
    eliminations: _containers.RepeatedCompositeFieldContainer[RuleExplanation]
    binding_constraint: str
    gpus: _containers.RepeatedCompositeFieldContainer[GpuRejection]
    def __init__(self, stage: _Optional[_Union[Stage, str]] = ..., reason: _Optional[str] = ..., rule_ids: _Optional[_Iterable[str]] = ..., spans: _Optional[_Iterable[_Union[SourceSpan, _Mapping]]] = ..., eliminations: _Optional[_Iterable[_Union[RuleExplanation, _Mapping]]] = ..., binding_constraint: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[GpuRejection, _Mapping]]] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("parse_us", "feasibility_us", "match_us", "place_us", "total_us")
    PARSE_US_FIELD_NUMBER: _ClassVar[int]
    FEASIBILITY_US_FIELD_NUMBER: _ClassVar[int]
    MATCH_US_FIELD_NUMBER: _ClassVar[int]
    PLACE_US_FIELD_NUMBER: _ClassVar[int]
    TOTAL_US_FIELD_NUMBER: _ClassVar[int]
    parse_us: float
    feasibility_us: float
    match_us: float
    place_us: float
    total_us: float
    def __init__(self, parse_us: _Optional[float] = ..., feasibility_us: _Optional[float] = ..., match_us: _Optional[float] = ..., place_us: _Optional[float] = ..., total_us: _Optional[float] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("decision_id", "outcome", "bundle_hash", "model", "placement", "rules", "rejection", "timing", "candidates", "variables", "retry_count")
    class VariablesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_HASH_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    REJECTION_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    VARIABLES_FIELD_NUMBER: _ClassVar[int]
    RETRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    outcome: Outcome
    bundle_hash: str
    model: str
    placement: Placement
    rules: _containers.RepeatedCompositeFieldContainer[MatchedRule]
    rejection: Rejection
    timing: Timing
    candidates: int
    variables: _containers.ScalarMap[str, str]
    retry_count: int
    def __init__(self, decision_id: _Optional[str] = ..., outcome: _Optional[_Union[Outcome, str]] = ..., bundle_hash: _Optional[str] = ..., model: _Optional[str] = ..., placement: _Optional[_Union[Placement, _Mapping]] = ..., rules: _Optional[_Iterable[_Union[MatchedRule, _Mapping]]] = ..., rejection: _Optional[_Union[Rejection, _Mapping]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., candidates: _Optional[int] = ..., variables: _Optional[_Mapping[str, str]] = ..., retry_count: _Optional[int] = ...) -> None: ...

class Explanation(_message.Message):
    __slots__ = ("decision", "feasibility", "live_instances", "matching", "rules", "shards", "shards_skipped_by_bloom", "narrative")
    DECISION_FIELD_NUMBER: _ClassVar[int]
    FEASIBILITY_FIELD_NUMBER: _ClassVar[int]
    LIVE_INSTANCES_FIELD_NUMBER: _ClassVar[int]
    MATCHING_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    SHARDS_SKIPPED_BY_BLOOM_FIELD_NUMBER: _ClassVar[int]
    NARRATIVE_FIELD_NUMBER: _ClassVar[int]
    decision: Decision
    feasibility: str
    live_instances: int
    matching: int
    rules: _containers.RepeatedCompositeFieldContainer[RuleExplanation]
    shards: int
    shards_skipped_by_bloom: int
    narrative: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, decision: _Optional[_Union[Decision, _Mapping]] = ..., feasibility: _Optional[str] = ..., live_instances: _Optional[int] = ..., matching: _Optional[int] = ..., rules: _Optional[_Iterable[_Union[RuleExplanation, _Mapping]]] = ..., shards: _Optional[int] = ..., shards_skipped_by_bloom: _Optional[int] = ..., narrative: _Optional[_Iterable[str]] = ...) -> None: ...

class Deployment(_message.Message):
    __slots__ = ("host", "gpu", "gpu_model", "region", "numa_node", "tpm", "memory_encryption", "hardware_firewall", "tee", "session_state", "cuda", "endpoint")
    HOST_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    NUMA_NODE_FIELD_NUMBER: _ClassVar[int]
    TPM_FIELD_NUMBER: _ClassVar[int]
    MEMORY_ENCRYPTION_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIREWALL_FIELD_NUMBER: _ClassVar[int]
    TEE_FIELD_NUMBER: _ClassVar[int]
    SESSION_STATE_FIELD_NUMBER: _ClassVar[int]
    CUDA_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    host: str
    gpu: str
    gpu_model: str
    region: str
    numa_node: int
    tpm: bool
    memory_encryption: bool
    hardware_firewall: bool
    tee: bool
    session_state: str
    cuda: str
    endpoint: str
    def __init__(self, host: _Optional[str] = ..., gpu: _Optional[str] = ..., gpu_model: _Optional[str] = ..., region: _Optional[str] = ..., numa_node: _Optional[int] = ..., tpm: _Optional[bool] = ..., memory_encryption: _Optional[bool] = ..., hardware_firewall: _Optional[bool] = ..., tee: _Optional[bool] = ..., session_state: _Optional[str] = ..., cuda: _Optional[str] = ..., endpoint: _Optional[str] = ...) -> None: ...

class RegisterInstanceRequest(_message.Message):
    __slots__ = ("id", "model", "deployment", "labels", "contract_json", "onnx_model", "score")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CONTRACT_JSON_FIELD_NUMBER: _ClassVar[int]
    ONNX_MODEL_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    id: str
    model: str
    deployment: Deployment
    labels: _containers.ScalarMap[str, str]
    contract_json: str
    onnx_model: bytes
    score: float
    def __init__(self, id: _Optional[str] = ..., model: _Optional[str] = ..., deployment: _Optional[_Union[Deployment, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., contract_json: _Optional[str] = ..., onnx_model: _Optional[bytes] = ..., score: _Optional[float] = ...) -> None: ...

class RegisterInstanceResponse(_message.Message):
    __slots__ = ("instance_id", "model", "registry_size", "bundle_hash", "unverified_facts")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REGISTRY_SIZE_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_HASH_FIELD_NUMBER: _ClassVar[int]
    UNVERIFIED_FACTS_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    model: str
    registry_size: int
    bundle_hash: str
    unverified_facts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, instance_id: _Optional[str] = ..., model: _Optional[str] = ..., registry_size: _Optional[int] = ..., bundle_hash: _Optional[str] = ..., unverified_facts: _Optional[_Iterable[str]] = ...) -> None: ...

class RegisterInstancesRequest(_message.Message):
    __slots__ = ("instances",)
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[RegisterInstanceRequest]
    def __init__(self, instances: _Optional[_Iterable[_Union[RegisterInstanceRequest, _Mapping]]] = ...) -> None: ...

class RegisterInstanceResult(_message.Message):
    __slots__ = ("instance_id", "registered", "status", "message", "field", "code", "unverified_facts")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    UNVERIFIED_FACTS_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    registered: bool
    status: str
    message: str
    field: str
    code: str
    unverified_facts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, instance_id: _Optional[str] = ..., registered: _Optional[bool] = ..., status: _Optional[str] = ..., message: _Optional[str] = ..., field: _Optional[str] = ..., code: _Optional[str] = ..., unverified_facts: _Optional[_Iterable[str]] = ...) -> None: ...

class RegisterInstancesResponse(_message.Message):
    __slots__ = ("results", "registered", "registry_size", "bundle_hash")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    REGISTRY_SIZE_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_HASH_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[RegisterInstanceResult]
    registered: int
    registry_size: int
    bundle_hash: str
    def __init__(self, results: _Optional[_Iterable[_Union[RegisterInstanceResult, _Mapping]]] = ..., registered: _Optional[int] = ..., registry_size: _Optional[int] = ..., bundle_hash: _Optional[str] = ...) -> None: ...

class DeregisterInstanceRequest(_message.Message):
    __slots__ = ("instance_id",)
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    def __init__(self, instance_id: _Optional[str] = ...) -> None: ...

class DeregisterInstanceResponse(_message.Message):
    __slots__ = ("registry_size",)
    REGISTRY_SIZE_FIELD_NUMBER: _ClassVar[int]
    registry_size: int
    def __init__(self, registry_size: _Optional[int] = ...) -> None: ...

class ListInstancesRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class InstanceInfo(_message.Message):
    __slots__ = ("id", "model", "deployment", "labels", "score")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    id: str
    model: str
    deployment: Deployment
    labels: _containers.ScalarMap[str, str]
    score: float
    def __init__(self, id: _Optional[str] = ..., model: _Optional[str] = ..., deployment: _Optional[_Union[Deployment, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., score: _Optional[float] = ...) -> None: ...

class ListInstancesResponse(_message.Message):
    __slots__ = ("instances", "bundle_hash")
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_HASH_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[InstanceInfo]
    bundle_hash: str
    def __init__(self, instances: _Optional[_Iterable[_Union[InstanceInfo, _Mapping]]] = ..., bundle_hash: _Optional[str] = ...) -> None: ...

class ListHostsRequest(_message.Message):
    __slots__ = ("region",)
    REGION_FIELD_NUMBER: _ClassVar[int]
    region: str
    def __init__(self, region: _Optional[str] = ...) -> None: ...

class GpuFacts(_message.Message):
    __slots__ = ("gpu", "gpu_model", "numa_node", "session_state")
    GPU_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    NUMA_NODE_FIELD_NUMBER: _ClassVar[int]
    SESSION_STATE_FIELD_NUMBER: _ClassVar[int]
    gpu: str
    gpu_model: str
    numa_node: int
    session_state: str
    def __init__(self, gpu: _Optional[str] = ..., gpu_model: _Optional[str] = ..., numa_node: _Optional[int] = ..., session_state: _Optional[str] = ...) -> None: ...

class HostFacts(_message.Message):
    __slots__ = ("host", "region", "cuda", "tpm", "memory_encryption", "hardware_firewall", "tee", "addresses", "gpus")
    HOST_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    CUDA_FIELD_NUMBER: _ClassVar[int]
    TPM_FIELD_NUMBER: _ClassVar[int]
    MEMORY_ENCRYPTION_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIREWALL_FIELD_NUMBER: _ClassVar[int]
    TEE_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    host: str
    region: str
    cuda: str
    tpm: bool
    memory_encryption: bool
    hardware_firewall: bool
    tee: bool
    addresses: _containers.RepeatedScalarFieldContainer[str]
    gpus: _containers.RepeatedCompositeFieldContainer[GpuFacts]
    def __init__(self, host: _Optional[str] = ..., region: _Optional[str] = ..., cuda: _Optional[str] = ..., tpm: _Optional[bool] = ..., memory_encryption: _Optional[bool] = ..., hardware_firewall: _Optional[bool] = ..., tee: _Optional[bool] = ..., addresses: _Optional[_Iterable[str]] = ..., gpus: _Optional[_Iterable[_Union[GpuFacts, _Mapping]]] = ...) -> None: ...

class ListHostsResponse(_message.Message):
    __slots__ = ("hosts", "known")
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    hosts: _containers.RepeatedCompositeFieldContainer[HostFacts]
    known: bool
    def __init__(self, hosts: _Optional[_Iterable[_Union[HostFacts, _Mapping]]] = ..., known: _Optional[bool] = ...) -> None: ...

class ReloadBundleRequest(_message.Message):
    __slots__ = ("bundle_json", "path", "evict_inadmissible")
    BUNDLE_JSON_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    EVICT_INADMISSIBLE_FIELD_NUMBER: _ClassVar[int]
    bundle_json: str
    path: str
    evict_inadmissible: bool
    def __init__(self, bundle_json: _Optional[str] = ..., path: _Optional[str] = ..., evict_inadmissible: _Optional[bool] = ...) -> None: ...

class ReloadBundleResponse(_message.Message):
    __slots__ = ("previous_hash", "bundle_hash", "evicted", "registry_size")
    PREVIOUS_HASH_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_HASH_FIELD_NUMBER: _ClassVar[int]
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    REGISTRY_SIZE_FIELD_NUMBER: _ClassVar[int]
    previous_hash: str
    bundle_hash: str
    evicted: _containers.RepeatedScalarFieldContainer[str]
    registry_size: int
    def __init__(self, previous_hash: _Optional[str] = ..., bundle_hash: _Optional[str] = ..., evicted: _Optional[_Iterable[str]] = ..., registry_size: _Optional[int] = ...) -> None: ...
