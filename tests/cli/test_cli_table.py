"""Every `policyc` command, table-driven: each case is (argv, stdin, expected exit code,
what its stdout holds). The table must name every registered command, so a new command
fails this test until it has cases; every command must have help text and an example;
a command that declares its exit codes (`cli/help.add_command`) may return only those;
JSON output is one document. The service cases run against a real decision service on an
ephemeral loopback port."""

from __future__ import annotations

import argparse
import io
import json
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
from policy_text import BASE_CONTRACT, REPO

from policyc.cli.exit_codes import Exit
from policyc.cli.main import build_parser, main
from policyc.compiler import bundle_io
from policyc.compiler.pipeline import compile_paths
from policyc.server import convert
from policyc.server.app import DecisionServer, ServerThread
from policyc.server.config import ClusterSpec, ServeConfig
from policyc.server.fleet import admissible_fleet

UNFORMATTED = BASE_CONTRACT.replace("  memory {\n    bandwidth: >= 80 GB/s\n    burst: <= 200 ms\n  }",
                                    "  memory { bandwidth: >=80 GB/s   burst:<=200 ms }")
BROKEN = BASE_CONTRACT.replace("bandwidth: >= 80 GB/s", "bandwidth: >= 80 ms")


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], tuple[argparse.ArgumentParser, str]]:
    """Every (sub)command path → its parser and the help line its parent gives it."""
    out = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, child in action.choices.items():
                out[(*path, name)] = (child, helps.get(name) or "")
                out.update(_commands(child, (*path, name)))
    return out


COMMANDS = _commands(build_parser())


def test_every_command_has_help_and_an_example() -> None:
    missing = [" ".join(p) for p, (parser, help_) in COMMANDS.items()
               if not help_ or "example" not in (parser.epilog or "").lower()]
    assert not missing, f"commands without help text or an example: {missing}"


