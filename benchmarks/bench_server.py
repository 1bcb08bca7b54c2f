"""The OpenAI-compatible server under load: throughput and latency at 1, 4 and 8 concurrent clients.

Run: .venv/bin/python benchmarks/bench_server.py [--requests 16] [--max-tokens 32] [--levels 1,4,8]
     [--max-batch 16] [--no-direct] [--markdown FILE]

``constrain serve`` (the embedded Gemma 3 270M, transformers on the CPU) runs in a subprocess on a free port of
127.0.0.1; this process sends the same ``--requests`` chat requests at each level through OpenAI's client, from
that many threads at once (level 1: one at a time). Each request asks for a city as JSON under a strict JSON
Schema (``response_format``), greedy, at most ``--max-tokens`` tokens, with a worked example in the prompt. The
load is bounded: a fixed number of requests per level, on loopback only.

Printed per level: requests/s, generated tokens/s (completion tokens over the wall time), p50 and p90 latency,
forward passes per generated token and rows per batch (read from the server's ``/constrain/stats``), and whether
every output equals the one-at-a-time output (greedy decoding; batching pads rows, so a near tie could differ).
First (unless ``--no-direct``), the same requests run one at a time through ``LLM.complete`` in this process,
without a server, for the server's own overhead.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai

CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "country": {"type": "string", "maxLength": 20},
        "continent": {"enum": ["Africa", "Americas", "Asia", "Europe", "Oceania"]},
    },
    "required": ["city", "country", "continent"],
    "additionalProperties": False,
}
CITIES = [
    "Rome", "Berlin", "Madrid", "Tokyo", "Cairo", "Lima", "Oslo", "Delhi",
    "Sydney", "Nairobi", "Toronto", "Seoul", "Lisbon", "Dublin", "Quito", "Hanoi",
]  # fmt: skip
EXAMPLE = 'Paris: {"city":"Paris","country":"France","continent":"Europe"}\n'
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}


def messages(city: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{EXAMPLE}{city}:"}]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(port: int, max_batch: int) -> subprocess.Popen:
    command = [sys.executable, "-c", "from constrain.cli import main; raise SystemExit(main())"]
    args = ["serve", "--port", str(port), "--max-batch", str(max_batch)]
    process = subprocess.Popen([*command, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    deadline = time.monotonic() + 300
    while True:
        try:
            client.models.list()
            return process
        except openai.APIConnectionError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start: {process.stderr.read()}") from None
            time.sleep(0.5)


def stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/constrain/stats", timeout=30) as response:
        return json.loads(response.read())


def run_level(client: openai.OpenAI, port: int, level: int, cities: list[str], max_tokens: int) -> dict[str, Any]:
    """Send every request from ``level`` threads at once; the figures of the level."""

    def ask(city: str) -> tuple[float, str, int]:
        began = time.perf_counter()
        response = client.chat.completions.create(
            model="x", messages=messages(city), max_tokens=max_tokens, temperature=0, response_format=RESPONSE_FORMAT
        )
        return time.perf_counter() - began, response.choices[0].message.content, response.usage.completion_tokens

    before = stats(port)
    began = time.perf_counter()
    with ThreadPoolExecutor(level) as pool:
        results = list(pool.map(ask, cities))
    wall = time.perf_counter() - began
    after = stats(port)
    latencies = sorted(r[0] for r in results)
    tokens = sum(r[2] for r in results)
    passes = after["forward_passes"] - before["forward_passes"]
    batches = after["batches"] - before["batches"]
    return {
        "level": level,
        "wall": wall,
        "requests_per_s": len(cities) / wall,
        "tokens_per_s": tokens / wall,
        "p50": statistics.median(latencies),
        "p90": latencies[max(0, int(round(0.9 * len(latencies))) - 1)],
        "passes_per_token": passes / tokens,
        "rows_per_batch": (after["rows"] - before["rows"]) / max(batches, 1),
        "outputs": [r[1] for r in results],
        "tokens": tokens,
    }


def run_direct(cities: list[str], max_tokens: int) -> dict[str, Any]:
    """The same requests one at a time through ``LLM.complete`` in this process: no HTTP, no scheduler."""
    import constrain

    llm = constrain.LLM()
    llm.complete(messages(cities[0]), CITY, max_new_tokens=max_tokens)  # warm-up, as the server's
    latencies, outputs, tokens = [], [], 0
    began = time.perf_counter()
    for city in cities:
        t0 = time.perf_counter()
        completion = llm.complete(messages(city), CITY, max_new_tokens=max_tokens)
        latencies.append(time.perf_counter() - t0)
        outputs.append(completion.text)
        tokens += len(completion.tokens)
    wall = time.perf_counter() - began
    latencies.sort()
    return {
        "level": "direct",
        "wall": wall,
        "requests_per_s": len(cities) / wall,
        "tokens_per_s": tokens / wall,
        "p50": statistics.median(latencies),
        "p90": latencies[max(0, int(round(0.9 * len(latencies))) - 1)],
        "passes_per_token": None,
        "rows_per_batch": 1.0,
        "outputs": outputs,
        "tokens": tokens,
    }


def table(rows: list[dict[str, Any]], reference: list[str]) -> str:
    lines = [
        "| clients | requests/s | generated tokens/s | p50 latency (s) | p90 latency (s) | forward passes / token "
        "| rows / batch | outputs as one at a time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        same = sum(a == b for a, b in zip(row["outputs"], reference))
        label = "LLM.complete, no server" if row["level"] == "direct" else str(row["level"])
        passes = "-" if row["passes_per_token"] is None else f"{row['passes_per_token']:.2f}"
        lines.append(
            f"| {label} | {row['requests_per_s']:.2f} | {row['tokens_per_s']:.1f} | {row['p50']:.2f} | "
            f"{row['p90']:.2f} | {passes} | {row['rows_per_batch']:.1f} | {same}/{len(reference)} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=16, help="requests per level (default 16)")
    parser.add_argument("--max-tokens", type=int, default=32, help="per request (default 32)")
    parser.add_argument("--levels", default="1,4,8", help="concurrent clients per level (default 1,4,8)")
    parser.add_argument("--max-batch", type=int, default=16, help="the server's --max-batch (default 16)")
    parser.add_argument("--no-direct", action="store_true", help="skip the LLM.complete baseline")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table to this file")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    if 1 not in levels:
        levels.insert(0, 1)  # the reference outputs
    cities = [CITIES[i % len(CITIES)] for i in range(args.requests)]

    rows = []
    if not args.no_direct:  # first, and its model freed before the server loads its own
        rows.append(run_direct(cities, args.max_tokens))
        print(f"direct: {rows[-1]['wall']:.1f} s", file=sys.stderr)
        gc.collect()
    port = free_port()
    began = time.perf_counter()
    server = start_server(port, args.max_batch)
    print(f"server up in {time.perf_counter() - began:.1f} s on 127.0.0.1:{port}", file=sys.stderr)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=600)
        client.chat.completions.create(
            model="x", messages=messages("Rome"), max_tokens=args.max_tokens, temperature=0,
            response_format=RESPONSE_FORMAT,
        )  # fmt: skip  # warm-up: the schema's compile and the first passes
        for level in levels:
            row = run_level(client, port, level, cities, args.max_tokens)
            print(f"level {level}: {row['wall']:.1f} s", file=sys.stderr)
            rows.append(row)
    finally:
        server.terminate()
        server.wait(timeout=60)
    reference = next(r for r in rows if r["level"] == 1)["outputs"]
    for output in reference:
        json.loads(output)  # every output is JSON (the structure's promise)
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    out = [
        f"Server throughput: {args.requests} chat requests per level, a strict JSON Schema response, greedy, "
        f"max_tokens {args.max_tokens}, the embedded Gemma 3 270M (transformers, float32, CPU); server "
        f"--max-batch {args.max_batch}; {machine}; {rows[-1]['tokens']} tokens generated per level.",
        "",
        table(rows, reference),
    ]
    text = "\n".join(out)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
