"""Calls of a SandBase gateway's public API, as every suite makes them."""

import json
import urllib.request
import uuid

PASSWORD = "a long enough password"


def call(url, method, path, token=None, body=None, timeout=60):
    """The API's JSON answer (None when empty); a refusal raises `urllib.error.HTTPError`."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    request = urllib.request.Request(f"{url}{path}", data=data, method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        text = answer.read()
        return json.loads(text) if text else None


def signup(url, team="Test"):
    """A new account and team (with starter credits): the whole sign-up answer (`api_key`,
    `team`, `user`, `session`)."""
    body = {"email": f"{team.lower()}-{uuid.uuid4().hex}@example.com", "password": PASSWORD,
            "team_name": team}
    return call(url, "POST", "/v1/auth/signup", body=body)


def new_key(url, team="Test"):
    """The first API key of a new team."""
    return signup(url, team)["api_key"]["token"]
