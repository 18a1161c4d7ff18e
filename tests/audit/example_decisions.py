"""Real decisions of the example policies (`policies/`) on a simulated cluster, for the
audit tests that store what the server bridge hands the writer."""

from __future__ import annotations

import warnings

from policyc.compiler.bundle import Bundle
from policyc.compiler.pipeline import compile_paths
from policyc.server.app import DecisionServer
from policyc.server.config import ClusterSpec, EnforcerMode, ServeConfig
from policyc.server.decision import Decision, DecisionInput
from policyc.server.fleet import admissible_fleet


def decide_examples(requests: list[dict[str, str]], rounds: int) -> tuple[list[tuple[Decision, dict[str, str]]], Bundle]:
    """Each of `requests` decided `rounds` times over (with its headers), and the bundle."""
    warnings.simplefilter("ignore")
    bundle = compile_paths(["policies"], analyse=False).bundle
    assert bundle is not None
    server = DecisionServer(bundle, ServeConfig(cluster=ClusterSpec(seed=1, hosts=16, gpus_per_host=8, hosts_per_rack=8),
                                                enforcer=EnforcerMode.OFF, watch_gpus=False))
    assert server.cluster is not None
    server.engine.register_many(admissible_fleet(bundle, server.cluster.gpu_slots()))
    return [(server.engine.decide(DecisionInput(headers=h, attributes={})), h) for h in requests * rounds], bundle
