"""SDK overhead per call against raw HTTP, measured in the same run: `Sandbase.me()` (request
built, sent, answer validated into a pydantic model) against the same GET with the same
httpx client and a plain `json.loads`, alternated, N of each. Needs a running SandBase:
SANDBASE_URL and SANDBASE_API_KEY (`sandbase dev` prints both), started with rate limits above
the benchmark's pace (see docs/benchmarks.md)."""

import json
import os
import statistics
import sys
import time

import httpx

from sandbase import Sandbase

N = int(os.environ.get("BENCH_CALLS", "1000"))


def main() -> None:
    url, key = os.environ["SANDBASE_URL"], os.environ["SANDBASE_API_KEY"]
    http = httpx.Client(base_url=url, timeout=30)
    client = Sandbase(key, url, http_client=http)
    headers = {"authorization": f"Bearer {key}"}
    sdk, raw = [], []
    for _ in range(50):  # warm both paths up
        client.me()
        json.loads(http.get("/v1/me", headers=headers).content)
    for _ in range(N):
        started = time.perf_counter()
        client.me()
        sdk.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        answer = http.get("/v1/me", headers=headers)
        answer.raise_for_status()
        json.loads(answer.content)
        raw.append((time.perf_counter() - started) * 1000)
    p50 = statistics.median(sdk), statistics.median(raw)
    p99 = sorted(sdk)[int(N * 0.99)], sorted(raw)[int(N * 0.99)]
    print(f"calls {N} each, GET /v1/me")
    print(f"SDK  p50 {p50[0]:.3f} ms  p99 {p99[0]:.3f} ms")
    print(f"raw  p50 {p50[1]:.3f} ms  p99 {p99[1]:.3f} ms")
    print(f"overhead p50 {p50[0] - p50[1]:+.3f} ms (ratio {p50[0] / p50[1]:.3f})")
    sys.exit(0)


if __name__ == "__main__":
    main()
