"""The shared stand-in's scripted conversations and failures, through a real gateway with the
official clients: what the harness suites build on. A script is chosen by a marker in the
first user message, so tests running at once share one stand-in process."""

import json
import uuid

import anthropic
import openai

HEADER = "x-sandbase-store-request"
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def test_a_scripted_conversation_calls_a_tool_then_answers_from_its_result(gateway, key):
    script = f"weather-{uuid.uuid4().hex[:8]}"
    gateway.provider.script(script, [
        {"tool": "get_weather", "arguments": {"city": "Oslo"}},
        {"text": "It is cold in Oslo"},
    ])
    client = openai.OpenAI(base_url=f"{gateway.url}/openai/v1", api_key=key, max_retries=0)
    asked = [{"role": "user", "content": f"[[script:{script}]] What is the weather?"}]
    first = client.chat.completions.create(model="openai/gpt-test", messages=asked, tools=WEATHER)
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    asked += [first.choices[0].message.model_dump(exclude_none=True),
              {"role": "tool", "tool_call_id": call.id, "content": "-5 C"}]
    second = client.chat.completions.create(model="openai/gpt-test", messages=asked,
                                            tools=WEATHER)
    assert second.choices[0].message.content == "It is cold in Oslo"
    # The same script, streamed to an Anthropic model through translation.
    stream = client.chat.completions.create(
        model="anthropic/claude-test", stream=True, tools=WEATHER,
        messages=[{"role": "user", "content": f"[[script:{script}]] again"}])
    arguments = "".join(chunk.choices[0].delta.tool_calls[0].function.arguments or ""
                        for chunk in stream
                        if chunk.choices and chunk.choices[0].delta.tool_calls)
    assert json.loads(arguments) == {"city": "Oslo"}
    # The request log says which calls reached the provider.
    reached = gateway.provider.requests(f"[[script:{script}]]")
    assert [request["path"] for request in reached] == [
        "/v1/chat/completions", "/v1/chat/completions", "/v1/messages"]


def test_thinking_comes_back_signed_and_a_stream_cut_before_its_final_usage_bills_what_came(
        gateway, key):
    client = anthropic.Anthropic(base_url=f"{gateway.url}/anthropic", api_key=key, max_retries=0)
    thought = client.messages.with_raw_response.create(
        model="anthropic/claude-test", max_tokens=2048,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[{"role": "user", "content": "think first"}])
    message = thought.parse()
    assert message.content[0].type == "thinking" and message.content[0].signature
    # Settled (its debit booked) before the balance is read.
    gateway.store_request(key, thought.headers[HEADER])
    before = gateway.available(key)
    raw = client.messages.with_raw_response.create(
        model="anthropic/claude-test", max_tokens=100, stream=True,
        messages=[{"role": "user", "content": "[[cut]] a story"}])
    request_id = raw.headers[HEADER]
    try:
        for _ in raw.parse():
            pass
    except anthropic.APIError:
        pass
    record = gateway.store_request(key, request_id)
    # The final count (77 output tokens) never came: the call is billed for the input and the
    # output its stream did report (40 so far, more than its deltas carried), estimated.
    assert (record["tokens"]["output"], record["estimated"]) == (40, True)
    assert before - gateway.available(key) == record["credits_micro"] > 0
    # 200 deltas then the connection closes: at least a token a delta is billed, not the
    # single output token `message_start` reported.
    raw = client.messages.with_raw_response.create(
        model="anthropic/claude-test", max_tokens=1000, stream=True,
        messages=[{"role": "user", "content": "[[cut]] [[deltas:200]] a long story"}])
    received = 0
    try:
        for event in raw.parse():
            received += event.type == "content_block_delta"
    except anthropic.APIError:
        pass
    assert received == 200
    record = gateway.store_request(key, raw.headers[HEADER])
    assert record["estimated"] is True, record
    assert record["tokens"]["output"] >= 200, record
    assert record["tokens"]["input"] > 0, record
