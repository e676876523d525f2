"""One stand-in for the model providers, speaking their documented wire formats, run as a
process that every suite shares (the store suites, the drills, the harness suites).

Endpoints: OpenAI chat completions, Responses and embeddings; Anthropic messages and
token counting — each whole or streamed (SSE), with fixed usage (``CHAT_USAGE``,
``RESPONSES_USAGE``, ``ANTHROPIC_USAGE``). It answers only to the operator's credentials
(``OPENAI_SECRET`` as a bearer, ``ANTHROPIC_SECRET`` as ``x-api-key``).

What it answers is chosen per request, so concurrent tests share one process:

* A scripted conversation: ``[[script:NAME]]`` in the first user message plays the script
  registered as NAME (``POST /_standin/scripts``): step *i* is answered when the request
  carries *i* tool results, so a step is a tool call (``{"tool": NAME, "arguments": {…}}``),
  sent back once its result arrives, then the next step or a final answer
  (``{"text": "…"}``); a step ``{"tools": [{"tool": …, "arguments": …}, …]}`` is several
  calls at once, and the next step is the one numbered by
  how many results then came. Past its end a script repeats its last step.
* Failures on demand, in the last user message: ``busy`` (429 with ``Retry-After: 7``),
  ``overloaded`` (Anthropic's 529 with ``Retry-After: 3``), ``[[overloaded:N]]`` (529 with
  ``Retry-After: 1`` to the first N requests of that text, then answered), ``broken`` (500, body
  ``BROKEN``), ``slow`` (a whole answer after a second, a stream 200 ms between events),
  ``[[first-byte:SECONDS]]`` (nothing at all for that long), ``[[cut]]`` (a stream that
  breaks off before its final usage), ``[[deltas:N]]`` (a text streamed as N deltas of
  ``word ``), ``no usage`` (a chat stream that ends without the
  usage it was asked for).
* ``thinking`` asked of an Anthropic model: a thinking block with a signature comes first.
* Without a script, given tools: ``weather`` calls the first tool with ``{"city": "Paris"}``;
  a tool's result is answered with ``SUNNY``. Otherwise ``TEXT``.

A paid API at ``/api/PATH`` (its credential ``API_SECRET`` as the query parameter ``key``):
``search`` echoes ``q`` (``slow`` too, after 1.5 s), ``big`` answers 2 MiB, ``redirect`` sends a 302 to ``/stolen``,
anything else 500. A GET outside ``/api/`` answers 404 and is logged like the rest.

It keeps every request: ``GET /_standin/requests`` (each ``{path, headers, body}``), so a test
can say a model was, or was not, called.

As a process: ``python3 -m tests.support.standin`` prints one JSON line (``{"url": …}``) once
serving and stops when its standard input closes. From Python: ``StandIn.start()``.
"""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

OPENAI_SECRET = "upstream-secret-openai"
ANTHROPIC_SECRET = "upstream-secret-anthropic"
# A paid API's credential, as a query parameter: characters a URL must encode.
API_SECRET = "upstream-secret-api&=?"
TEXT = "Hello from the stand-in"
SIGNATURE = "sig-standin-1"

CHAT_USAGE = {
    "prompt_tokens": 1000,
    "completion_tokens": 50,
    "total_tokens": 1050,
    "prompt_tokens_details": {"cached_tokens": 200},
}
RESPONSES_USAGE = {
    "input_tokens": 500,
    "input_tokens_details": {"cached_tokens": 100},
    "output_tokens": 40,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 540,
}
ANTHROPIC_USAGE = {
    "input_tokens": 100,
    "cache_read_input_tokens": 30,
    "cache_creation_input_tokens": 20,
    "output_tokens": 77,
}

def compact(value):
    """JSON as providers send it: no spaces."""
    return json.dumps(value, separators=(",", ":"))


BROKEN = compact({"error": {"message": "broke", "type": "server_error"}})

SCRIPTS = {}
REQUESTS = []
# How many requests each text asking for `[[overloaded:N]]` has had.
OVERLOADED = {}
LOCK = threading.Lock()


def text_of(content):
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text") or "" for part in content if isinstance(part, dict))
    return ""


