"""One chat request: its body on the wire and its key in the response cache.

The cache is persistent and keyed by the full request (model, messages, response_format,
temperature, max_tokens), so re-indexing unchanged text costs no calls."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["COMPACT", "ChatRequest", "ResponseCache"]

# Separators of every JSON text that goes into a cache key or a request body.
COMPACT = (",", ":")


class ResponseCache(Protocol):
    """What the client needs from a cache; `canopy.store.Store` is one."""

    def cache_get(self, key: str) -> str | None: ...

    def cache_put(self, key: str, response: str) -> None: ...


@dataclass
class ChatRequest:
    """One chat request. Its messages are serialized once, for both the cache key and the body."""

    model: str
    messages: list[dict]
    temperature: float
    fmt_json: str | None = None  # response_format, already JSON (canonical: sorted keys)
    max_tokens: int | None = None
    _messages_json: str | None = field(default=None, repr=False)

    def with_messages(self, messages: list[dict]) -> ChatRequest:
        return ChatRequest(self.model, messages, self.temperature, self.fmt_json, self.max_tokens)

    def _messages(self) -> str:
        if self._messages_json is None:
            self._messages_json = json.dumps(
                self.messages, sort_keys=True, ensure_ascii=False, separators=COMPACT
            )
        return self._messages_json

    def key(self) -> str:
        """The response-cache key: sha256 of json.dumps({model, messages, response_format,
        temperature, max_tokens}, sort_keys=True, compact), byte for byte the key earlier
        versions wrote (so existing caches stay valid), assembled from the parts."""
        blob = "".join((
            '{"max_tokens":', json.dumps(self.max_tokens),
            ',"messages":', self._messages(),
            ',"model":', json.dumps(self.model, ensure_ascii=False),
            ',"response_format":', self.fmt_json if self.fmt_json is not None else "null",
            ',"temperature":', json.dumps(self.temperature),
            "}",
        ))
        return "chat:" + hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def body(self) -> bytes:
        parts = [
            '{"model":', json.dumps(self.model, ensure_ascii=False),
            ',"messages":', self._messages(),
            ',"temperature":', json.dumps(self.temperature),
        ]
        if self.fmt_json is not None:
            parts += [',"response_format":', self.fmt_json]
        if self.max_tokens is not None:
            parts += [',"max_tokens":', json.dumps(self.max_tokens)]
        parts.append("}")
        return "".join(parts).encode("utf-8")
