"""An OpenAI-style request body, read strictly and within bounds, for the picker.

`POST /v1/chat/completions` and `/v1/completions` name their model in the JSON body, and the
body's prompt sets the request's cost. Envoy hands the picker the whole body (buffered, at
most the bootstrap's `LlmLimits.max_body_bytes`: beyond, Envoy itself answers 413; a body
slower than `LlmLimits.body_timeout_ms`, 408). This module turns those bytes into an
`LlmRequest` (the model, the prompt's tokens by the model's tokenizer, `max_tokens`,
`stream`, `user`) or a `BodyError`: 400 (or 413) with the reason, which the picker answers
as `x-policyc-reason` and an OpenAI-style error object, never a 503.

Every check, in order: UTF-8, JSON, an object, the model (a string; `X-Model` may give it
instead, and when both are given they must agree; one the bundle has a contract for), the
prompt (`messages` for chat, `prompt` for completions, each of the shapes the API allows),
the numbers (`max_tokens` / `max_completion_tokens`: whole numbers from 1, the two equal
when both are given), `stream` and `stream_options.include_usage` (flags), `user` (a string),
then the prompt's tokens against the model's context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import msgspec

from .tokens import TokenCount, Tokenizers

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
MODELS_PATH = "/v1/models"
LLM_BODY_PATHS = {CHAT_PATH: "chat", COMPLETIONS_PATH: "completions"}
MAX_MODEL_CHARS = 256
MAX_USER_CHARS = 256
MAX_MESSAGES = 4096
MAX_TOKENS_LIMIT = 1 << 24  # a `max_tokens` beyond 16 M is a typo or an attack on an integer column


@dataclass(frozen=True, slots=True)
class BodyError(Exception):
    """Why a body is refused: the HTTP status, the OpenAI error object's fields."""

    status: int
    message: str
    param: str | None = None
    code: str = "invalid_request_body"
    type: str = "invalid_request_error"

    def __str__(self) -> str:
        return self.message

    def json(self) -> bytes:
        """The OpenAI-style error object the clients parse (`openai.BadRequestError` etc.)."""
        return msgspec.json.encode({"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}})


@dataclass(frozen=True, slots=True)
class LlmRequest:
    kind: str  # "chat" or "completions"
    model: str
    prompt: TokenCount
    max_tokens: int | None  # None: the client left it to the server
    stream: bool
    user: str | None
    include_usage: bool  # the client asked for usage on its stream itself
    body: dict[str, Any]  # the parsed body (the picker may add `stream_options.include_usage`)
    ttft_s: float | None = None  # the request's own token SLOs (`x-slo-ttft-ms`, `x-slo-tpot-ms`), seconds
    tpot_s: float | None = None


def path_kind(path: str) -> str | None:
    """`chat` or `completions` for the LLM paths whose body the picker reads (query ignored)."""
    return LLM_BODY_PATHS.get(path.partition("?")[0])


def _bad(message: str, param: str | None = None, code: str = "invalid_request_body", status: int = 400) -> BodyError:
    return BodyError(status, message, param, code)


def _shown(text: str, limit: int = 64) -> str:
    out = ascii(text[:limit])[1:-1]
    return out + ("..." if len(text) > limit else "")


def _whole(body: dict[str, Any], key: str) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_TOKENS_LIMIT:
        raise _bad(f"`{key}` must be a whole number from 1 to {MAX_TOKENS_LIMIT}, got {_shown(repr(v))}", key)
    return v


def _flag(obj: dict[str, Any], key: str, where: str) -> bool:
    v = obj.get(key, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise _bad(f"`{where}` must be true or false, got {_shown(repr(v))}", where)
    return v


def _content_text(content: Any, i: int) -> str:
    """A message's text: a string, or a list of parts whose text parts are joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise _bad(f"`messages[{i}].content[{j}]` must be an object with a `type`", f"messages[{i}].content")
            if part["type"] == "text":
                t = part.get("text")
                if not isinstance(t, str):
                    raise _bad(f"`messages[{i}].content[{j}].text` must be a string", f"messages[{i}].content")
                texts.append(t)
        return "\n".join(texts)
    raise _bad(f"`messages[{i}].content` must be a string or a list of parts", f"messages[{i}].content")


def _messages(body: dict[str, Any]) -> list[tuple[str, str]]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise _bad("a chat request needs `messages`: a non-empty list of {role, content}", "messages")
    if len(msgs) > MAX_MESSAGES:
        raise _bad(f"`messages` holds {len(msgs)} messages, at most {MAX_MESSAGES}", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise _bad(f"`messages[{i}]` must be an object with `role` and `content`", f"messages[{i}]")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise _bad(f"`messages[{i}].role` must be a non-empty string", f"messages[{i}].role")
        out.append((role, _content_text(m.get("content"), i)))
    return out


def _prompt(body: dict[str, Any]) -> list[str] | int:
    """A completion prompt: its strings, or the number of token ids it gives directly."""
    p = body.get("prompt")
    if isinstance(p, str):
        return [p]
    if isinstance(p, list) and p:
        if all(isinstance(x, str) for x in p):
            return list(p)
        if all(isinstance(x, int) and not isinstance(x, bool) for x in p):
            return len(p)
        if all(isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x) for x in p):
            return sum(len(x) for x in p)
    raise _bad("a completions request needs `prompt`: a string, a list of strings, or token ids", "prompt")


def parse_llm_body(raw: bytes, kind: str, tokenizers: Tokenizers, header_model: str | None,
                   known_model: Callable[[str], bool], context_of: Callable[[str], int | None]) -> LlmRequest:
    """The request in `raw` (a whole body, already bounded by Envoy), or BodyError."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _bad(f"the body is not UTF-8: byte 0x{raw[e.start]:02x} at offset {e.start}", None, "invalid_encoding") from None
    try:
        body = msgspec.json.decode(raw) if raw else None
    except (msgspec.DecodeError, RecursionError) as e:  # msgspec has no depth limit of its own: Python's stack is it
        raise _bad(f"the body is not JSON: {e if not isinstance(e, RecursionError) else 'nested too deeply'}", None, "invalid_json") from None
    if not isinstance(body, dict):
        what = "empty" if not raw else f"a JSON {type(body).__name__ if body is not None else 'null'}"
        raise _bad(f"the body must be a JSON object, got {what}", None, "invalid_json")
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not model or len(model) > MAX_MODEL_CHARS):
        raise _bad(f"`model` must be a model's name (a string of 1 to {MAX_MODEL_CHARS} characters), got {_shown(repr(model))}",
                   "model", "invalid_model")
    if header_model is not None and model is not None and header_model != model:
        raise _bad(f"the body names model `{_shown(model)}` and the X-Model header `{_shown(header_model)}`: "
                   "send one, or the same in both", "model", "model_mismatch")
    name = model if model is not None else header_model
    if name is None:
        raise _bad("no model: name it in the body's `model` (or the X-Model header)", "model", "model_not_found")
    if not known_model(name):
        raise _bad(f"unknown model `{_shown(name)}`: no contract of this policy serves it", "model", "model_not_found")
    context = context_of(name)
    if context is not None and (least := tokenizers.at_least(name, len(raw))) > context:
        # bounded work: a body this long holds more tokens than the context whatever its text
        raise _bad(f"the prompt is at least {least} tokens ({len(raw)} bytes), over model `{name}`'s context of "
                   f"{context} tokens", "messages" if kind == "chat" else "prompt", "context_length_exceeded")
    if kind == "chat":
        msgs = _messages(body)
        count = tokenizers.count_chat(name, msgs)
    else:
        prompt = _prompt(body)
        count = TokenCount(prompt, True, "token ids given") if isinstance(prompt, int) else tokenizers.count_text(name, prompt)
    mt, mct = _whole(body, "max_tokens"), _whole(body, "max_completion_tokens")
    if mt is not None and mct is not None and mt != mct:
        raise _bad(f"`max_tokens` ({mt}) and `max_completion_tokens` ({mct}) disagree: send one", "max_completion_tokens")
    max_tokens = mct if mct is not None else mt
    stream = _flag(body, "stream", "stream")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise _bad("`stream_options` must be an object", "stream_options")
    include_usage = _flag(opts, "include_usage", "stream_options.include_usage") if opts else False
    user = body.get("user")
    if user is not None and (not isinstance(user, str) or len(user) > MAX_USER_CHARS):
        raise _bad(f"`user` must be a string of at most {MAX_USER_CHARS} characters", "user")
    if context is not None:
        how = "" if count.counted else f" ({count.how})"
        if count.tokens > context:
            raise _bad(f"the prompt is {count.tokens} tokens{how}, over model `{name}`'s context of {context} tokens",
                       "messages" if kind == "chat" else "prompt", "context_length_exceeded")
        if max_tokens is not None and count.tokens + max_tokens > context:
            raise _bad(f"the prompt's {count.tokens} tokens{how} and `max_tokens` {max_tokens} exceed model `{name}`'s "
                       f"context of {context} tokens", "max_tokens", "context_length_exceeded")
    return LlmRequest(kind, name, count, max_tokens, stream, user, include_usage, body)


def upstream_body(req: LlmRequest) -> bytes | None:
    """The body to send upstream when it must differ from the client's, else None (the body
    goes as sent): the model named when only `X-Model` gave it (the server reads it from the
    body), and usage asked for on a stream whose client did not (`stream_options.include_usage`:
    the audit's token counts come from it)."""
    add_model = "model" not in req.body
    add_usage = req.stream and not req.include_usage
    if not add_model and not add_usage:
        return None
    body = dict(req.body)
    if add_model:
        body["model"] = req.model
    if add_usage:
        opts = dict(body.get("stream_options") or {})
        opts["include_usage"] = True
        body["stream_options"] = opts
    return msgspec.json.encode(body)
