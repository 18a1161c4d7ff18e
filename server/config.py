"""How to run the decision service: one frozen configuration, filled by `policyc serve`'s
flags, the demo, tests and the benchmark."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from policyc.cluster.config import FleetConfig
from policyc.enforcer.data_path import DataPathConfig

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .auth import Tokens
from .score_push import DEFAULT_BUDGET


class Telemetry(str, Enum):
    SIMULATED = "simulated"  # the embedded simulated cluster (default: no source configured)
    LOCAL = "local"  # this machine, via /sys (and NVML where a GPU exists)


class EnforcerMode(str, Enum):
    AUTO = "auto"  # the kernel plane where root and BPF allow, else user space (loudly)
    KERNEL = "kernel"  # the kernel plane or fail
    USERSPACE = "userspace"
    OFF = "off"  # no guardian at all (benchmarks)


class AuditDurability(str, Enum):
    """When a decision is acknowledged (`policyc serve --audit-durability`): `group` (the
    default) at once, its record made durable by the next group commit (within 50 ms plus
    one commit; the gate closes if one takes longer than `audit_window`); `sync` only once
    its record is on disk (committed with the decisions of the same moment)."""

    GROUP = "group"
    SYNC = "sync"


class SelfHeal(str, Enum):
    """Self-heal's hardware and registry steps: recorded only (the default), or executed
    (an operator's explicit switch, itself audited when the service starts)."""

    DRY_RUN = "dry-run"
    EXECUTE = "execute"


@dataclass(frozen=True)
class ClusterSpec:
    """The simulated cluster: deterministic for a seed."""

    seed: int = 1
    hosts: int = 32
    gpus_per_host: int = 4
    hosts_per_rack: int = 4


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path
    client_ca: Path | None = None  # set: mutual TLS, clients must present a certificate


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 0  # 0: an ephemeral port (the bound one is reported)
    telemetry: Telemetry = Telemetry.SIMULATED
    cluster: ClusterSpec = ClusterSpec()
    refresh_interval: float = 0.2
    candidates: int = 8  # instances (each on its own GPU) handed to the placer at a time, a window per try
    tokens: Tokens = field(default_factory=Tokens)
    tls: TlsFiles | None = None
    allow_insecure_remote: bool = False  # plaintext off loopback: an explicit, loud opt-in
    # True: every caller may change the fleet and the bundle (`--open-fleet`, loopback only,
    # logged as a warning); False (the default): that needs the operator role, whose token
    # the service makes and keeps when `tokens` has none (see operator_token.py)
    open_fleet: bool = False
    # where the service keeps the operator token it makes (`operator-token`, mode 0600,
    # reused on restart); None: the runtime dir's entry for the bound port, removed at stop
    token_dir: Path | None = None
    # RegisterInstance: endpoints only in these networks (CIDR); empty: the topology's
    # hosts' addresses (see endpoint_rules.py)
    endpoint_networks: tuple[str, ...] = ()
    # (host, ip): addresses the operator declares for a host beside the topology source's
    host_addresses: tuple[tuple[str, str], ...] = ()
    audit_log: Path | None = None
    # set: every bundle (start, ReloadBundle bytes or path, SIGHUP) must be signed by this key
    bundle_key: Ed25519PublicKey | None = None
    audit_durability: AuditDurability = AuditDurability.GROUP
    audit_key: Path | None = None  # ed25519 private key (PEM or hex) that signs the log's checkpoints
    audit_window: float = 0.5  # seconds a record may take to become durable before Decide refuses (audit_bridge.WINDOW)
    enforcer: EnforcerMode = EnforcerMode.USERSPACE
    self_heal: SelfHeal = SelfHeal.DRY_RUN  # EXECUTE: GPU reset, RDMA refresh and rebalance really run
    watch_gpus: bool = True  # feed per-GPU telemetry to the guardian's GPU rules each tick
    max_decide_bytes: int = 64 * 1024
    max_message_bytes: int = 32 * 1024 * 1024  # RegisterInstance may carry an ONNX model
    metrics_port: int | None = None
    metrics_host: str | None = None  # the metrics listener's address (default: `host`)
    ready_min_instances: int = 0  # readiness: the registry is warm once this many instances are registered
    start_refresher: bool = True  # tests may step the cluster by hand instead
    score_push_budget: int = DEFAULT_BUDGET  # placer score -> matcher (model, GPU) group moves per tick (see score_push.py)
    # the refresher's steps and the score pushes (in chunks) run on the serving event loop
    # (see placer/refresher.py, score_push.py); False: on the refresher's thread
    refresh_on_loop: bool = True
    # freeze the long-lived heap after the registry changes, so that the collector's full
    # passes skip it (see heap.py); process-wide, so the process owner turns it on
    settle_heap: bool = False
    # a fleet store (etcd, or the embedded default's local store): the registry, bundle in
    # force, leadership and session affinity shared with other replicas (see policyc.cluster)
    fleet: FleetConfig | None = None
    # with the kernel plane loaded (`enforcer` kernel, or auto where it loads): its TC programs
    # on these interfaces, its connect hooks on the gateway's cgroup (made and removed by the
    # service when none is named), its backend map following the registry (server/kernel_path.py);
    # None: loaded, attached to nothing
    data_path: DataPathConfig | None = DataPathConfig()
    # scrape every registered instance's /metrics that names its server kind (the `metrics`
    # label: vllm, sglang, ...) on this tick, seconds, and hand the readings to the placer's
    # measured signals (queue depth, ...) with their ages (placer/measured.py ScrapedFleet);
    # None: no scraping, the placer's model alone
    metrics_scrape_interval: float | None = 0.05
    # the fleet-wide scrape budget, scrapes a second over every endpoint: a large fleet's
    # per-endpoint tick is stretched from the interval to stay within it (placer/metrics_scraper.py)
    metrics_scrape_budget: float = 200.0
