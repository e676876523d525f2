"""A local stand-in for the model providers, speaking their documented wire formats.

OpenAI: chat completions (whole, and streamed with ``stream_options.include_usage``),
Responses (whole and streamed, usage in ``response.completed``) and embeddings. Anthropic:
messages (whole, and streamed with cumulative ``message_delta`` usage) and token counting.
It answers only to the operator's credential. The last user message steers it: ``broken``
(500), ``overloaded`` (Anthropic's 529), ``busy``
answers 429 with ``Retry-After``, ``slow`` answers after a second (a call that stays in
flight). Anthropic, given tools: ``weather`` asks for the first tool with ``{"city": "Paris"}``
(its JSON streamed in two pieces); a tool's result is answered with ``SUNNY``. OpenAI chat,
given tools: ``weather`` calls the first tool with ``{"city": "Paris"}`` the same way.
"""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

OPENAI_SECRET = "upstream-secret-openai"
ANTHROPIC_SECRET = "upstream-secret-anthropic"
TEXT = "Hello from the stand-in"

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


def last_text(body):
    messages = body.get("messages") or []
    if messages and isinstance(messages[-1].get("content"), str):
        return messages[-1]["content"]
    if messages and isinstance(messages[-1].get("content"), list):
        return "".join(block.get("text") or "" for block in messages[-1]["content"])
    return body.get("input") if isinstance(body.get("input"), str) else ""