def test_every_option_and_argument_has_help() -> None:
    bare = [(" ".join(path), a.option_strings or a.dest) for path, (parser, _) in COMMANDS.items() for a in parser._actions
            if not a.help and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
    assert not bare, f"options without help: {bare}"


def test_exit_code_table_is_in_help_and_readme() -> None:
    text = build_parser().format_help()
    readme = (REPO / "README.md").read_text()
    for code in Exit:
        assert f"{int(code):>3}  " in text
        assert f"| {int(code)} |" in readme, f"README's exit-code table lacks {int(code)}"


@dataclass
class Case:
    argv: list[str]
    code: int
    check: Callable[[str, str], object] | None = None  # (stdout, stderr) -> truthy
    stdin: str = ""
    json_out: bool = False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("cli-table")
    bundle = compile_paths([REPO / "policies"]).bundle
    assert bundle is not None
    bundle_io.write(bundle, d / "bundle.json")
    (d / "m.contract").write_text(UNFORMATTED)
    (d / "broken.contract").write_text(BROKEN)
    tampered = json.loads((d / "bundle.json").read_text())
    tampered["rules"] = tampered["rules"][1:]
    (d / "tampered.json").write_text(json.dumps(tampered))
    th = ServerThread(DecisionServer(bundle, ServeConfig(cluster=ClusterSpec(seed=1, hosts=8, gpus_per_host=4),
                                                          start_refresher=False)))
    port = th.start()
    fleet = [i for i in admissible_fleet(bundle, th.server.cluster.gpu_slots()) if i.model == "fraud-scorer"]  # type: ignore[union-attr]
    from google.protobuf import json_format

    (d / "inst.json").write_text(json_format.MessageToJson(convert.register_request(fleet[0])))
    (d / "inst2.json").write_text(json_format.MessageToJson(convert.register_request(fleet[1])))
    sys.path.insert(0, str(REPO / "tests" / "audit"))
    from audit_helpers import fill  # tests/audit: a real log with decisions and actions

    fill(d / "audit.db", 40)
    yield {"dir": str(d), "server": f"127.0.0.1:{port}", "down": f"127.0.0.1:{_free_port()}", "inst2_id": fleet[1].id}
    th.stop()


def _js(out: str) -> object:
    return json.loads(out)  # exactly one JSON document, or this raises


def cases(w: dict[str, str]) -> list[Case]:
    d, srv, down = w["dir"], w["server"], w["down"]
    policies = str(REPO / "policies")
    S = ["--server", srv]
    return [
        # check
        Case(["check", policies], Exit.OK, lambda o, e: "ok: 5 contracts" in o),
        Case(["check", "--format", "json", f"{d}/broken.contract"], Exit.FAILED, lambda o, e: _js(o)[0]["code"] == "E303", json_out=True),
        Case(["check", "-"], Exit.OK, lambda o, e: "ok: 1 contracts" in o, stdin=BASE_CONTRACT),
        Case(["check"], Exit.USAGE),
        # compile
        Case(["compile", policies, "-o", f"{d}/out.json", "--format", "json"], Exit.OK,
             lambda o, e: _js(o)["bundle"]["path"].endswith("out.json") and _js(o)["bundle"]["content_hash"].startswith("sha256:"), json_out=True),
        Case(["compile", f"{d}/broken.contract", "-o", f"{d}/x.json", "--format", "json"], Exit.FAILED,
             lambda o, e: _js(o)["ok"] is False and _js(o)["diagnostics"][0]["code"] == "E303", json_out=True),
        Case(["compile", "-", "-o", "-"], Exit.OK, lambda o, e: json.loads(o)["content_hash"].startswith("sha256:") and "wrote -" in e,
             stdin=BASE_CONTRACT),
        Case(["compile", policies, "-o", f"{d}/y.json", "--sign", f"{d}/absent.key"], Exit.USAGE),
        # fmt
        Case(["fmt", f"{d}/m.contract"], Exit.OK, lambda o, e: o == BASE_CONTRACT and Path(d, "m.contract").read_text() == UNFORMATTED),
        Case(["fmt", "--check", f"{d}/m.contract"], Exit.FAILED, lambda o, e: "would reformat" in o),
        Case(["fmt", "--diff", "-"], Exit.OK, lambda o, e: "+    burst: <= 200 ms" in o, stdin=UNFORMATTED),
        Case(["fmt", "-w", "--check", f"{d}/m.contract"], Exit.USAGE),
        # inspect
        Case(["inspect", f"{d}/bundle.json", "--format", "json"], Exit.OK, lambda o, e: "fraud-scorer" in _js(o)["contracts"], json_out=True),
        Case(["inspect", f"{d}/tampered.json"], Exit.FAILED, lambda o, e: "does not match its hash" in e),
        Case(["inspect", "-"], Exit.OK, lambda o, e: "fraud-scorer" in o, stdin=(Path(d) / "bundle.json").read_text()),
        # diff
        Case(["diff", f"{d}/bundle.json", policies], Exit.OK),
        Case(["diff", str(REPO / "policies/versions/v2"), str(REPO / "policies/versions/v1"), "--format", "json"], Exit.DIFFERENT,
             lambda o, e: isinstance(_js(o), dict), json_out=True),
        Case(["diff", f"{d}/bundle.json", policies, "--max", "0"], Exit.USAGE),
        # test
        Case(["test", policies, "--format", "json"], Exit.OK, lambda o, e: _js(o)["ok"] and _js(o)["failed"] == 0, json_out=True),
        Case(["test", f"{d}/broken.contract", "--format", "json"], Exit.FAILED, lambda o, e: _js(o)["diagnostics"], json_out=True),
        Case(["test", "--coverage", "--nonsense"], Exit.USAGE),
        # keygen, embed, validate
        Case(["keygen", f"{d}/k"], Exit.OK, lambda o, e: Path(d, "k.pub").exists()),
        Case(["keygen", f"{d}/no/such/dir/k"], Exit.USAGE),
        Case(["embed", f"{d}/absent.onnx", "--contract", str(REPO / "policies/fraud-scorer.contract"), "--name", "fraud-scorer",
              "-o", f"{d}/o.onnx", "--format", "json"], Exit.FAILED),
        Case(["embed", "m.onnx"], Exit.USAGE),
        Case(["validate", f"{d}/m.contract", "--format", "json"], Exit.FAILED, lambda o, e: _js(o)["ok"] is False, json_out=True),
        Case(["validate", "x.onnx", "--tolerance", "-1"], Exit.USAGE),
        # instance, decide, reload: against the running service
        Case(["instance", "register", "--file", f"{d}/inst.json", *S, "--format", "json"], Exit.OK,
             lambda o, e: _js(o)["registry_size"] == 1, json_out=True),
        Case(["instance", "register", "--file", "-", *S], Exit.OK, lambda o, e: "2 instances" in o, stdin=(Path(d) / "inst2.json").read_text()),
        Case(["instance", "list", *S, "--format", "json"], Exit.OK, lambda o, e: len(_js(o)["instances"]) == 2, json_out=True),
        Case(["instance", "list", *S, "--model", "chatbot"], Exit.OK, lambda o, e: "0 instances" in o),
        Case(["instance", "register", "fs-x", "--model", "fraud-scorer", "--host", "nowhere", "--gpu", "gpu0", "--gpu-model", "L4",
              "--region", "eu-west", *S, "--format", "json"], Exit.REFUSED, lambda o, e: _js(o)["error"]["code"] == "FAILED_PRECONDITION",
             json_out=True),
        Case(["instance", "register", "--model", "fraud-scorer", *S], Exit.USAGE),
        Case(["instance", "deregister", "no-such-instance", *S], Exit.REFUSED, lambda o, e: "NOT_FOUND" in e),
        Case(["instance", "deregister", w["inst2_id"], *S], Exit.OK, lambda o, e: "1 instances" in o),
        Case(["instance", "list", "--server", down, "--timeout", "1"], Exit.UNAVAILABLE),
        Case(["instance"], Exit.USAGE),
        Case(["decide", *S, "--header", "X-Data-Region=us-west", "--header", "X-Tenant=acme-bank", "--format", "json"], Exit.OK,
             lambda o, e: _js(o)["outcome"] == "ADMITTED", json_out=True),
        Case(["decide", *S, "--request-file", "-", "--explain"], Exit.OK, lambda o, e: "admitted: fraud-scorer" in o,
             stdin=json.dumps({"headers": {"X-Data-Region": "us-west", "X-Tenant": "acme-bank"}})),
        Case(["decide", *S, "--header", "X-Data-Region=eu-west"], Exit.NEGATIVE, lambda o, e: o.startswith("REJECTED")),
        Case(["decide", *S, "--header", "X-Tenant=acme-bnak", "--format", "json"], Exit.REFUSED,
             lambda o, e: _js(o)["error"]["code"] == "NOT_FOUND", json_out=True),
        Case(["decide", "--server", down, "--timeout", "1"], Exit.UNAVAILABLE, lambda o, e: "UNAVAILABLE" in e or "DEADLINE" in e),
        Case(["decide", "--server", down, "--timeout", "1", "--format", "json"], Exit.UNAVAILABLE,
             lambda o, e: _js(o)["ok"] is False, json_out=True),
        Case(["decide", *S, "--header", "no-equals"], Exit.USAGE),
        Case(["decide", *S, "--request-file", "-"], Exit.USAGE, stdin="{not json"),
        Case(["reload", f"{d}/bundle.json", *S, "--format", "json"], Exit.OK, lambda o, e: _js(o)["bundle_hash"].startswith("sha256:"),
             json_out=True),
        Case(["reload", f"{d}/tampered.json", *S], Exit.REFUSED, lambda o, e: "INVALID_ARGUMENT" in e),
        Case(["reload", *S], Exit.USAGE),
        Case(["reload", f"{d}/bundle.json", "--server", down, "--timeout", "1"], Exit.UNAVAILABLE),
        # serve (a running one is the fixture; here its refusals), demo (run whole by tests/packaging and the demo's tests)
        Case(["serve", "--bundle", f"{d}/tampered.json"], Exit.USAGE, lambda o, e: "does not match its hash" in e),
        Case(["serve"], Exit.USAGE),
        Case(["serve", "--bundle", "-"], Exit.USAGE, lambda o, e: "<stdin>" in e and "does not match its hash" in e,
             stdin=(Path(d) / "tampered.json").read_text()),
        Case(["demo", "--no-such-flag"], Exit.USAGE),
        # audit
        Case(["audit", "verify", "--log", f"{d}/audit.db", "--format", "json"], Exit.OK, lambda o, e: _js(o)["ok"], json_out=True),
        Case(["audit", "report", "--log", f"{d}/audit.db", "--format", "json"], Exit.OK, lambda o, e: _js(o)["rows"], json_out=True),
        Case(["audit", "report", "--log", f"{d}/audit.db", "--format", "html", "-o", f"{d}/r.html"], Exit.OK,
             lambda o, e: Path(d, "r.html").read_text().startswith("<!DOCTYPE html>")),
        Case(["audit", "explain", "--log", f"{d}/audit.db", "no-such-decision"], Exit.FAILED),
        Case(["audit", "report", "--log", f"{d}/absent.db"], Exit.USAGE),
        Case(["audit", "export", "--log", f"{d}/audit.db", "--format", "csv", "-o", f"{d}/e.csv"], Exit.OK,
             lambda o, e: "exported 44 records" in e),
        Case(["audit", "export", "--log", f"{d}/audit.db", "--from", "yesterday"], Exit.USAGE),
        Case(["audit", "verify", "--log", f"{d}/audit.db", "--record", "dec-000003"], Exit.USAGE, lambda o, e: "--anchor" in e),
        Case(["audit", "rotate", "--log", f"{d}/absent.db"], Exit.USAGE),
        Case(["audit", "verify-report", f"{d}/r.html", "--public-key", f"{d}/absent.pub"], Exit.USAGE),
        Case(["audit"], Exit.USAGE),
        # completion
        Case(["completion", "bash"], Exit.OK, lambda o, e: "complete -F _policyc policyc" in o and "deregister" in o),
        Case(["completion", "zsh"], Exit.OK, lambda o, e: "bashcompinit" in o),
        Case(["completion", "fish"], Exit.USAGE),
    ]


def _run(case: Case, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(case.stdin.encode()), encoding="utf-8"))
    try:
        code = main(case.argv)
    except SystemExit as e:  # argparse's usage errors
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


