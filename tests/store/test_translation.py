"""Calls answered by the other family's models: the official OpenAI SDK calling an Anthropic
model through `/openai/v1/chat/completions`, and the official Anthropic SDK calling an OpenAI
model through `/anthropic/v1/messages`. The gateway translates the request and the answer
(whole, streamed, tool calls, errors) and bills from the provider's own usage."""

import json

import anthropic
import openai
import pytest

from tests.support import standin

HEADER = "x-sandbase-store-request"
# Anthropic's usage in the stand-in: 100 input × 3 + 30 cache reads × 0.30 + 20 cache
# writes × 3.75 + 77 output × 15, per million tokens (as tests/store/test_anthropic.py).
COST = 1539
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


def client(gateway, key):
    return openai.OpenAI(base_url=f"{gateway.url}/openai/v1", api_key=key, max_retries=0)


def test_a_chat_completion_is_answered_by_an_anthropic_model(gateway, key):
    before = gateway.available(key)
    raw = client(gateway, key).chat.completions.with_raw_response.create(
        model="anthropic/claude-test", temperature=1.5, stop="END",
        messages=[{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "hi"}])
    completion = raw.parse()
    assert completion.choices[0].message.content == standin.TEXT
    assert completion.choices[0].finish_reason == "stop"
    assert completion.model == "anthropic/claude-test"
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (150, 77)
    assert completion.usage.prompt_tokens_details.cached_tokens == 30
    headers, sent = gateway.seen[-1]
    # Sent as Anthropic's Messages request, with the operator's Anthropic key.
    assert headers["x-api-key"] == standin.ANTHROPIC_SECRET and key not in str(headers)
    assert sent == {"model": "claude-test", "max_tokens": 4096, "system": "Be brief.",
                    "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                    "temperature": 1.0, "stop_sequences": ["END"]}
    record = gateway.store_request(key, raw.headers[HEADER])
    assert record["credits_micro"] == COST
    assert gateway.available(key) == before - COST


def test_a_stream_arrives_as_chunks_with_its_usage_when_asked(gateway, key):
    raw = client(gateway, key).chat.completions.with_raw_response.create(
        model="anthropic/claude-test", messages=[{"role": "user", "content": "hi"}],
        stream=True, stream_options={"include_usage": True})
    chunks = list(raw.parse())
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == standin.TEXT
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 77
    assert gateway.store_request(key, raw.headers[HEADER])["credits_micro"] == COST
    # Without include_usage, no usage chunk (and the call is billed all the same).
    quiet = client(gateway, key).chat.completions.with_raw_response.create(
        model="anthropic/claude-test", messages=[{"role": "user", "content": "hi"}], stream=True)
    assert all(chunk.usage is None for chunk in quiet.parse())
    assert gateway.store_request(key, quiet.headers[HEADER])["credits_micro"] == COST


def test_tool_calls_go_both_ways(gateway, key):
    sdk = client(gateway, key)
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = sdk.chat.completions.create(model="anthropic/claude-test", messages=asked,
                                        tools=WEATHER, tool_choice="required",
                                        parallel_tool_calls=False)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    call = choice.message.tool_calls[0]
    assert (call.id, call.function.name) == ("toolu_1", "get_weather")
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    _, sent = gateway.seen[-1]
    assert sent["tools"][0]["input_schema"]["required"] == ["city"]
    assert sent["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    # The tool's result sent back, as OpenAI clients do.
    answered = asked + [choice.message.model_dump(exclude_none=True),
                        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 °C"}]
    second = sdk.chat.completions.create(model="anthropic/claude-test", messages=answered,
                                         tools=WEATHER)
    assert second.choices[0].message.content == "SUNNY"
    _, sent = gateway.seen[-1]
    assert sent["messages"][1]["content"][1] == {
        "type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
    assert sent["messages"][2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny, 21 °C"}]}
    # Streamed: the call's id and name first, its arguments in pieces.
    chunks = list(sdk.chat.completions.create(model="anthropic/claude-test", messages=asked,
                                              tools=WEATHER, stream=True))
    calls = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices[0].delta.tool_calls]
    assert (calls[0].id, calls[0].function.name) == ("toolu_1", "get_weather")
    assert "".join(c.function.arguments for c in calls) == '{"city": "Paris"}'
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_what_has_no_counterpart_is_refused_and_upstream_errors_keep_their_status(gateway, key):
    sdk = client(gateway, key)
    before = gateway.available(key)
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        sdk.chat.completions.create(model="anthropic/claude-test", n=2,
                                    messages=[{"role": "user", "content": "hi"}])
    assert "`n` above 1" in refused.value.message
    with pytest.raises(openai.InternalServerError) as overloaded:
        sdk.chat.completions.create(model="anthropic/claude-test",
                                    messages=[{"role": "user", "content": "overloaded"}])
    assert overloaded.value.status_code == 529
    assert overloaded.value.body["type"] == "overloaded_error"
    assert overloaded.value.body["message"] == "Overloaded"
    assert gateway.available(key) == before


# The OpenAI stand-in's chat usage: 800 uncached × 2.50 + 200 cached × 1.25 + 50 out × 10.
CHAT_COST = 2750
WEATHER_TOOL = [{"name": "get_weather", "description": "The weather in a city",
                 "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]


def claude_client(gateway, key):
    return anthropic.Anthropic(base_url=f"{gateway.url}/anthropic", api_key=key, max_retries=0)


def test_messages_are_answered_by_an_openai_model(gateway, key):
    before = gateway.available(key)
    raw = claude_client(gateway, key).messages.with_raw_response.create(
        model="openai/gpt-test", max_tokens=100, stop_sequences=["END"],
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": "hi"}])
    message = raw.parse()
    assert message.content[0].text == standin.TEXT and message.stop_reason == "end_turn"
    assert message.model == "openai/gpt-test"
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens,
            message.usage.output_tokens) == (800, 200, 50)
    headers, sent = gateway.seen[-1]
    assert headers["authorization"] == f"Bearer {standin.OPENAI_SECRET}" and key not in str(headers)
    assert sent == {"model": "gpt-test", "max_completion_tokens": 100, "stop": ["END"],
                    "messages": [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "hi"}]}
    assert gateway.store_request(key, raw.headers[HEADER])["credits_micro"] == CHAT_COST
    assert gateway.available(key) == before - CHAT_COST
    # Streamed: Anthropic's events, the usage in the final message.
    with claude_client(gateway, key).messages.stream(
            model="openai/gpt-test", max_tokens=100,
            messages=[{"role": "user", "content": "hi"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == standin.TEXT
    assert (final.stop_reason, final.usage.output_tokens) == ("end_turn", 50)


def test_tool_use_goes_both_ways_with_an_openai_model(gateway, key):
    sdk = claude_client(gateway, key)
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = sdk.messages.create(model="openai/gpt-test", max_tokens=100, messages=asked,
                                tools=WEATHER_TOOL, tool_choice={"type": "any"})
    use = first.content[-1]
    assert first.stop_reason == "tool_use"
    assert (use.type, use.id, use.name, use.input) == ("tool_use", "call_1", "get_weather",
                                                       {"city": "Paris"})
    _, sent = gateway.seen[-1]
    assert sent["tools"][0]["function"]["parameters"] == WEATHER_TOOL[0]["input_schema"]
    assert sent["tool_choice"] == "required"
    answered = asked + [{"role": "assistant", "content": [block.model_dump() for block in first.content]},
                        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                                      "content": "sunny"}]}]
    sdk.messages.create(model="openai/gpt-test", max_tokens=100, messages=answered,
                        tools=WEATHER_TOOL)
    _, sent = gateway.seen[-1]
    assert sent["messages"][1]["tool_calls"][0]["function"] == {
        "name": "get_weather", "arguments": '{"city":"Paris"}'}
    assert sent["messages"][2] == {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    with sdk.messages.stream(model="openai/gpt-test", max_tokens=100, messages=asked,
                             tools=WEATHER_TOOL) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert (final.content[0].name, final.content[0].input) == ("get_weather", {"city": "Paris"})
    # An OpenAI refusal keeps its status, in Anthropic's shape.
    with pytest.raises(anthropic.RateLimitError) as limited:
        sdk.messages.create(model="openai/gpt-test", max_tokens=10,
                            messages=[{"role": "user", "content": "busy"}])
    assert limited.value.body["error"]["type"] == "rate_limit_error"
