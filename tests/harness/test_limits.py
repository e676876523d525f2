"""A run never spends past its `max_credits`: not on its sandbox's runtime (a run that only
sleeps), nor on store calls a script in its sandbox makes in a loop. Runtime is priced high
in this suite's cluster (conftest), so 0.05 credits last seconds."""

import time

SLEEP = {"tool": "shell", "arguments": {"command": "sleep 120"}}
LOOP = ("for i in $(seq 1 80); do python3 -c 'import json, os, urllib.request as u\n"
        "r = u.Request(os.environ[\"OPENAI_BASE_URL\"] + \"/chat/completions\", json.dumps({\"model\": "
        "\"openai/gpt-test\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}).encode(), "
        "{\"authorization\": \"Bearer \" + os.environ[\"OPENAI_API_KEY\"], "
        "\"content-type\": \"application/json\"})\n"
        "try:\n    print(u.urlopen(r).status)\nexcept Exception as e:\n    print(getattr(e, \"code\", e))'"
        "; done | sort | uniq -c")


def settled_available(team, deadline=120):
    """The team's available micro-credits once nothing is reserved any more."""
    end = time.time() + deadline
    while True:
        balance = team.call("GET", "/v1/billing/balance")
        if balance["reserved_micro"] == 0:
            return balance["available_micro"]
        assert time.time() < end, balance
        time.sleep(0.5)


def spent_by(team, run, before):
    done = team.wait(run["id"], statuses=("limited", "failed", "completed", "cancelled"),
                     deadline=240)
    # The sandbox the run made is destroyed when it ends: every charge is in.
    return done, before - settled_available(team)


def test_a_run_that_only_sleeps_ends_limited_within_its_credits(team):
    before = settled_available(team)
    run = team.run("openai/gpt-test", "sleep-limit", [SLEEP, SLEEP, SLEEP, {"text": "rested"}],
                   limits={"max_credits": "0.05"})
    done, spent = spent_by(team, run, before)
    assert done["status"] == "limited", (done, [(e["type"], e["data"]) for e in team.events(run["id"])][-6:])
    assert 0 < spent <= 50_000, (spent, team.call("GET", "/v1/billing/ledger"))
    kinds = [(e["type"], e["data"]) for e in team.events(run["id"])]
    assert "limit.reached" in [k for k, _ in kinds], kinds


def test_a_script_calling_the_store_in_a_loop_stops_at_the_runs_credits(team, cluster):
    before = settled_available(team)
    loop = {"tool": "shell", "arguments": {"command": LOOP}}
    run = team.run("openai/gpt-test", "store-loop", [loop, loop, {"text": "looped"}],
                   limits={"max_credits": "0.05"}, sandbox={"store": True})
    done, spent = spent_by(team, run, before)
    assert done["status"] == "limited", (done, [(e["type"], e["data"]) for e in team.events(run["id"])])
    assert 0 < spent <= 50_000, (spent, done)
    outputs = [e["data"]["output"] for e in team.events(run["id"]) if e["type"] == "tool.completed"]
    # Some calls went through, then the key's cap refused the rest.
    assert " 200" in outputs[0] and " 402" in outputs[0], outputs
