"""The language server over stdio (pygls): wires `analysis` to the protocol's requests.

Diagnostics are published on open, change and save (the whole folder is recompiled in
milliseconds for a project of a few files; a syntax error in the buffer is reported where
it stands and the rest waits, as `policyc check` does).
"""

from __future__ import annotations

from pathlib import Path

from lsprotocol import types as T
from pygls.lsp.server import LanguageServer

from policyc import __version__
from policyc.compiler.diagnostic import Diagnostic

from . import analysis

server = LanguageServer("policyc", __version__)

_KINDS = {"unit": T.CompletionItemKind.Unit, "field": T.CompletionItemKind.Field, "name": T.CompletionItemKind.Reference}


def _path(ls: LanguageServer, uri: str) -> tuple[Path, str]:
    doc = ls.workspace.get_text_document(uri)
    return Path(doc.path), doc.source


def _lsp_diagnostic(d: Diagnostic) -> T.Diagnostic:
    s = d.span
    assert s is not None
    start = T.Position(line=max(s.line - 1, 0), character=max(s.col - 1, 0))
    end = T.Position(line=max(s.end_line - 1, 0), character=max(s.end_col - 1, 0))
    if (end.line, end.character) <= (start.line, start.character):
        end = T.Position(line=start.line, character=start.character + 1)
    message = d.message + (f"\n{d.help}" if d.help else "")
    return T.Diagnostic(range=T.Range(start=start, end=end), message=message, code=d.code, source="policyc",
                        severity=T.DiagnosticSeverity.Error if d.is_error else T.DiagnosticSeverity.Warning)


def publish(ls: LanguageServer, uri: str) -> None:
    path, text = _path(ls, uri)
    try:
        found = [_lsp_diagnostic(d) for d in analysis.diagnostics(path, text)]
    except Exception as e:  # noqa: BLE001 - a compiler bug must not take the editor's server down: say it instead
        found = [T.Diagnostic(range=T.Range(start=T.Position(line=0, character=0), end=T.Position(line=0, character=1)),
                              message=f"policyc could not check this file ({type(e).__name__}: {e})", source="policyc",
                              severity=T.DiagnosticSeverity.Error)]
    ls.text_document_publish_diagnostics(T.PublishDiagnosticsParams(uri=uri, diagnostics=found))


@server.feature(T.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: LanguageServer, params: T.DidOpenTextDocumentParams) -> None:
    publish(ls, params.text_document.uri)


@server.feature(T.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: LanguageServer, params: T.DidChangeTextDocumentParams) -> None:
    publish(ls, params.text_document.uri)


@server.feature(T.TEXT_DOCUMENT_DID_SAVE)
def did_save(ls: LanguageServer, params: T.DidSaveTextDocumentParams) -> None:
    publish(ls, params.text_document.uri)


@server.feature(T.TEXT_DOCUMENT_HOVER)
def hover(ls: LanguageServer, params: T.HoverParams) -> T.Hover | None:
    _, text = _path(ls, params.text_document.uri)
    md = analysis.hover(text, params.position.line, params.position.character)
    return T.Hover(contents=T.MarkupContent(kind=T.MarkupKind.Markdown, value=md)) if md else None


@server.feature(T.TEXT_DOCUMENT_COMPLETION, T.CompletionOptions(trigger_characters=[" ", "{"]))
def completion(ls: LanguageServer, params: T.CompletionParams) -> T.CompletionList:
    _, text = _path(ls, params.text_document.uri)
    items = [T.CompletionItem(label=label, kind=_KINDS[kind], detail=kind)
             for label, kind in analysis.completions(text, params.position.line, params.position.character)]
    return T.CompletionList(is_incomplete=False, items=items)


@server.feature(T.TEXT_DOCUMENT_DEFINITION)
def definition(ls: LanguageServer, params: T.DefinitionParams) -> T.Location | None:
    path, text = _path(ls, params.text_document.uri)
    at = analysis.definition(path, text, params.position.line, params.position.character)
    if at is None:
        return None
    pos = T.Position(line=at.line, character=at.col)
    return T.Location(uri=at.path.resolve().as_uri(), range=T.Range(start=pos, end=pos))


@server.feature(T.TEXT_DOCUMENT_FORMATTING)
def formatting(ls: LanguageServer, params: T.DocumentFormattingParams) -> list[T.TextEdit] | None:
    path, text = _path(ls, params.text_document.uri)
    new = analysis.formatted(path, text)
    if new is None or new == text:
        return [] if new == text else None
    lines = text.split("\n")
    end = T.Position(line=len(lines), character=0)
    return [T.TextEdit(range=T.Range(start=T.Position(line=0, character=0), end=end), new_text=new)]


def main() -> None:
    server.start_io()
