"""The committed gRPC stubs: current with `decision.proto` (what the pinned grpcio-tools
writes now), of the protobuf version the runtime floor names, and never regenerated at
import."""

from __future__ import annotations

import re
import tomllib

from policy_text import REPO

from policyc.server import protogen


def test_committed_stubs_are_what_the_pinned_protoc_writes() -> None:
    assert protogen.stale() == [], "run `python -m policyc.server.protogen` and commit the stubs"


def test_stub_gencode_is_the_runtime_floor() -> None:
    gencode = re.search(r"^# Protobuf Python Version: (\S+)$", (REPO / "server/decision_pb2.py").read_text(), re.MULTILINE)
    assert gencode and gencode.group(1) == protogen.STUB_PROTOBUF
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    protobuf = next(d for d in deps if d.startswith("protobuf"))
    assert protobuf.split("#")[0].strip().startswith(f"protobuf>={protogen.STUB_PROTOBUF},<"), protobuf
    build = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    assert not any("grpcio-tools" in r for r in build), "the build must not run protoc"


def test_import_never_generates() -> None:
    text = (REPO / "server/proto.py").read_text()
    assert "protogen" not in text.split('"""', 2)[2] and "generate(" not in text
