"""The language server driven as an editor drives it: `policyc lsp` in a subprocess, a
JSON-RPC client on its stdin/stdout (Content-Length framing): initialize, didOpen →
publishDiagnostics with the compiler's errors, didChange → the fix clears them, hover,
completion, definition across files, formatting."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import queue
from pathlib import Path
from typing import Any

import pytest

from policy_text import REPO


class Client:
    def __init__(self, cwd: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "policyc.cli.main", "lsp"], cwd=cwd, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ})
        self.inbox: queue.Queue[dict[str, Any]] = queue.Queue()
        self.next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        out = self.proc.stdout
        assert out is not None
        while True:
            length = None
            while True:
                line = out.readline()
                if not line:
                    return
                if line in (b"\r\n", b"\n"):
                    break
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            assert length is not None
            self.inbox.put(json.loads(out.read(length)))

    def send(self, msg: dict[str, Any]) -> None:
        body = json.dumps({"jsonrpc": "2.0", **msg}).encode()
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.proc.stdin.flush()

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self.send({"method": method, "params": params})

    def request(self, method: str, params: dict[str, Any]) -> Any:
        self.next_id += 1
        rid = self.next_id
        self.send({"id": rid, "method": method, "params": params})
        while True:
            msg = self.inbox.get(timeout=60)
            if msg.get("id") == rid and "method" not in msg:
                assert "error" not in msg, msg
                return msg.get("result")
            self.pending.append(msg)

    pending: list[dict[str, Any]] = []

    def diagnostics(self, uri: str) -> list[dict[str, Any]]:
        for i, msg in enumerate(self.pending):
            if msg.get("method") == "textDocument/publishDiagnostics" and msg["params"]["uri"] == uri:
                del self.pending[i]
                return msg["params"]["diagnostics"]
        while True:
            msg = self.inbox.get(timeout=60)
            if msg.get("method") == "textDocument/publishDiagnostics" and msg["params"]["uri"] == uri:
                return msg["params"]["diagnostics"]
            self.pending.append(msg)

    def close(self) -> int:
        try:
            self.request("shutdown", {})
            self.notify("exit", {})
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for name in ("fraud-scorer.contract", "gpu-catalog.contract", "requests.contract", "routing.contract", "breakers.contract",
                 "recommender.contract", "clinical-notes.contract", "chatbot.contract"):
        shutil.copy(REPO / "policies" / name, tmp_path / name)
    return tmp_path


def test_an_editor_session_over_stdio(project: Path) -> None:
    c = Client(project)
    try:
        init = c.request("initialize", {"processId": None, "rootUri": project.as_uri(), "capabilities": {}})
        caps = init["capabilities"]
        assert caps["hoverProvider"] and caps["definitionProvider"] and caps["documentFormattingProvider"]
        assert "completionProvider" in caps
        c.notify("initialized", {})

        path = project / "fraud-scorer.contract"
        uri = path.as_uri()
        good = path.read_text(encoding="utf-8")
        bad = good.replace("burst: <= 200 ms", "burst: <= 200 sec", 1).replace("bandwidth: >=", "bandwith: >=", 1)
        assert bad != good
        c.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "policyc", "version": 1, "text": bad}})
        diags = c.diagnostics(uri)
        codes = {d["code"] for d in diags}
        assert {"E109", "E201"} <= codes, diags
        unit = next(d for d in diags if d["code"] == "E109")
        line = bad.split("\n")[unit["range"]["start"]["line"]]
        assert line[unit["range"]["start"]["character"]:unit["range"]["end"]["character"]] == "sec"
        assert "did you mean `s`?" in unit["message"]

        c.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 2}, "contentChanges": [{"text": good}]})
        assert c.diagnostics(uri) == []

        lines = good.split("\n")
        at = next(i for i, l in enumerate(lines) if "burst:" in l)
        hover = c.request("textDocument/hover", {"textDocument": {"uri": uri},
                                                 "position": {"line": at, "character": lines[at].index("burst") + 2}})
        assert "burst" in hover["contents"]["value"] and "time" in hover["contents"]["value"]

        after_number = lines[at].index("200") + 4
        units = c.request("textDocument/completion", {"textDocument": {"uri": uri}, "position": {"line": at, "character": after_number}})
        labels = {i["label"] for i in (units["items"] if isinstance(units, dict) else units)}
        assert {"ms", "s", "GB/s", "%"} <= labels
        fields = c.request("textDocument/completion", {"textDocument": {"uri": uri}, "position": {"line": at, "character": 4}})
        assert {"burst", "bandwidth", "latency"} <= {i["label"] for i in (fields["items"] if isinstance(fields, dict) else fields)}

        breakers = project / "breakers.contract"
        btext = breakers.read_text(encoding="utf-8")
        c.notify("textDocument/didOpen", {"textDocument": {"uri": breakers.as_uri(), "languageId": "policyc", "version": 1,
                                                           "text": btext}})
        assert c.diagnostics(breakers.as_uri()) == []
        blines = btext.split("\n")
        bl = next(i for i, l in enumerate(blines) if "backup: fraud-scorer-lite" in l)
        where = c.request("textDocument/definition", {"textDocument": {"uri": breakers.as_uri()},
                                                      "position": {"line": bl, "character": blines[bl].index("fraud-scorer-lite") + 3}})
        assert where["uri"] == path.resolve().as_uri()
        assert "contract fraud-scorer-lite" in lines[where["range"]["start"]["line"]]

        messy = good.replace("  memory {", "  memory    {", 1)
        c.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 3}, "contentChanges": [{"text": messy}]})
        c.diagnostics(uri)
        edits = c.request("textDocument/formatting", {"textDocument": {"uri": uri}, "options": {"tabSize": 2, "insertSpaces": True}})
        assert len(edits) == 1 and edits[0]["newText"] == good
        assert c.close() == 0
    finally:
        if c.proc.poll() is None:
            c.proc.kill()
            c.proc.wait()
