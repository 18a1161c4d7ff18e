"""The deployment recipes (deploy/): every Kubernetes manifest validates offline against
the Kubernetes API schema (kubernetes-validate, strict: unknown fields fail), the config
the manifests mount is read by policyc's own config loader for each command, the
environment variables they set are real settings, and the Containerfile installs extras
that exist. No cluster or container runtime is used: none is available to CI here."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from policy_text import REPO

from policyc.cli.main import main

DEPLOY = REPO / "deploy"
K8S_VERSION = "1.33"


def _docs() -> list[tuple[str, dict]]:
    out = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                out.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return out


@pytest.mark.parametrize(("name", "doc"), _docs(), ids=[n for n, _ in _docs()])
def test_each_manifest_validates_against_the_kubernetes_schema(name: str, doc: dict) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_a_broken_manifest_is_refused() -> None:
    doc = next(d for _, d in _docs() if d["kind"] == "Deployment")
    broken = {**doc, "spec": {**doc["spec"], "replicaz": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def _config(tmp_path: Path) -> Path:
    cm = next(d for _, d in _docs() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "policyc-config")
    p = tmp_path / "policyc.toml"
    p.write_text(cm["data"]["policyc.toml"], encoding="utf-8")
    return p


@pytest.mark.parametrize("command", [["serve"], ["gateway"], ["agent", "run"]])
def test_the_mounted_config_is_read_by_each_command(command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("POLICYC_AGENT_HOST", "node-1")  # the DaemonSet sets it from the node's name
    assert main([*command, "--config", str(_config(tmp_path)), "--print-config"]) == 0
    out = capsys.readouterr().out
    table = tomllib.loads(_config(tmp_path).read_text())[command[0]]
    printed = tomllib.loads(out)[command[0]]
    for key, value in table.items():
        assert printed[key] == value, (key, printed.get(key))


def test_the_manifests_environment_variables_are_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    names = set()
    for _, doc in _docs():
        for c in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            names |= {e["name"] for e in c.get("env", [])}
    assert names >= {"POLICYC_SERVE_TOKEN", "POLICYC_GATEWAY_TOKEN", "POLICYC_AGENT_HOST"}
    for name in names:
        m = re.fullmatch(r"POLICYC_(SERVE|GATEWAY|AGENT)_([A-Z_]+)", name)
        assert m, name
        command = {"SERVE": ["serve"], "GATEWAY": ["gateway"], "AGENT": ["agent", "run"]}[m.group(1)]
        monkeypatch.setenv("POLICYC_AGENT_HOST", "node-1")
        monkeypatch.setenv(name, "operator:t1" if "TOKEN" in name else "node-1")
        assert main([*command, "--config", str(_config(tmp_path)), "--print-config"]) == 0
        assert f"{m.group(2).lower().replace('_', '-')} = " in capsys.readouterr().out


def test_the_containerfile_installs_extras_that_exist_and_runs_the_mounted_config() -> None:
    text = (DEPLOY / "Containerfile").read_text(encoding="utf-8")
    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    wanted = re.search(r"\[([a-z,]+)\]\"", text)
    assert wanted and set(wanted.group(1).split(",")) <= extras
    assert '"/etc/policyc/policyc.toml"' in text
    mounts = {m["mountPath"] for _, d in _docs() for c in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
              for m in c.get("volumeMounts", [])}
    assert "/etc/policyc/policyc.toml" in mounts
