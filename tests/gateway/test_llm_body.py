"""The picker's reading of an OpenAI-style body: every bad body with its status, code and
reason (table-driven), the model from the body or X-Model, tokens by the model's own
tokenizer (and the declared estimate where none is registered), usage asked for on streams."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from llm_support import make_tokenizer
from tokenizers import Tokenizer

from policyc.gateway.llm_body import BodyError, parse_llm_body, path_kind, upstream_body
from policyc.gateway.tokens import Tokenizers, TokenizerError

MODELS = {"tiny-llm": 64, "no-tokenizer": None, "long-llm": None}


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def toks(tok_path: Path) -> Tokenizers:
    t = Tokenizers()
    t.register("tiny-llm", tok_path.parent)  # a model folder holding tokenizer.json
    return t


def parse(toks: Tokenizers, body: bytes | dict, kind: str = "chat", header: str | None = None):  # type: ignore[no-untyped-def]
    raw = body if isinstance(body, bytes) else msgspec.json.encode(body)
    return parse_llm_body(raw, kind, toks, header, MODELS.__contains__, MODELS.get)


CHAT = {"model": "tiny-llm", "messages": [{"role": "user", "content": "hello"}]}

# (name, body, kind, X-Model, status, code, words in the reason)
BAD = [
    ("not utf-8", b'{"model": "tiny-llm", "x": "\xff"}', "chat", None, 400, "invalid_encoding", "not UTF-8"),
    ("malformed json", b'{"model": "tiny-llm",', "chat", None, 400, "invalid_json", "not JSON"),
    ("empty body", b"", "chat", None, 400, "invalid_json", "empty"),
    ("array body", b"[1, 2]", "chat", None, 400, "invalid_json", "JSON object, got a JSON list"),
    ("string body", b'"hi"', "chat", None, 400, "invalid_json", "JSON object"),
    ("missing model", {"messages": CHAT["messages"]}, "chat", None, 400, "model_not_found", "no model"),
    ("unknown model", {**CHAT, "model": "gpt-9"}, "chat", None, 400, "model_not_found", "unknown model `gpt-9`"),
    ("model not a string", {**CHAT, "model": 7}, "chat", None, 400, "invalid_model", "`model` must be"),
    ("header disagrees", CHAT, "chat", "no-tokenizer", 400, "model_mismatch", "`tiny-llm` and the X-Model header `no-tokenizer`"),
    ("no messages", {"model": "tiny-llm"}, "chat", None, 400, "invalid_request_body", "needs `messages`"),
    ("message not object", {**CHAT, "messages": ["hi"]}, "chat", None, 400, "invalid_request_body", "`messages[0]` must be"),
    ("message no role", {**CHAT, "messages": [{"content": "x"}]}, "chat", None, 400, "invalid_request_body", "role"),
    ("bad content", {**CHAT, "messages": [{"role": "user", "content": 5}]}, "chat", None, 400, "invalid_request_body",
     "content"),
    ("no prompt", {"model": "tiny-llm"}, "completions", None, 400, "invalid_request_body", "needs `prompt`"),
    ("prompt mixed list", {"model": "tiny-llm", "prompt": ["a", 1]}, "completions", None, 400, "invalid_request_body",
     "needs `prompt`"),
    ("max_tokens zero", {**CHAT, "max_tokens": 0}, "chat", None, 400, "invalid_request_body", "`max_tokens` must be"),
    ("max_tokens text", {**CHAT, "max_tokens": "9"}, "chat", None, 400, "invalid_request_body", "`max_tokens` must be"),
    ("max_tokens bool", {**CHAT, "max_tokens": True}, "chat", None, 400, "invalid_request_body", "whole number"),
    ("max tokens disagree", {**CHAT, "max_tokens": 5, "max_completion_tokens": 6}, "chat", None, 400,
     "invalid_request_body", "disagree"),
    ("stream not flag", {**CHAT, "stream": "yes"}, "chat", None, 400, "invalid_request_body", "`stream` must be"),
    ("stream_options not object", {**CHAT, "stream_options": 1}, "chat", None, 400, "invalid_request_body",
     "`stream_options` must be"),
    ("user not string", {**CHAT, "user": 3}, "chat", None, 400, "invalid_request_body", "`user` must be"),
    ("prompt over context", {"model": "tiny-llm", "prompt": "word " * 200}, "completions", None, 400,
     "context_length_exceeded", "over model `tiny-llm`'s context of 64 tokens"),
    ("prompt and max_tokens over context", {"model": "tiny-llm", "prompt": "hi", "max_tokens": 64}, "completions", None,
     400, "context_length_exceeded", "exceed model `tiny-llm`'s context"),
]


@pytest.mark.parametrize(("name", "body", "kind", "header", "status", "code", "words"), BAD, ids=[b[0] for b in BAD])
def test_bad_bodies(toks: Tokenizers, name: str, body: bytes | dict, kind: str, header: str | None, status: int,
                    code: str, words: str) -> None:
    with pytest.raises(BodyError) as e:
        parse(toks, body, kind, header)
    assert e.value.status == status, name
    assert e.value.code == code, (name, e.value.message)
    assert words in e.value.message, (name, e.value.message)
    err = msgspec.json.decode(e.value.json())["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"] == e.value.message
    assert err["type"] == "invalid_request_error" and err["code"] == code


def test_chat_counted_by_the_model_tokenizer(toks: Tokenizers, tok_path: Path) -> None:
    r = parse(toks, {**CHAT, "max_tokens": 7, "stream": True, "user": "u1"})
    raw = Tokenizer.from_file(str(tok_path))
    assert r.prompt.counted and r.model == "tiny-llm"
    assert r.prompt.tokens == len(raw.encode("user\nhello", add_special_tokens=False).ids) + 3 + 3
    assert (r.max_tokens, r.stream, r.user, r.include_usage) == (7, True, "u1", False)


def test_completions_prompt_shapes(toks: Tokenizers, tok_path: Path) -> None:
    raw = Tokenizer.from_file(str(tok_path))
    r = parse(toks, {"model": "tiny-llm", "prompt": ["def f():", "return 1"], "max_completion_tokens": 3}, "completions")
    assert r.prompt.tokens == len(raw.encode("def f():").ids) + len(raw.encode("return 1").ids)
    assert r.max_tokens == 3
    assert parse(toks, {"model": "tiny-llm", "prompt": [1, 2, 3]}, "completions").prompt.tokens == 3
    assert parse(toks, {"model": "tiny-llm", "prompt": [[1, 2], [3]]}, "completions").prompt.tokens == 3


def test_model_from_header_alone_or_agreeing(toks: Tokenizers) -> None:
    body = {"messages": CHAT["messages"]}
    assert parse(toks, body, header="tiny-llm").model == "tiny-llm"
    assert parse(toks, CHAT, header="tiny-llm").model == "tiny-llm"


def test_estimate_without_a_tokenizer_is_labelled(toks: Tokenizers) -> None:
    r = parse(toks, {"model": "no-tokenizer", "prompt": "x" * 40}, "completions")
    assert not r.prompt.counted and r.prompt.tokens == 10 and "estimated" in r.prompt.how


def test_usage_requested_on_streams_only(toks: Tokenizers) -> None:
    assert upstream_body(parse(toks, CHAT)) is None
    streamed = upstream_body(parse(toks, {**CHAT, "stream": True}))
    assert streamed is not None and msgspec.json.decode(streamed)["stream_options"] == {"include_usage": True}
    assert upstream_body(parse(toks, {**CHAT, "stream": True, "stream_options": {"include_usage": True}})) is None
    named = upstream_body(parse(toks, {"messages": CHAT["messages"]}, header="tiny-llm"))
    assert named is not None and msgspec.json.decode(named)["model"] == "tiny-llm"  # the server reads the model from the body


def test_paths_and_bad_tokenizer(tmp_path: Path) -> None:
    assert path_kind("/v1/chat/completions?x=1") == "chat" and path_kind("/v1/completions") == "completions"
    assert path_kind("/v1/models") is None and path_kind("/v2/models/m/infer") is None
    (tmp_path / "tokenizer.json").write_text("{not a tokenizer")
    with pytest.raises(TokenizerError, match="cannot be loaded"):
        Tokenizers().register("m", tmp_path)
    with pytest.raises(TokenizerError, match="No such file"):
        Tokenizers().register("m", tmp_path / "absent")


def test_long_texts_are_counted_once(tok_path: Path) -> None:
    """A long message (a conversation's history, a shared system prompt) is tokenized once;
    its count is the tokenizer's, and a different text is counted anew."""
    toks = Tokenizers()
    toks.register("long-llm", tok_path)
    long = "def f(x):\n    return x + 1\n" * 400
    raw = Tokenizer.from_file(str(tok_path))
    want = len(raw.encode("user\n" + long, add_special_tokens=False).ids) + 6
    body = {"model": "long-llm", "messages": [{"role": "user", "content": long}]}
    first, again = parse(toks, body), parse(toks, body)
    other = parse(toks, {**body, "messages": [{"role": "user", "content": long + "y"}]})
    assert first.prompt.tokens == again.prompt.tokens == want
    assert other.prompt.tokens == len(raw.encode("user\n" + long + "y", add_special_tokens=False).ids) + 6
    assert len(toks._counts) >= 2
