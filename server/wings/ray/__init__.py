"""The Ray wing: distributed indexing on a Ray cluster, the writer's option (`canopy index --ray
ADDRESS`). Its extra, [ray], brings Ray; the core reaches it through canopy.server.wings, and the
provider factory knows it only as a `canopy.providers.fanout.Fanout`.

What runs where (docs/deployment.md):
- **the writer** (the process that runs `canopy index`): the planner, the store, every write,
  the generations and locks, as without Ray; and around every LLM or embedding request, the
  response cache, the one AIMD window of requests in flight, retries and Retry-After pauses,
  structured-output parsing and the usage accounting (`canopy.llm.ChatClient`,
  `canopy.providers.embed.OpenAIEmbedder`, unchanged);
- **the cluster**: the requests themselves (`remote_endpoint`: actors holding the endpoint's
  connection pools), and with the builtin provider its CPU work, extraction and embedding, in
  batches (`builtin_work`).

Results equal a local build's: the same requests through the same window, deterministic work
returned in input order, and workers checked to run the writer's code (`cluster`).

Nothing here is imported by the servers (`canopy serve`, the stdio MCP server): Ray is imported
only once a writer calls `connect_ray`.
"""

from canopy.server.wings.ray.cluster import RayExecutor, RayStats, connect_ray

__all__ = ["RayExecutor", "RayStats", "connect_ray"]
