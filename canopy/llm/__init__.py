"""The LLM client and what it is made of (design §7).

- `client`: `ChatClient`, the one client for OpenAI-compatible chat endpoints;
- `retries`: the retry policy shared with the embedding client (`call_with_retries`);
- `structured`: JSON schemas for pydantic models and tolerant parsing of model answers;
- `request`: a chat request's wire body and response-cache key, and the cache protocol;
- `accounting`: usage totals per task;
- `loops`: objects (HTTP sessions) that belong to one event loop.
"""

from canopy.llm.accounting import UsageCounter
from canopy.llm.client import ChatClient
from canopy.llm.loops import PerLoop
from canopy.llm.request import ResponseCache
from canopy.llm.retries import RetryPolicy, call_with_retries, note_failure, retry_after
from canopy.llm.structured import json_schema_for, parse_json

__all__ = [
    "ChatClient",
    "PerLoop",
    "ResponseCache",
    "RetryPolicy",
    "UsageCounter",
    "call_with_retries",
    "json_schema_for",
    "note_failure",
    "parse_json",
    "retry_after",
]