class Handler(BaseHTTPRequestHandler):
    seen = []

    def log_message(self, *args):
        pass

    def send_json(self, status, body, headers=()):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def send_events(self, events):
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        for event in events:
            self.wfile.write(event.encode())
            self.wfile.flush()
            time.sleep(0.005)
        self.close_connection = True

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        Handler.seen.append(({k.lower(): v for k, v in self.headers.items()}, body))
        anthropic = self.path.startswith("/v1/messages")
        if anthropic:
            allowed = self.headers.get("x-api-key") == ANTHROPIC_SECRET
        else:
            allowed = self.headers.get("authorization") == f"Bearer {OPENAI_SECRET}"
        if not allowed:
            return self.send_json(401, {"error": {"message": "bad key"}})
        if "broken" in last_text(body):
            return self.send_json(500, {"error": {"message": "broke", "type": "server_error"}})
        if "overloaded" in last_text(body):
            error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
            return self.send_json(529, error, [("retry-after", "3")])
        if "slow" in last_text(body):
            time.sleep(1)
        if "busy" in last_text(body):
            error = {"error": {"message": "slow down", "type": "rate_limit_error"}}
            return self.send_json(429, error, [("retry-after", "7")])
        route = {
            "/v1/chat/completions": self.chat,
            "/v1/responses": self.openai_responses,
            "/v1/embeddings": self.embeddings,
            "/v1/messages": self.messages,
            "/v1/messages/count_tokens": self.count_tokens,
        }.get(self.path)
        if route is None:
            return self.send_json(404, {"error": {"message": "no such route"}})
        route(body)

    def chat(self, body):
        model = body["model"]
        if body.get("tools") and "weather" in last_text(body):
            return self.chat_tool_call(body)
        if not body.get("stream"):
            return self.send_json(200, {
                "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model,
                "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                             "message": {"role": "assistant", "content": TEXT}}],
                "usage": CHAT_USAGE,
            })
        with_usage = (body.get("stream_options") or {}).get("include_usage") is True

        def chunk(delta, finish=None):
            data = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                    "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            if with_usage:
                data["usage"] = None
            return f"data: {json.dumps(data)}\n\n"

        events = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": word}) for word in TEXT.split(" ") if word]
        events.append(chunk({}, "stop"))
        if with_usage:
            usage = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                     "model": model, "choices": [], "usage": CHAT_USAGE}
            events.append(f"data: {json.dumps(usage)}\n\n")
        events.append("data: [DONE]\n\n")
        self.send_events(events)

    def chat_tool_call(self, body):
        model, name = body["model"], body["tools"][0]["function"]["name"]
        if not body.get("stream"):
            call = {"id": "call_1", "type": "function",
                    "function": {"name": name, "arguments": '{"city": "Paris"}'}}
            return self.send_json(200, {
                "id": "chatcmpl-2", "object": "chat.completion", "created": 1, "model": model,
                "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": None,
                             "message": {"role": "assistant", "content": None,
                                         "tool_calls": [call]}}],
                "usage": CHAT_USAGE})

        def chunk(delta, finish=None, usage=None):
            data = {"id": "chatcmpl-2", "object": "chat.completion.chunk", "created": 1,
                    "model": model, "usage": usage,
                    "choices": [] if usage else [{"index": 0, "delta": delta,
                                                  "finish_reason": finish}]}
            return f"data: {json.dumps(data)}\n\n"

        self.send_events([
            chunk({"role": "assistant", "content": None, "tool_calls": [
                {"index": 0, "id": "call_1", "type": "function",
                 "function": {"name": name, "arguments": ""}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
            chunk({}, "tool_calls"),
            chunk(None, usage=CHAT_USAGE),
            "data: [DONE]\n\n",
        ])

    def response_object(self, model, status, usage):
        output = [] if status != "completed" else [{
            "type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": TEXT, "annotations": []}],
        }]
        return {
            "id": "resp_1", "object": "response", "created_at": 1, "status": status,
            "model": model, "output": output, "usage": usage, "parallel_tool_calls": True,
            "tool_choice": "auto", "tools": [], "error": None, "incomplete_details": None,
            "instructions": None, "metadata": {}, "temperature": 1.0, "top_p": 1.0,
        }

    def openai_responses(self, body):
        model = body["model"]
        if not body.get("stream"):
            return self.send_json(200, self.response_object(model, "completed", RESPONSES_USAGE))

        def event(kind, data, number):
            data = {"type": kind, "sequence_number": number, **data}
            return f"event: {kind}\ndata: {json.dumps(data)}\n\n"

        events = [event("response.created",
                        {"response": self.response_object(model, "in_progress", None)}, 0)]
        for number, word in enumerate(TEXT.split(" "), start=1):
            events.append(event("response.output_text.delta", {
                "item_id": "msg_1", "output_index": 0, "content_index": 0,
                "delta": word if number == 1 else f" {word}", "logprobs": [],
            }, number))
        events.append(event("response.completed", {
            "response": self.response_object(model, "completed", RESPONSES_USAGE)}, 99))
        self.send_events(events)

    def embeddings(self, body):
        self.send_json(200, {
            "object": "list", "model": body["model"],
            "data": [{"object": "embedding", "index": 0, "embedding": [0.25, 0.5, 0.75]}],
            "usage": {"prompt_tokens": 8, "total_tokens": 8},
        })

    def messages(self, body):
        model = body["model"]
        last = (body.get("messages") or [{}])[-1].get("content")
        if body.get("tools") and isinstance(last, list):
            if any(block.get("type") == "tool_result" for block in last):
                return self.send_json(200, {
                    "id": "msg_3", "type": "message", "role": "assistant", "model": model,
                    "content": [{"type": "text", "text": "SUNNY"}], "stop_reason": "end_turn",
                    "stop_sequence": None, "usage": ANTHROPIC_USAGE})
            if any("weather" in (block.get("text") or "") for block in last):
                return self.tool_use(body)

        def message(usage, content, stop):
            return {"id": "msg_1", "type": "message", "role": "assistant", "model": model,
                    "content": content, "stop_reason": stop, "stop_sequence": None,
                    "usage": usage}

        if not body.get("stream"):
            text = [{"type": "text", "text": TEXT}]
            return self.send_json(200, message(ANTHROPIC_USAGE, text, "end_turn"))
        start_usage = dict(ANTHROPIC_USAGE, output_tokens=1)

        def event(kind, data):
            return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"

        self.send_events([
            event("message_start", {"message": message(start_usage, [], None)}),
            event("content_block_start",
                  {"index": 0, "content_block": {"type": "text", "text": ""}}),
            event("content_block_delta",
                  {"index": 0, "delta": {"type": "text_delta", "text": "Hello from "}}),
            # Cumulative: the last delta's count is the output, never the sum.
            event("message_delta", {"delta": {"stop_reason": None, "stop_sequence": None},
                                    "usage": {"output_tokens": 40}}),
            event("content_block_delta",
                  {"index": 0, "delta": {"type": "text_delta", "text": "the stand-in"}}),
            event("content_block_stop", {"index": 0}),
            event("message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                    "usage": {"output_tokens": 77}}),
            event("message_stop", {}),
        ])

    def tool_use(self, body):
        name = body["tools"][0]["name"]
        usage = dict(ANTHROPIC_USAGE)
        if not body.get("stream"):
            return self.send_json(200, {
                "id": "msg_2", "type": "message", "role": "assistant", "model": body["model"],
                "content": [{"type": "text", "text": "Checking."},
                            {"type": "tool_use", "id": "toolu_1", "name": name,
                             "input": {"city": "Paris"}}],
                "stop_reason": "tool_use", "stop_sequence": None, "usage": usage})

        def event(kind, data):
            return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"

        self.send_events([
            event("message_start", {"message": {
                "id": "msg_2", "type": "message", "role": "assistant", "model": body["model"],
                "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": dict(usage, output_tokens=1)}}),
            event("content_block_start", {"index": 0, "content_block": {
                "type": "tool_use", "id": "toolu_1", "name": name, "input": {}}}),
            event("content_block_delta", {"index": 0, "delta": {
                "type": "input_json_delta", "partial_json": '{"city": '}}),
            event("content_block_delta", {"index": 0, "delta": {
                "type": "input_json_delta", "partial_json": '"Paris"}'}}),
            event("content_block_stop", {"index": 0}),
            event("message_delta", {"delta": {"stop_reason": "tool_use", "stop_sequence": None},
                                    "usage": {"output_tokens": 77}}),
            event("message_stop", {}),
        ])

    def count_tokens(self, body):
        self.send_json(200, {"input_tokens": 42})


def start():
    """Starts the stand-in on a free loopback port: (base URL, the requests it saw)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", Handler.seen
