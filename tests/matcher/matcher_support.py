"""Bundles and fleet builders for matcher tests.

`shapes_bundle` pairs the real contracts and GPU catalog of `policies/` with
`data/rules.contract`, whose rules cover every shape the index must evaluate. Fleets are
built so that every instance passes admission (the registry refuses the others).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from policyc.compiler.bundle import Bundle
from policyc.compiler.pipeline import compile_paths
from policyc.matcher import Deployment, Instance, admission_problems

REPO = Path(__file__).resolve().parents[2]
CONTRACT_FILES = ("chatbot", "clinical-notes", "fraud-scorer", "gpu-catalog", "recommender")
REGIONS = ("us-west", "us-east", "eu-west", "eu-central")
LABEL_VALUES = {"tier": ("gold", "bronze", "silver"), "team": ("growth", "risk", "ops"),
                "shared": ("yes", "no"), "banned": ("true", "false")}


def compile_ok(paths: list[Path]) -> Bundle:
    r = compile_paths([str(p) for p in paths], analyse=False)
    assert r.ok, "\n".join(str(d) for d in r.diagnostics)
    return r.bundle  # type: ignore[return-value]


@pytest.fixture(scope="session")
def shapes_bundle() -> Bundle:
    files = [REPO / "policies" / f"{n}.contract" for n in CONTRACT_FILES]
    return compile_ok(files + [REPO / "tests/matcher/data/rules.contract"])


@pytest.fixture(scope="session")
def policies_bundle() -> Bundle:
    r = compile_paths([str(REPO / "policies")], analyse=False)
    assert r.ok, "\n".join(str(d) for d in r.diagnostics)
    return r.bundle  # type: ignore[return-value]


def admissible(bundle: Bundle, rng: random.Random, iid: str, model: str | None = None, hosts: int = 50) -> Instance:
    """A random instance whose deployment satisfies its contract, on one of `hosts` x 8 GPUs
    (few hosts: many copies of a model share a GPU, and with it a score)."""
    contract = bundle.contracts[rng.randrange(len(bundle.contracts))] if model is None else bundle.contract(model)
    assert contract is not None
    gpus = [g for g in bundle.gpu_catalog
            if (not contract.gpu_arch or g.arch in contract.gpu_arch) and g.hbm_bandwidth >= contract.memory.bandwidth_min]
    regions = contract.regions or REGIONS
    flags = {a: (a in contract.security) or rng.random() < 0.5 for a in ("tpm", "memory_encryption", "hardware_firewall", "tee")}
    labels = {k: rng.choice(v) for k, v in LABEL_VALUES.items() if rng.random() < 0.5}
    d = Deployment(host=f"h{rng.randrange(hosts)}", gpu=f"gpu{rng.randrange(8)}", gpu_model=rng.choice(gpus).name,
                   region=rng.choice(regions), numa_node=rng.randrange(2),
                   session_state=contract.session.state if contract.session else rng.choice(("remote", "nvme")),
                   cuda="12.4", **flags)
    inst = Instance(id=iid, model=contract.name, deployment=d, labels=labels)
    assert admission_problems(inst, bundle) == []
    return inst