def user_texts(body):
    """The user's words in order, whichever family's request this is."""
    items = body.get("messages")
    if items is None:
        items = body.get("input")
        if isinstance(items, str):
            return [items]
    texts = []
    for item in items or []:
        if isinstance(item, dict) and item.get("role") == "user":
            texts.append(text_of(item.get("content")))
    return texts


def tool_results(body):
    """How many tool results the request carries (chat `tool` messages, Anthropic
    `tool_result` blocks, Responses `function_call_output` items)."""
    count = 0
    for item in body.get("messages") or (body.get("input") if isinstance(body.get("input"), list) else []):
        if not isinstance(item, dict):
            continue
        if item.get("role") == "tool" or item.get("type") == "function_call_output":
            count += 1
        if isinstance(item.get("content"), list):
            count += sum(1 for block in item["content"]
                         if isinstance(block, dict) and block.get("type") == "tool_result")
    return count


def decide(body, tools):
    """What the model says: ("text", words) or ("tool", name, arguments)."""
    texts = user_texts(body)
    first = texts[0] if texts else ""
    scripted = re.search(r"\[\[script:([\w.-]+)\]\]", first)
    if scripted:
        with LOCK:
            steps = SCRIPTS.get(scripted.group(1))
        if not steps:
            return ("text", f"no script named {scripted.group(1)}")
        step = steps[min(tool_results(body), len(steps) - 1)]
        if "tools" in step:
            return ("tools", [(call["tool"], call.get("arguments") or {}) for call in step["tools"]])
        if "tool" in step:
            return ("tool", step["tool"], step.get("arguments") or {})
        return ("text", step.get("text", TEXT))
    if tools and tool_results(body):
        return ("text", "SUNNY")
    if tools and "weather" in (texts[-1] if texts else ""):
        return ("tool", tools[0], {"city": "Paris"})
    return ("text", TEXT)


