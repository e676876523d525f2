"""The official OpenAI SDK, unmodified but for its base URL, against the store."""

import openai
import pytest

from tests.support import standin

HEADER = "x-sandbase-store-request"
# 800 uncached × 2.50 + 200 cached × 1.25 + 50 out × 10, per million tokens.
CHAT_COST = 2750


def client(gateway, key):
    return openai.OpenAI(base_url=f"{gateway.url}/openai/v1", api_key=key, max_retries=0)


def ask(text="hi"):
    return [{"role": "user", "content": text}]


def test_chat_is_forwarded_and_billed_to_the_micro_credit(gateway, key):
    before = gateway.available(key)
    raw = client(gateway, key).chat.completions.with_raw_response.create(
        model="openai/gpt-test", messages=ask(), max_tokens=100)
    completion = raw.parse()
    assert completion.choices[0].message.content == standin.TEXT
    assert completion.usage.prompt_tokens == 1000
    record = gateway.store_request(key, raw.headers[HEADER])
    assert record["credits_micro"] == CHAT_COST
    assert record["tokens"] == {"input": 800, "cached_input": 200, "cache_write": 0, "output": 50}
    assert gateway.available(key) == before - CHAT_COST
    headers, sent = gateway.seen[-1]
    assert headers["authorization"] == f"Bearer {standin.OPENAI_SECRET}"
    assert sent["model"] == "gpt-test"
    assert key not in str(headers)


def test_a_stream_without_include_usage_is_metered_and_shows_no_usage(gateway, key):
    raw = client(gateway, key).chat.completions.with_raw_response.create(
        model="openai/gpt-test", messages=ask(), stream=True)
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == standin.TEXT
    assert all(chunk.usage is None for chunk in chunks)
    assert gateway.seen[-1][1]["stream_options"] == {"include_usage": True}
    assert gateway.store_request(key, raw.headers[HEADER])["credits_micro"] == CHAT_COST


def test_a_stream_with_include_usage_shows_it(gateway, key):
    chunks = list(client(gateway, key).chat.completions.create(
        model="openai/gpt-test", messages=ask(), stream=True,
        stream_options={"include_usage": True}))
    usage = [chunk.usage for chunk in chunks if chunk.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == 50


def test_responses_stream_is_metered_from_response_completed(gateway, key):
    before = gateway.available(key)
    raw = client(gateway, key).responses.with_raw_response.create(
        model="openai/gpt-test", input="hi", stream=True)
    events = list(raw.parse())
    completed = [event for event in events if event.type == "response.completed"]
    assert completed and completed[0].response.usage.output_tokens == 40
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert deltas == standin.TEXT
    # 400 × 2.50 + 100 × 1.25 + 40 × 10.
    assert gateway.store_request(key, raw.headers[HEADER])["credits_micro"] == 1525
    assert gateway.available(key) == before - 1525


def test_embeddings_and_models(gateway, key):
    sdk = client(gateway, key)
    embedding = sdk.embeddings.create(model="openai/gpt-test", input="hello")
    assert embedding.data[0].embedding == [0.25, 0.5, 0.75]
    ids = [model.id for model in sdk.models.list()]
    # Anthropic's model too: chat completions reach it through translation.
    assert ids == ["openai/gpt-test", "anthropic/claude-test", "openai/gpt-dear"]


def test_refusals_raise_the_sdks_own_errors(gateway, key):
    sdk = client(gateway, key)
    with pytest.raises(openai.NotFoundError) as error:
        sdk.chat.completions.create(model="openai/nope", messages=ask())
    assert error.value.code == "model_not_found"
    with pytest.raises(openai.AuthenticationError):
        client(gateway, "sb_not_a_key").chat.completions.create(
            model="openai/gpt-test", messages=ask())
    with pytest.raises(openai.RateLimitError) as error:
        sdk.chat.completions.create(model="openai/gpt-test", messages=ask("busy"))
    assert error.value.response.headers["retry-after"] == "7"
    with pytest.raises(openai.InternalServerError) as error:
        sdk.chat.completions.create(model="openai/gpt-test", messages=ask("broken"))
    assert error.value.status_code == 500
    # 10 starter credits cannot cover 100 000 output tokens at 1000 credits per million.
    with pytest.raises(openai.APIStatusError) as error:
        sdk.chat.completions.create(model="openai/gpt-dear", messages=ask())
    assert error.value.status_code == 402
    assert error.value.code == "insufficient_credits"
