"""Pytest fixtures for the fake endpoint. Enable them suite-wide from tests/conftest.py with
`pytest_plugins = ["tests.fakes.fixtures"]`, or import them into a test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.openai_server import FakeOpenAI


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    """A fresh fake OpenAI-compatible server on 127.0.0.1; `.base_url` ends in /v1."""
    with FakeOpenAI() as server:
        yield server