def sse(data, kind=None):
    head = f"event: {kind}\n" if kind else ""
    return f"{head}data: {compact(data)}\n\n"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # Headers and body go out in two writes: without this, Nagle's algorithm holds the
        # body until the client's delayed ACK (40 ms a request).
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args):
        pass

    def send_json(self, status, body, headers=()):
        data = compact(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def send_events(self, events, cut=False):
        """A stream, event by event; `cut` breaks the connection before the last two events
        (where the final usage is)."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        for event in events[:-2] if cut else events:
            self.wfile.write(event.encode())
            self.wfile.flush()
            time.sleep(self.pause)
        self.close_connection = True

    # -- control ---------------------------------------------------------------------------

    def do_GET(self):
        if self.path.startswith("/api/"):
            return self.paid_api()
        if self.path.startswith("/_standin/requests"):
            with LOCK:
                return self.send_json(200, list(REQUESTS))
        # Anything else is logged too: a request that escaped its base shows here.
        headers = {name.lower(): value for name, value in self.headers.items()}
        with LOCK:
            REQUESTS.append({"path": self.path.split("?")[0], "headers": headers, "body": {}})
        self.send_json(404, {"error": {"message": "no such route"}})

    def do_DELETE(self):
        if self.path.startswith("/_standin/requests"):
            with LOCK:
                REQUESTS.clear()
            return self.send_json(200, {})
        self.send_json(404, {"error": {"message": "no such route"}})

    def do_POST(self):
        if self.path.startswith("/api/"):
            return self.paid_api()
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        if self.path == "/_standin/scripts":
            with LOCK:
                SCRIPTS[body["name"]] = body["steps"]
            return self.send_json(200, {})
        headers = {name.lower(): value for name, value in self.headers.items()}
        with LOCK:
            REQUESTS.append({"path": self.path, "headers": headers, "body": body})
        if self.path.startswith("/v1/messages"):
            allowed = headers.get("x-api-key") == ANTHROPIC_SECRET
        else:
            allowed = headers.get("authorization") == f"Bearer {OPENAI_SECRET}"
        if not allowed:
            return self.send_json(401, {"error": {"message": "bad key"}})
        texts = user_texts(body)
        last = texts[-1] if texts else ""
        if self.failed(last, body.get("stream") is True):
            return
        route = {
            "/v1/chat/completions": self.chat,
            "/v1/responses": self.openai_responses,
            "/v1/embeddings": self.embeddings,
            "/v1/messages": self.messages,
            "/v1/messages/count_tokens": self.count_tokens,
        }.get(self.path)
        if route is None:
            return self.send_json(404, {"error": {"message": "no such route"}})
        self.cut = "[[cut]]" in last
        many = re.search(r"\[\[deltas:(\d+)\]\]", last)
        self.deltas = int(many.group(1)) if many else None
        self.no_usage = "no usage" in last
        self.pause = 0.2 if "slow" in last and body.get("stream") else 0.005
        route(body)

    def failed(self, last, streamed):
        """Answers a failure the last message asks for; whether it did."""
        first_byte = re.search(r"\[\[first-byte:([\d.]+)\]\]", last)
        if first_byte:
            time.sleep(float(first_byte.group(1)))
        if "broken" in last:
            data = BROKEN.encode()
            self.send_response(500)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return True
        times = re.search(r"\[\[overloaded:(\d+)\]\]", last)
        if times:
            with LOCK:
                OVERLOADED[last] = OVERLOADED.get(last, 0) + 1
                seen = OVERLOADED[last]
            if seen <= int(times.group(1)):
                error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
                self.send_json(529, error, [("retry-after", "1")])
                return True
        elif "overloaded" in last:
            error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
            self.send_json(529, error, [("retry-after", "3")])
            return True
        if "slow" in last and not streamed:
            time.sleep(1)
        if "busy" in last:
            error = {"error": {"message": "slow down", "type": "rate_limit_error"}}
            self.send_json(429, error, [("retry-after", "7")])
            return True
        return False

    # -- OpenAI chat completions -----------------------------------------------------------

    def chat(self, body):
        model = body["model"]
        tools = [tool["function"]["name"] for tool in body.get("tools") or []]
        said = decide(body, tools)
        if said[0] == "tools":
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": f"call_{number}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)}}
                for number, (name, arguments) in enumerate(said[1], 1)]}
            finish = "tool_calls"
        elif said[0] == "tool":
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": said[1], "arguments": json.dumps(said[2])}}]}
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": said[1]}
            finish = "stop"
        if not body.get("stream"):
            return self.send_json(200, {
                "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model,
                "choices": [{"index": 0, "finish_reason": finish, "logprobs": None,
                             "message": message}],
                "usage": CHAT_USAGE})
        with_usage = (body.get("stream_options") or {}).get("include_usage") is True

        def chunk(delta, finish=None):
            data = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                    "model": model, "choices": [{"index": 0, "delta": delta,
                                                 "finish_reason": finish}]}
            if with_usage:
                data["usage"] = None
            return sse(data)

        if said[0] in ("tool", "tools"):
            calls = said[1] if said[0] == "tools" else [(said[1], said[2])]
            events = []
            for index, (name, arguments) in enumerate(calls):
                arguments = json.dumps(arguments)
                half = len(arguments) // 2
                events += [
                    chunk({"role": "assistant", "content": None, "tool_calls": [
                        {"index": index, "id": f"call_{index + 1}", "type": "function",
                         "function": {"name": name, "arguments": ""}}]}),
                    chunk({"tool_calls": [{"index": index,
                                           "function": {"arguments": arguments[:half]}}]}),
                    chunk({"tool_calls": [{"index": index,
                                           "function": {"arguments": arguments[half:]}}]}),
                ]
        else:
            events = [chunk({"role": "assistant", "content": ""})]
            # Words with the space after them, as providers stream them.
            words = re.findall(r"\S+\s*", said[1])
            if self.deltas:
                words = ["word "] * self.deltas
            events += [chunk({"content": word}) for word in words]
        events.append(chunk({}, finish))
        if with_usage and not self.no_usage:
            events.append(sse({"id": "chatcmpl-1", "object": "chat.completion.chunk",
                               "created": 1, "model": model, "choices": [],
                               "usage": CHAT_USAGE}))
        events.append("data: [DONE]\n\n")
        self.send_events(events, self.cut)

    # -- OpenAI Responses ------------------------------------------------------------------

    def openai_responses(self, body):
        model = body["model"]
        tools = [tool.get("name") for tool in body.get("tools") or [] if tool.get("type") == "function"]
        said = decide(body, tools)
        # Each step's call has ids of its own (the first is call_1), as a model's would.
        step = tool_results(body) + 1
        if said[0] == "tool":
            item = {"type": "function_call", "id": f"fc_{step}", "call_id": f"call_{step}",
                    "name": said[1], "arguments": json.dumps(said[2]), "status": "completed"}
        else:
            item = {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": said[1], "annotations": []}]}

        def response(status, usage):
            return {
                "id": "resp_1", "object": "response", "created_at": 1, "status": status,
                "model": model, "output": [item] if status == "completed" else [],
                "usage": usage, "parallel_tool_calls": True, "tool_choice": "auto",
                "tools": body.get("tools") or [], "error": None, "incomplete_details": None,
                "instructions": body.get("instructions"), "metadata": {}, "temperature": 1.0,
                "top_p": 1.0,
            }

        if not body.get("stream"):
            return self.send_json(200, response("completed", RESPONSES_USAGE))
        numbers = iter(range(1000))

        def event(kind, data):
            return sse({"type": kind, "sequence_number": next(numbers), **data}, kind)

        events = [event("response.created", {"response": response("in_progress", None)})]
        if said[0] == "tool":
            events.append(event("response.output_item.added", {
                "output_index": 0, "item": dict(item, arguments="", status="in_progress")}))
            events.append(event("response.function_call_arguments.delta", {
                "item_id": item["id"], "output_index": 0, "delta": item["arguments"]}))
            events.append(event("response.function_call_arguments.done", {
                "item_id": item["id"], "output_index": 0, "arguments": item["arguments"]}))
        else:
            for number, word in enumerate(said[1].split(" ")):
                events.append(event("response.output_text.delta", {
                    "item_id": "msg_1", "output_index": 0, "content_index": 0,
                    "delta": word if number == 0 else f" {word}", "logprobs": []}))
        events.append(event("response.output_item.done", {"output_index": 0, "item": item}))
        events.append(event("response.completed", {
            "response": response("completed", RESPONSES_USAGE)}))
        self.send_events(events, self.cut)

    def embeddings(self, body):
        self.send_json(200, {
            "object": "list", "model": body["model"],
            "data": [{"object": "embedding", "index": 0, "embedding": [0.25, 0.5, 0.75]}],
            "usage": {"prompt_tokens": 8, "total_tokens": 8},
        })

    # -- Anthropic messages ----------------------------------------------------------------

    def messages(self, body):
        model = body["model"]
        tools = [tool.get("name") for tool in body.get("tools") or []]
        said = decide(body, tools)
        thinking = (body.get("thinking") or {}).get("type") == "enabled"
        blocks = []
        if thinking:
            blocks.append({"type": "thinking", "thinking": "Let me think.",
                           "signature": SIGNATURE})
        if said[0] == "tools":
            blocks.append({"type": "text", "text": "Checking."})
            blocks += [{"type": "tool_use", "id": f"toolu_{number}", "name": name, "input": arguments}
                       for number, (name, arguments) in enumerate(said[1], 1)]
            stop = "tool_use"
        elif said[0] == "tool":
            blocks.append({"type": "text", "text": "Checking."})
            blocks.append({"type": "tool_use", "id": "toolu_1", "name": said[1],
                           "input": said[2]})
            stop = "tool_use"
        else:
            blocks.append({"type": "text", "text": said[1]})
            stop = "end_turn"

        def message(usage, content, stop_reason):
            return {"id": "msg_1", "type": "message", "role": "assistant", "model": model,
                    "content": content, "stop_reason": stop_reason, "stop_sequence": None,
                    "usage": usage}

        if not body.get("stream"):
            return self.send_json(200, message(ANTHROPIC_USAGE, blocks, stop))

        def event(kind, data):
            return sse({"type": kind, **data}, kind)

        events = [event("message_start", {
            "message": message(dict(ANTHROPIC_USAGE, output_tokens=1), [], None)})]
        for index, block in enumerate(blocks):
            events += self.block_events(event, index, block)
            if index == 0:
                # Cumulative: the last delta's count is the output, never the sum.
                events.append(event("message_delta", {
                    "delta": {"stop_reason": None, "stop_sequence": None},
                    "usage": {"output_tokens": 40}}))
        events.append(event("message_delta", {
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": ANTHROPIC_USAGE["output_tokens"]}}))
        events.append(event("message_stop", {}))
        self.send_events(events, self.cut)

    def block_events(self, event, index, block):
        """One content block as a stream: its start, its deltas in two pieces, its stop."""
        kind = block["type"]
        if kind == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": block["thinking"]},
                      {"type": "signature_delta", "signature": block["signature"]}]
        elif kind == "tool_use":
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            text = json.dumps(block["input"])
            half = len(text) // 2
            deltas = [{"type": "input_json_delta", "partial_json": text[:half]},
                      {"type": "input_json_delta", "partial_json": text[half:]}]
        else:
            start = {"type": "text", "text": ""}
            words = block["text"].split(" ")
            half = max(1, len(words) // 2)
            pieces = [" ".join(words[:half]) + (" " if len(words) > half else ""),
                      " ".join(words[half:])]
            if self.deltas:
                pieces = ["word "] * self.deltas
            deltas = [{"type": "text_delta", "text": piece} for piece in pieces if piece]
        return ([event("content_block_start", {"index": index, "content_block": start})]
                + [event("content_block_delta", {"index": index, "delta": delta})
                   for delta in deltas]
                + [event("content_block_stop", {"index": index})])

    def count_tokens(self, body):
        self.send_json(200, {"input_tokens": 42})

    # -- a paid API ------------------------------------------------------------------------

    def paid_api(self):
        path, _, query = self.path[len("/api/"):].partition("?")
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        headers = {name.lower(): value for name, value in self.headers.items()}
        with LOCK:
            REQUESTS.append({"path": self.path.split("?")[0], "headers": headers,
                             "body": {"path": path, "query": pairs}})
        if [value for name, value in pairs if name == "key"] != [API_SECRET]:
            data = b"bad key"
            status = 401
        elif path in ("search", "slow"):
            if path == "slow":
                time.sleep(1.5)
            q = next((value for name, value in pairs if name == "q"), None)
            return self.send_json(200, {"q": q, "results": ["one", "two"]})
        elif path == "big":
            data, status = b"x" * (2 * 1024 * 1024), 200
        elif path == "redirect":
            # A careless (or hostile) API sending its callers elsewhere.
            self.send_response(302)
            self.send_header("location", "/stolen")
            self.send_header("content-length", "0")
            self.end_headers()
            return
        else:
            data, status = b"broken", 500
        self.send_response(status)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def store_config(url, key_file, model="openai/gpt-test"):
    """A gateway's `[store]` with one OpenAI provider, this stand-in at `url` (its key in
    `key_file`), and one model of it, `model`."""
    return (
        "[store]\n[[store.providers]]\n"
        f'name = "oa"\nkind = "openai"\nbase_url = "{url}/v1"\ncredential_file = "{key_file}"\n\n'
        "[[store.models]]\n"
        f'id = "{model}"\nprovider = "oa"\nupstream = "{model.split("/")[-1]}"\n'
        'context_window = 100000\nmax_output = 1000\ninput = "2.50"\noutput = "10"\n'
    )


class StandIn:
    """A stand-in serving on a free loopback port, in this process."""

    def __init__(self, url, server=None, process=None):
        self.url = url
        self.server = server
        self.process = process

    @classmethod
    def start(cls):
        """In this process, on a thread of its own."""
        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return cls(f"http://127.0.0.1:{server.server_address[1]}", server)

    @classmethod
    def spawn(cls):
        """As a process of its own (`python3 -m tests.support.standin`), as suites share it."""
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        process = subprocess.Popen([sys.executable, "-m", "tests.support.standin"], cwd=root,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"the stand-in did not start (exit {process.wait()})")
        return cls(json.loads(line)["url"], process=process)

    def _call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read() or b"null")

    def script(self, name, steps):
        """Registers a scripted conversation (see the module's text)."""
        self._call("POST", "/_standin/scripts", {"name": name, "steps": steps})

    def requests(self, marker=None):
        """Every request it received (`{path, headers, body}`), or those whose body
        mentions `marker`."""
        seen = self._call("GET", "/_standin/requests")
        return [r for r in seen if marker is None or marker in json.dumps(r["body"])]

    @property
    def seen(self):
        """The requests as (headers, body) pairs, oldest first."""
        return [(r["headers"], r["body"]) for r in self.requests()]

    def close(self):
        if self.server is not None:
            self.server.shutdown()
        if self.process is not None:
            self.process.stdin.close()
            self.process.wait(timeout=10)


def main():
    standin = StandIn.start()
    print(json.dumps({"url": standin.url}), flush=True)
    sys.stdin.read()
    standin.close()


if __name__ == "__main__":
    main()
