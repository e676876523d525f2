"""Schemathesis hooks for SandBase's fuzzing: the fuzzer runs as a team of its own, signed up
afresh whenever its key stops working (the fuzzer itself may revoke the key it runs with, or
remove its own membership). With a worker (SANDBASE_FUZZ_SANDBOX names a file: how many calls went to it), the team keeps one
running sandbox, and three of every four operations on a sandbox are sent to it rather than
to the id generated for them (made again when the fuzzer has destroyed or stopped it,
resumed when it paused it), so that the data plane answers from a real sandbox."""

import os
import time
import uuid

import requests
import schemathesis

URL = os.environ["SANDBASE_FUZZ_URL"]


@schemathesis.auth(refresh_interval=3600, retry_on=[401])
class OwnTeam:
    def get(self, case, context):
        body = {"email": f"fuzz-{uuid.uuid4().hex}@example.com",
                "password": "a long enough password", "team_name": "Fuzz"}
        answer = requests.post(f"{URL}/v1/auth/signup", json=body, timeout=30)
        answer.raise_for_status()
        token = answer.json()["api_key"]["token"]
        SHARED.update(token=token, id=None, checked=0.0)
        if os.environ.get("SANDBASE_FUZZ_SANDBOX"):
            # The shared sandbox first, before the fuzzer's own sandboxes fill the worker.
            shared_sandbox()
        return token

    def set(self, case, data, context):
        case.headers = case.headers or {}
        case.headers["Authorization"] = f"Bearer {data}"


@schemathesis.serializer("application/x-tar")
def tar_archive(context, value):
    """An archive body as the bytes generated for it (the server refuses what is not a tar)."""
    return {"data": value if isinstance(value, bytes) else str(value).encode()}


@schemathesis.hook
def before_load_schema(context, raw_schema):
    """The fuzzer's team holds no secrets, so its sandboxes and runs ask for none (a name the
    team has no secret of is refused 422 `unknown_credential`: state, not shape)."""
    schemas = raw_schema["components"]["schemas"]
    for name in ("CreateSandboxRequest", "CreateRunRequest"):
        schemas[name]["properties"]["credentials"]["maxItems"] = 0


SHARED = {"token": None, "id": None, "checked": 0.0, "calls": 0}
# What would end the shared sandbox at once or soon (a timeout of a second): these keep the
# id generated for them.
ENDING = {("DELETE", "/v1/sandboxes/{id}"), ("POST", "/v1/sandboxes/{id}/timeout")}


def shared_sandbox():
    """The id of the team's running sandbox (made, or resumed, when needed; checked at most
    once a second); None when none can be had (the team's quota full, say)."""
    token, now = SHARED["token"], time.monotonic()
    if token is None:
        return None
    if SHARED["id"] and now - SHARED["checked"] < 1.0:
        return SHARED["id"]
    headers = {"Authorization": f"Bearer {token}"}
    SHARED["checked"] = now
    if SHARED["id"]:
        state = requests.get(f"{URL}/v1/sandboxes/{SHARED['id']}", headers=headers, timeout=30)
        status = state.json().get("state") if state.status_code == 200 else None
        if status == "running":
            return SHARED["id"]
        if status == "paused":
            requests.post(f"{URL}/v1/sandboxes/{SHARED['id']}/resume", headers=headers,
                          timeout=60)
            return SHARED["id"]
    made = make_sandbox(headers)
    if made.status_code in (429, 503) and ("sandbox_quota_reached" in made.text
                                           or "no_capacity" in made.text):
        # The sandboxes the fuzzer made itself hold the team's quota or fill the worker:
        # they make room.
        listed = requests.get(f"{URL}/v1/sandboxes", headers=headers, timeout=30)
        for sandbox in listed.json().get("sandboxes", []) if listed.ok else []:
            requests.delete(f"{URL}/v1/sandboxes/{sandbox['id']}", headers=headers,
                            timeout=60)
        made = make_sandbox(headers)
    SHARED["id"] = made.json()["id"] if made.status_code == 201 else None
    if SHARED["id"] is None:
        SHARED["why"] = f"{made.status_code} {made.text[:300]}"
    return SHARED["id"]


def make_sandbox(headers):
    # Small, so that it finds room beside the fuzzer's own sandboxes.
    return requests.post(f"{URL}/v1/sandboxes", headers=headers, timeout=60,
                         json={"timeout_secs": 3600, "resources": {"memory_mb": 128}})


@schemathesis.hook
def before_call(context, case, kwargs):
    operation = (case.operation.method.upper(), case.operation.path)
    if not os.environ.get("SANDBASE_FUZZ_SANDBOX") or operation in ENDING:
        return
    if not case.operation.path.startswith("/v1/sandboxes/{id}"):
        return
    SHARED["calls"] += 1
    if SHARED["calls"] % 4 == 0:
        return
    sandbox = shared_sandbox()
    if sandbox is not None:
        case.path_parameters = {**(case.path_parameters or {}), "id": sandbox}
        SHARED["sent"] = SHARED.get("sent", 0) + 1
    # How many calls went to the shared sandbox, and why the last try to have one failed, for
    # the test to check.
    with open(os.environ["SANDBASE_FUZZ_SANDBOX"], "w") as record:
        record.write(f"{SHARED.get('sent', 0)}\n{SHARED.get('why', '')}")
