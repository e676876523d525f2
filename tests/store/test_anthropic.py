"""The official Anthropic SDK, unmodified but for its base URL, against the store."""

import anthropic
import pytest

from tests.support import standin

HEADER = "x-sandbase-store-request"
# 100 × 3 + 30 cached × 0.30 + 20 written × 3.75 + 77 out × 15, per million tokens.
COST = 1539


def client(gateway, key=None, token=None):
    return anthropic.Anthropic(base_url=f"{gateway.url}/anthropic", api_key=key,
                               auth_token=token, max_retries=0)


def ask(text="hi"):
    return [{"role": "user", "content": text}]


def test_messages_with_x_api_key_are_billed_to_the_micro_credit(gateway, key):
    before = gateway.available(key)
    raw = client(gateway, key).messages.with_raw_response.create(
        model="anthropic/claude-test", max_tokens=100, messages=ask())
    message = raw.parse()
    assert message.content[0].text == standin.TEXT
    record = gateway.store_request(key, raw.headers[HEADER])
    assert record["tokens"] == {"input": 100, "cached_input": 30, "cache_write": 20, "output": 77}
    assert record["credits_micro"] == COST
    assert gateway.available(key) == before - COST
    headers, sent = gateway.seen[-1]
    assert headers["x-api-key"] == standin.ANTHROPIC_SECRET
    assert headers["anthropic-version"]
    assert sent["model"] == "claude-test"


def test_a_stream_counts_the_last_delta_not_the_sum(gateway, key):
    sdk = client(gateway, token=key)
    with sdk.messages.stream(model="anthropic/claude-test", max_tokens=100,
                             messages=ask(), extra_headers={"anthropic-beta": "test-beta"}) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
        request_id = stream.response.headers[HEADER]
    assert text == standin.TEXT
    assert final.usage.output_tokens == 77
    assert gateway.seen[-1][0]["anthropic-beta"] == "test-beta"
    record = gateway.store_request(key, request_id)
    assert record["tokens"]["output"] == 77 and record["credits_micro"] == COST


def test_count_tokens_and_models(gateway, key):
    sdk = client(gateway, key)
    counted = sdk.messages.count_tokens(model="anthropic/claude-test", messages=ask())
    assert counted.input_tokens == 42
    # OpenAI's models too: messages reach them through translation.
    assert [model.id for model in sdk.models.list()] == [
        "openai/gpt-test", "anthropic/claude-test", "openai/gpt-dear"]


def test_refusals_raise_the_sdks_own_errors(gateway, key):
    with pytest.raises(anthropic.NotFoundError):
        client(gateway, key).messages.create(model="anthropic/nope", max_tokens=10,
                                             messages=ask())
    with pytest.raises(anthropic.AuthenticationError):
        client(gateway, "sb_not_a_key").messages.create(
            model="anthropic/claude-test", max_tokens=10, messages=ask())
    with pytest.raises(anthropic.RateLimitError):
        client(gateway, key).messages.create(model="anthropic/claude-test", max_tokens=10,
                                             messages=ask("busy"))
    with pytest.raises(anthropic.OverloadedError) as error:
        client(gateway, key).messages.create(model="anthropic/claude-test", max_tokens=10,
                                             messages=ask("overloaded"))
    assert error.value.response.headers["retry-after"] == "3"
