"""What an ASGI stack adds to one request, without a model: the choice behind ``fastbert
serve``'s stack.

Each stack serves a ``POST /embed`` that parses TEI's body (``{"inputs": [...]}``) and answers
one 384-float embedding per input (made-up numbers, serialised with orjson), on uvicorn with
each event loop and HTTP parser. A client in its own process sends one request at a time and
times it (median, p90 and p99 over ``--requests``, after a warm-up). Run:

    python -m benchmarks.asgi_overhead [--requests 2000] [--output DIR]

The stacks: Starlette with the body parsed by orjson; FastAPI with the body declared as a
pydantic model (what fastbert serve does: validation and the OpenAPI document come from it);
each on uvicorn's h11 / asyncio and httptools / uvloop.
"""

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

import numpy as np

APPS = ("starlette", "fastapi")
LOOPS = (("asyncio", "h11"), ("uvloop", "httptools"))
EMBEDDING = np.linspace(-1, 1, 384, dtype=np.float32)


def starlette_app():
    import orjson
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    async def embed(request):
        body = orjson.loads(await request.body())
        inputs = body["inputs"] if isinstance(body["inputs"], list) else [body["inputs"]]
        vectors = np.stack([EMBEDDING] * len(inputs))
        return Response(
            orjson.dumps(vectors, option=orjson.OPT_SERIALIZE_NUMPY),
            media_type="application/json",
        )

    return Starlette(routes=[Route("/embed", embed, methods=["POST"])])


def fastapi_app():
    import orjson
    from fastapi import FastAPI
    from fastapi.responses import Response
    from pydantic import BaseModel, StrictStr

    class EmbedRequest(BaseModel):
        inputs: StrictStr | list[StrictStr]
        normalize: bool = True

    app = FastAPI()

    @app.post("/embed")
    async def embed(body: EmbedRequest) -> Response:
        inputs = [body.inputs] if isinstance(body.inputs, str) else body.inputs
        vectors = np.stack([EMBEDDING] * len(inputs))
        return Response(
            orjson.dumps(vectors, option=orjson.OPT_SERIALIZE_NUMPY),
            media_type="application/json",
        )

    return app


def _serve(app_name: str, loop: str, http: str, port: int) -> None:
    import uvicorn

    app = starlette_app() if app_name == "starlette" else fastapi_app()
    uvicorn.run(app, host="127.0.0.1", port=port, loop=loop, http=http, log_level="warning")


def _client(port: int, requests: int, inputs: int, results: multiprocessing.Queue) -> None:
    import httpx

    body = {"inputs": ["A short sentence about the weather today."] * inputs}
    url = f"http://127.0.0.1:{port}/embed"
    with httpx.Client() as client:
        for _ in range(200):
            client.post(url, json=body)
        times = []
        for _ in range(requests):
            start = time.perf_counter()
            client.post(url, json=body).raise_for_status()
            times.append(time.perf_counter() - start)
    times.sort()
    results.put(
        {
            "p50_ms": statistics.median(times) * 1e3,
            "p90_ms": times[int(0.9 * len(times))] * 1e3,
            "p99_ms": times[int(0.99 * len(times))] * 1e3,
        }
    )


def measure(app_name: str, loop: str, http: str, requests: int, inputs: int) -> dict:
    from tests.serve_process import free_port

    port = free_port()
    context = multiprocessing.get_context("spawn")
    server = context.Process(target=_serve, args=(app_name, loop, http, port), daemon=True)
    server.start()
    _wait(port)
    results = context.Queue()
    client = context.Process(target=_client, args=(port, requests, inputs, results))
    client.start()
    found = results.get(timeout=600)
    client.join()
    server.terminate()
    server.join()
    return {"app": app_name, "loop": loop, "http": http, "inputs": inputs, **found}


def _wait(port: int, timeout: float = 30) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.post(f"http://127.0.0.1:{port}/embed", json={"inputs": "x"}, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"the server on port {port} did not start")


def markdown(rows: list[dict], environment: dict) -> str:
    lines = [
        "# ASGI stack overhead (no model)",
        "",
        f"{environment['cpu']} ({environment['cpu_threads']} threads), Python "
        f"{environment['python']}, {environment['date']}; one client process, one request at a "
        "time; each answer: one 384-float embedding per input.",
        "",
        "| app | loop / parser | inputs | p50 ms | p90 ms | p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['app']} | {r['loop']} / {r['http']} | {r['inputs']} | {r['p50_ms']:.3f} | "
            f"{r['p90_ms']:.3f} | {r['p99_ms']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from fastbert.bench import environment

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="timed requests per stack")
    parser.add_argument("--output", type=Path, default=None, help="folder for the results")
    args = parser.parse_args(argv)
    if args.requests < 10:
        parser.error("--requests must be at least 10")
    rows = []
    for app_name in APPS:
        for loop, http in LOOPS:
            for inputs in (1, 32):
                row = measure(app_name, loop, http, args.requests, inputs)
                print(
                    f"{app_name:9} {loop:7} {http:9} {inputs:2} inputs: p50 {row['p50_ms']:.3f} "
                    f"ms, p99 {row['p99_ms']:.3f} ms",
                    file=sys.stderr,
                )
                rows.append(row)
    env = environment.capture()
    report = markdown(rows, env)
    print(report)
    if args.output:
        args.output.mkdir(parents=True, exist_ok=True)
        (args.output / "asgi-overhead.json").write_text(
            json.dumps({"environment": env, "rows": rows}, indent=2)
        )
        (args.output / "asgi-overhead.md").write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
