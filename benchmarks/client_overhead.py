"""Client CPU per LLM request, layer by layer, against the fake endpoint at zero latency.

    python benchmarks/client_overhead.py                  # 640 requests per layer, 3 rounds
    python benchmarks/client_overhead.py --requests 320 --rounds 2

Against a fast endpoint an index build's time is the client's own work per request (A Christmas
Carol: 641 requests). This separates it into the layers a chat request goes through, each
sending the same 640 summary-sized requests (a ~1,000-token prompt) with 8 in flight to the test
suite's fake OpenAI-compatible server, hosted in its own process so its CPU is not counted:

- `httpx2` and `aiohttp`: each HTTP library alone (a POST of pre-encoded JSON; the SDK's HTTP
  client runs on one or the other);
- `sdk-post/httpx2`, `sdk-post/aiohttp`: the `openai` SDK's raw `post` (`AsyncOpenAI.post`,
  `cast_to=httpx2.Response`) on each library; the first is how `JsonEndpoint` sent before it
  reused the SDK's request, the second the SDK's aiohttp client used as it comes;
- `endpoint/httpx2`, `endpoint/aiohttp`: `canopy.endpoint.JsonEndpoint`, the SDK's request built
  once per path and sent by the SDK's HTTP client on each library (aiohttp is the default when
  the SDK's extra is installed);
- `chat`: `canopy.llm.ChatClient.text` on the default endpoint, which adds request building,
  the adaptive limiter, retries, reply parsing and usage accounting (no response cache here:
  every request is sent).

It also times `import openai` in fresh interpreters (on top of what the index run imports
anyway), with the aiohttp extra installed and with it hidden, since the SDK imports aiohttp
whenever it is there. Output: CPU milliseconds per request for each layer and round, the
differences between layers, and the import CPU; JSON in benchmarks/results/client_overhead.json.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
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
    import openai

    from canopy.endpoint import JsonEndpoint, Transport, transport_name
    from canopy.llm import ChatClient
    from canopy.settings import LLMSettings

    body = json.dumps({"model": "fake", "messages": PROMPT}).encode()
    headers = {"Content-Type": "application/json", "Authorization": "Bearer x"}
    limits = httpx2.Limits(max_connections=IN_FLIGHT, max_keepalive_connections=IN_FLIGHT)

    async def raw_httpx2() -> None:
        async with httpx2.AsyncClient(base_url=base_url, limits=limits) as c:
            await _send_all(n, lambda i: c.post("/chat/completions", content=body,
                                                headers=headers))

    async def raw_aiohttp() -> None:
        import aiohttp

        url = base_url + "/chat/completions"
        async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=IN_FLIGHT)) as session:
            async def one(i: int) -> None:
                async with session.post(url, data=body, headers=headers) as r:
                    await r.read()

            await _send_all(n, one)

    def sdk_post(transport: str) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            http = (openai.DefaultAioHttpClient if transport == "aiohttp"
                    else openai.DefaultAsyncHttpxClient)(limits=limits, timeout=60)
            client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0,
                                        timeout=60, http_client=http)
            json_headers = {"headers": {"Content-Type": "application/json",
                                        "Accept": "application/json"}}
            await _send_all(n, lambda i: client.post(
                "/chat/completions", cast_to=httpx2.Response, content=body,
                options=json_headers))  # type: ignore[arg-type]
            await client.close()
        return run

    def endpoint(transport: Transport) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            e = JsonEndpoint(base_url, "x", timeout_s=60, connections=IN_FLIGHT,
                             transport=transport)
            await _send_all(n, lambda i: e.post("/chat/completions", body))
            await e.close()
        return run

    client = ChatClient(LLMSettings(base_url=base_url, concurrency=IN_FLIGHT, adaptive=False))

    async def chat() -> None:
        await _send_all(n, lambda i: client.text(
            "summarize", [PROMPT[0], {"role": "user", "content": f"{i} {PROMPT[1]['content']}"}]))
        await client.aclose()

    runs: dict[str, Callable[[], Awaitable[None]]] = {"httpx2": raw_httpx2}
    aio = transport_name() == "aiohttp"
    if aio:
        runs["aiohttp"] = raw_aiohttp
    runs["sdk-post/httpx2"] = sdk_post("httpx2")
    if aio:
        runs["sdk-post/aiohttp"] = sdk_post("aiohttp")
    runs["endpoint/httpx2"] = endpoint("httpx2")
    if aio:
        runs["endpoint/aiohttp"] = endpoint("aiohttp")
    runs["chat"] = chat
    return {k: _cpu_ms_per_request(n, run) for k, run in runs.items()}


# Hides aiohttp from the import system, so `import openai` runs as without the SDK's extra.
_HIDE_AIOHTTP = """
import sys
class _Hide:
    def find_spec(self, name, path=None, target=None):
        if name == "aiohttp" or name.startswith("aiohttp."):
            raise ImportError(name)
sys.meta_path.insert(0, _Hide())
"""


def import_cpu_s(hide_aiohttp: bool) -> float:
    """CPU of `import openai` in a fresh interpreter that has already imported what an index
    run imports before it (pydantic, numpy, the HTTP library, canopy.server.runtime)."""
    code = ((_HIDE_AIOHTTP if hide_aiohttp else "")
            + "import time, pydantic, numpy, httpx2, anyio, canopy.server.runtime\n"
            "c = time.process_time(); import openai\n"
            "print(time.process_time() - c)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True)
    return round(float(out.stdout.strip()), 3)


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
    installed = importlib.util.find_spec("aiohttp") is not None
    shown = "with aiohttp" if installed else "aiohttp not installed"
    imports: dict[str, list[float]] = {shown: []} | ({"aiohttp hidden": []} if installed else {})
    for _ in range(args.rounds):  # interleaved, so both see the same load
        imports[shown].append(import_cpu_s(hide_aiohttp=False))
        if installed:
            imports["aiohttp hidden"].append(import_cpu_s(hide_aiohttp=True))
    load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "-"
    med = {k: sorted(r[k] for r in rounds)[len(rounds) // 2] for k in rounds[0]}
    print(f"## Client CPU per request ({args.requests} requests x {args.rounds} rounds, "
          f"{IN_FLIGHT} in flight, load {load})\n")
    print("| layer | CPU ms/request by round | median |")
    print("|---|---|---|")
    for k in med:
        print(f"| {k} | {' / '.join(f'{r[k]:.2f}' for r in rounds)} | {med[k]:.2f} |")
    lib = "aiohttp" if "aiohttp" in med else "httpx2"
    print(f"\nSDK request building and handling per request: "
          f"sdk-post/{lib} - {lib} = {med[f'sdk-post/{lib}'] - med[lib]:.2f} ms, "
          f"endpoint/{lib} - {lib} = {med[f'endpoint/{lib}'] - med[lib]:.2f} ms; "
          f"ChatClient's own work (chat - endpoint/{lib}): "
          f"{med['chat'] - med[f'endpoint/{lib}']:.2f} ms; Canopy's transport before and now "
          f"(sdk-post/httpx2 -> endpoint/{lib}): {med['sdk-post/httpx2']:.2f} -> "
          f"{med[f'endpoint/{lib}']:.2f} ms")
    for k, v in imports.items():
        print(f"import openai ({k}): {' / '.join(f'{s:.2f}' for s in v)} s CPU")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "client_overhead.json").write_text(json.dumps(
        {"machine": machine(), "rounds": rounds, "median_ms": med, "import_openai_cpu_s": imports,
         "requests": args.requests}, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
