"""Client CPU per LLM request, layer by layer, against the fake endpoint at zero latency.

    python benchmarks/client_overhead.py                  # 640 requests per layer, 3 rounds
    python benchmarks/client_overhead.py --requests 320 --rounds 2

Against a fast endpoint an index build's time is the client's own work per request (A Christmas
Carol: 641 requests). This separates it into the layers a chat request goes through, each
sending the same 640 summary-sized requests (a ~1,000-token prompt) with 8 in flight to the test
suite's fake OpenAI-compatible server, hosted in its own process so its CPU is not counted:

- `httpx2`: the HTTP library alone (`httpx2.AsyncClient.post` of pre-encoded JSON);
- `endpoint`: `canopy.endpoint.JsonEndpoint`, the `openai` SDK's raw `post` over that library
  (the transport Canopy uses: base URL, key, proxies are the SDK's);
- `chat`: `canopy.llm.ChatClient.text`, which adds request building, the adaptive limiter,
  retries, reply parsing and usage accounting (no response cache here: every request is sent).

It also times the imports each layer needs in fresh interpreters (`openai` on top of what the
index run imports anyway). Output: CPU milliseconds per request for each layer and round, the
differences between layers, and the import CPU; JSON in benchmarks/results/client_overhead.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from index_bench import REPO, RESULTS, machine, zero_latency_fake

PROMPT = [{"role": "system", "content": "Task: summarize\n" + "word " * 800},
          {"role": "user", "content": "entity description " * 60}]
IN_FLIGHT = 8


async def _send_all(n: int, send: Callable[[int], Awaitable[Any]]) -> None:
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(i: int) -> None:
        async with gate:
            await send(i)

    await asyncio.gather(*(one(i) for i in range(n)))


def _cpu_ms_per_request(n: int, run: Callable[[], Awaitable[None]]) -> float:
    c0 = time.process_time()
    asyncio.run(run())
    return 1000 * (time.process_time() - c0) / n


def layers(base_url: str, n: int) -> dict[str, float]:
    import httpx2

    from canopy.endpoint import JsonEndpoint
    from canopy.llm import ChatClient
    from canopy.settings import LLMSettings

    body = json.dumps({"model": "fake", "messages": PROMPT}).encode()
    headers = {"Content-Type": "application/json", "Authorization": "Bearer x"}

    async def raw() -> None:
        async with httpx2.AsyncClient(base_url=base_url,
                                      limits=httpx2.Limits(max_connections=IN_FLIGHT)) as c:
            await _send_all(n, lambda i: c.post("/chat/completions", content=body,
                                                headers=headers))

    async def endpoint() -> None:
        e = JsonEndpoint(base_url, "x", timeout_s=60, connections=IN_FLIGHT)
        await _send_all(n, lambda i: e.post("/chat/completions", body))
        await e.close()

    client = ChatClient(LLMSettings(base_url=base_url, concurrency=IN_FLIGHT, adaptive=False))

    async def chat() -> None:
        await _send_all(n, lambda i: client.text(
            "summarize", [PROMPT[0], {"role": "user", "content": f"{i} {PROMPT[1]['content']}"}]))
        await client.aclose()

    return {"httpx2": _cpu_ms_per_request(n, raw), "endpoint": _cpu_ms_per_request(n, endpoint),
            "chat": _cpu_ms_per_request(n, chat)}


def import_cpu_s() -> dict[str, float]:
    """CPU of `import openai` in a fresh interpreter that has already imported what an index
    run imports before it (pydantic, numpy, the HTTP library, canopy.server.runtime)."""
    code = ("import time, pydantic, numpy, httpx2, anyio, canopy.server.runtime\n"
            "c = time.process_time(); import openai\n"
            "print(time.process_time() - c)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True)
    return {"openai": round(float(out.stdout.strip()), 3)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=640)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    host = zero_latency_fake()
    try:
        rounds = []
        for r in range(args.rounds):
            rounds.append(layers(host.base_url, args.requests))
            host.call("reset")
            print(f"[client_overhead] round {r + 1}: "
                  + ", ".join(f"{k} {v:.2f} ms" for k, v in rounds[-1].items()), file=sys.stderr)
    finally:
        host.stop()
    imports = [import_cpu_s()["openai"] for _ in range(args.rounds)]
    load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "-"
    med = {k: sorted(r[k] for r in rounds)[len(rounds) // 2] for k in rounds[0]}
    print(f"## Client CPU per request ({args.requests} requests x {args.rounds} rounds, "
          f"{IN_FLIGHT} in flight, load {load})\n")
    print("| layer | CPU ms/request by round | median |")
    print("|---|---|---|")
    for k in med:
        print(f"| {k} | {' / '.join(f'{r[k]:.2f}' for r in rounds)} | {med[k]:.2f} |")
    print(f"\nopenai SDK layer (endpoint - httpx2): {med['endpoint'] - med['httpx2']:.2f} ms; "
          f"ChatClient's own work (chat - endpoint): {med['chat'] - med['endpoint']:.2f} ms; "
          f"import openai: {' / '.join(f'{s:.2f}' for s in imports)} s CPU")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "client_overhead.json").write_text(json.dumps(
        {"machine": machine(), "rounds": rounds, "median_ms": med, "import_openai_cpu_s": imports,
         "requests": args.requests}, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
