"""The endpoint shapes docs/providers.md documents, checked against the fake endpoint: a base URL
with a path of its own (Azure OpenAI's v1 API), the key sent as a bearer token, deployment
names as models, and chat and embeddings at the same base."""

from __future__ import annotations

import shutil
from pathlib import Path

from canopy.server.runtime import build_index, open_workspace
from tests.conftest import EXAMPLES
from tests.fakes.openai_server import FakeOpenAI


def test_an_azure_v1_shaped_endpoint_gets_the_key_as_a_bearer_token_at_its_own_path(
        tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES / "suppliers", docs)
    with FakeOpenAI() as fake:
        fake.api_key = "azure-resource-key"  # anything else is answered 401
        fake.models = {"my-gpt-4o-mini", "my-embedding-deployment"}  # deployment names
        base = f"http://127.0.0.1:{fake.port}/openai/v1/"  # https://RESOURCE.openai.azure.com/...
        ws = open_workspace(
            docs, index_dir=tmp_path / "idx",
            llm={"base_url": base, "model": "my-gpt-4o-mini", "api_key": "azure-resource-key",
                 "max_retries": 0},
            embed={"base_url": base, "model": "my-embedding-deployment",
                   "api_key": "azure-resource-key"})
        result = build_index(ws)
    assert result.stats["units_failed"] == 0 and result.stats["reports"] > 0
    paths = {r.path for r in fake.requests}
    assert paths == {"/openai/v1/chat/completions", "/openai/v1/embeddings"}
    assert all(r.status == 200 for r in fake.requests)
    for r in fake.requests:  # what Azure's v1 API takes from the OpenAI client (its docs)
        assert r.headers["authorization"] == "Bearer azure-resource-key"
        assert "api-key" not in r.headers
    assert {r.body["model"] for r in fake.requests} == fake.models