# commands covered elsewhere by their owners' tests: listed so this table knows of them
COVERED_ELSEWHERE: dict[str, list[str]] = {}


def test_every_command_exit_codes_and_json(world: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    table = cases(world)
    covered = {c.argv[0] for c in table}
    top = {p[0] for p in COMMANDS}
    extra = sorted(top - covered - set(COVERED_ELSEWHERE))
    # commands other issues add (gateway, modelserver, cluster, …): at least their usage error and help
    table += [Case([name, "--no-such-flag-anywhere"], Exit.USAGE) for name in extra]
    failures = []
    for case in table:
        code, out, err = _run(case, monkeypatch, capsys)
        declared = _declared(case.argv)
        problem = None
        if code != case.code:
            problem = f"exit {code}, expected {int(case.code)}"
        elif declared is not None and code not in declared and code != Exit.USAGE:
            problem = f"exit {code} is not among the command's declared codes {sorted(int(c) for c in declared)}"
        elif case.json_out:
            try:
                json.loads(out)
            except ValueError as e:
                problem = f"stdout is not one JSON document ({e})"
        if problem is None and case.check is not None:
            try:
                ok = case.check(out, err)
            except Exception as e:  # noqa: BLE001 - reported with the case
                ok, problem = False, f"check raised {type(e).__name__}: {e}"
            if not ok and problem is None:
                problem = "output check failed"
        if "Traceback" in err:
            problem = "a traceback on stderr"
        if problem:
            failures.append(f"policyc {' '.join(case.argv)}: {problem}\n  stdout: {out[-400:]!r}\n  stderr: {err[-400:]!r}")
    assert not failures, "\n".join(failures)


def _declared(argv: list[str]) -> tuple[int, ...] | None:
    """The exit codes the deepest named (sub)command declares, if it declares any."""
    path: tuple[str, ...] = ()
    for a in argv:
        if (*path, a) in COMMANDS:
            path = (*path, a)
    if not path:
        return None
    codes = COMMANDS[path][0].get_default("exit_codes")
    return tuple(codes) if codes else None
