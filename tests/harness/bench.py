"""The harness's benchmark, one command: `.venv/bin/python -m tests.harness.bench` (after
`scripts/setup --test` and the builds of `scripts/test`; PostgreSQL, Redis and containerd
running). The topology of the harness suite — two gateways, a worker, the scripted stand-in
provider — on this machine, and in the same run:

1. **Overhead per step.** A run of STEPS model calls, each asking for `shell true`; then every
   request the run made of the model (as the stand-in recorded it) and every command is made
   again directly by this client — the model's request at the store's route with the team's
   key, the command as a plain exec. Per step: the harness's time (from the ledger) against the
   direct call's; overhead = the difference, p50 and p99, and the ratio.
2. **First SSE event after its step.** For each `tool.completed` of that run, when an SSE
   client received it, against the `at` its journal row was written with.
3. **100 concurrent runs × 20 steps**, each in a sandbox of `cpu 0.05, memory_mb 64` (five
   teams, 20 sandboxes each — the default team quota): errors counted (a run that did not end
   idle with its 20 tool calls, a refused sandbox).
4. **Memory per waiting run.** 1000 runs each waiting in `requires_action` for a client
   function (all in one sandbox given by id): (RSS of the gateway that stepped them − its RSS
   before) / 1000, and its thread count before and after.

Environment: BENCH_STEPS (40), BENCH_RUNS (100), BENCH_WAITING (1000), BENCH_PHASES (all:
`overhead,concurrent,waiting`).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

from tests.harness.conftest import Cluster, Sse, Team
from tests.support.api import call
from tests.support.gateways import drop_database, fresh_database

STEPS = int(os.environ.get("BENCH_STEPS", "40"))
RUNS = int(os.environ.get("BENCH_RUNS", "100"))
WAITING = int(os.environ.get("BENCH_WAITING", "1000"))
PHASES = os.environ.get("BENCH_PHASES", "overhead,concurrent,waiting").split(",")


def at(text):
    import datetime
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[round((len(ordered) - 1) * fraction)]


def timed(function):
    started = time.perf_counter()
    result = function()
    return time.perf_counter() - started, result


def read_whole(url, token, path, body):
    """A POST whose answer — JSON, or a stream of events as the run asked for — is read to
    its last byte."""
    request = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json",
                                              "authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return answer.read()


def overhead(cluster, team):
    """Phases 1 and 2."""
    steps = [{"tool": "shell", "arguments": {"command": "true"}}] * STEPS + [{"text": "done"}]
    cluster.standin.script("bench-steps", steps)
    body = {"model": "openai/gpt-test", "input": "[[script:bench-steps]] go",
            "tools": [{"type": "shell"}]}
    run = team.call("POST", "/v1/agent-runs", body)
    received = {}
    stream = Sse(cluster.urls[0], team.token, run["id"])

    def follow():
        for _, event in stream.frames():
            received[event["seq"]] = (time.time(), event)
            if event["type"] == "run.status":
                return
    reader = threading.Thread(target=follow)
    reader.start()
    done = team.wait(run["id"], deadline=600)
    reader.join(timeout=60)
    stream.close()
    assert done["status"] == "idle" and done["tool_calls"] == STEPS, done
    ledger = team.call("GET", f"/v1/agent-runs/{run['id']}/steps")["steps"]
    # The harness's time per step: from the end of the step before (the first: its start)
    # to the end of this one — the journal writes, the loop and the call itself.
    ends = [at(step["finished_at"]) for step in ledger]
    # Of which before the step was written `intended` (the loop's reads, the checks).
    before = [at(step["started_at"]) - start
              for step, start in zip(ledger, [at(ledger[0]["started_at"])] + ends[:-1])]
    harness = [end - start for start, end in zip([at(ledger[0]["started_at"])] + ends[:-1], ends)]
    # The same calls made directly, in the same order: each model request the run made (as
    # the stand-in received it, sent to the store's route under the store's name of the
    # model), and `true` in the same shell session.
    requests = [r["body"] for r in cluster.standin.requests("[[script:bench-steps]]")]
    sandbox = done["sandbox_id"]
    team.call("POST", f"/v1/sandboxes/{sandbox}/resume", {})
    direct = []
    for index, request in enumerate(requests):
        request = {**request, "model": "openai/gpt-test"}
        direct.append(timed(lambda: read_whole(cluster.urls[0], team.token,
                                               "/openai/v1/chat/completions", request))[0])
        if index < STEPS:
            exec_body = {"command": "true", "session": "agent"}
            direct.append(timed(lambda: team.call("POST", f"/v1/sandboxes/{sandbox}/exec",
                                                  exec_body))[0])
    assert len(direct) == len(harness), (len(direct), len(harness))
    extra = [(h - d) * 1000 for h, d in zip(harness, direct)]
    lags = [(when - at(event["at"])) * 1000 for when, event in received.values()
            if event["type"] == "tool.completed"]
    team.call("POST", f"/v1/agent-runs/{run['id']}/cancel", {})
    # Model steps are the even ones, tool steps the odd ones: each kind's medians apart.
    ms = lambda values: round(statistics.median(values) * 1000, 2)
    return {
        "steps": len(harness),
        "model_step_ms_p50": ms(harness[0::2]), "model_direct_ms_p50": ms(direct[0::2]),
        "tool_step_ms_p50": ms(harness[1::2]), "tool_direct_ms_p50": ms(direct[1::2]),
        "model_before_intended_ms_p50": ms(before[0::2]),
        "tool_before_intended_ms_p50": ms(before[1::2]),
        "ratio_p50": round(statistics.median(harness) / statistics.median(direct), 3),
        "overhead_ms_p50": round(percentile(extra, 0.5), 2),
        "overhead_ms_p99": round(percentile(extra, 0.99), 2),
        "sse_lag_ms_p50": round(percentile(lags, 0.5), 2),
        "sse_lag_ms_max": round(max(lags), 2),
    }


def concurrent(cluster):
    """Phase 3."""
    steps = [{"tool": "shell", "arguments": {"command": "true"}}] * 20 + [{"text": "done"}]
    cluster.standin.script("bench-many", steps)
    teams = [Team(cluster) for _ in range((RUNS + 19) // 20)]
    body = {"model": "openai/gpt-test", "input": "[[script:bench-many]] go",
            "tools": [{"type": "shell"}],
            "sandbox": {"resources": {"cpu": 0.05, "memory_mb": 64}}}
    started = time.time()
    runs = []
    for index in range(RUNS):
        team = teams[index // 20]
        runs.append((team, team.call("POST", "/v1/agent-runs", body, gateway=index % 2)))
    errors, statuses = 0, {}
    for team, run in runs:
        done = team.wait(run["id"], deadline=900)
        statuses[done["status"]] = statuses.get(done["status"], 0) + 1
        if done["status"] != "idle" or done["tool_calls"] != 20:
            errors += 1
    elapsed = time.time() - started
    for team, run in runs:
        team.call("POST", f"/v1/agent-runs/{run['id']}/cancel", {})
    return {"runs": RUNS, "steps_each": 20, "errors": errors, "statuses": statuses,
            "seconds": round(elapsed, 1)}


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def waiting(cluster):
    """Phase 4: runs stepped by gateway 0 only, started afresh (so that memory the phases
    before freed does not hide what the waiting runs hold); gateway 1 steps none meanwhile."""
    cluster.restart_gateway(1, HARNESS__MAX_CONCURRENT="0")
    cluster.restart_gateway(0)
    team = Team(cluster)
    sandbox = team.call("POST", "/v1/sandboxes", {"timeout_secs": 3600})
    cluster.standin.script("bench-wait", [{"tool": "ask_client", "arguments": {}}])
    body = {"model": "openai/gpt-test", "input": "[[script:bench-wait]] go",
            "tools": [{"type": "function", "name": "ask_client"}],
            "sandbox": {"id": sandbox["id"]}}
    pid = cluster.gateways[0].pid
    # Warm: one run first, so that what is measured is what each more run adds.
    first = team.call("POST", "/v1/agent-runs", body)
    team.wait(first["id"])
    time.sleep(2)
    before, threads_before = rss_kib(pid), threads(pid)
    runs = [team.call("POST", "/v1/agent-runs", body) for _ in range(WAITING)]
    for run in runs:
        ended = team.wait(run["id"], deadline=600)
        assert ended["status"] == "requires_action", (ended, team.events(ended["id"]))
    time.sleep(2)
    after, threads_after = rss_kib(pid), threads(pid)
    cluster.restart_gateway(1)
    return {"runs": WAITING, "rss_before_kib": before, "rss_after_kib": after,
            "kib_per_waiting_run": round((after - before) / WAITING, 1),
            "threads_before": threads_before, "threads_after": threads_after}


def main():
    workdir = tempfile.mkdtemp(prefix="sandbase-harness-bench-")
    database, database_url = fresh_database("sandbase_test_harness_bench")
    cluster = Cluster(workdir, database_url)
    try:
        cluster.start()
        team = Team(cluster)
        for name, phase in [("overhead", lambda: overhead(cluster, team)),
                            ("concurrent", lambda: concurrent(cluster)),
                            ("waiting", lambda: waiting(cluster))]:
            if name in PHASES:
                print(json.dumps({name: phase()}), flush=True)
    finally:
        cluster.close()
        drop_database(database)


if __name__ == "__main__":
    sys.exit(main())
