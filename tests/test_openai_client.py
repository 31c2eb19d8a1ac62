"""The official `openai` Python client against the real daemon over loopback TCP with an API key."""

from __future__ import annotations

import openai  # the dev extra installs it
import pytest

from serve_harness import KEY, STARTED, Daemon, b64png


@pytest.fixture(autouse=True)
def _no_daemon_left_behind():
    """Module-scoped daemons stay; any daemon a test started itself is stopped even when the test fails."""
    before = list(STARTED)
    yield
    for d in [d for d in STARTED if d not in before]:
        d.stop()


@pytest.fixture(scope="module")
def client(art_a, tmp_path_factory):
    d = Daemon(art_a, tmp_path_factory.mktemp("openai"))
    d.wait_ready()
    yield openai.OpenAI(base_url=f"{d.tcp}/v1", api_key=KEY, max_retries=0, timeout=60), d
    d.stop()


def _messages(text: str | None = "Read the text.") -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64png(21)}}]
    if text:
        parts.append({"type": "text", "text": text})
    return [{"role": "system", "content": "You read documents."}, {"role": "user", "content": parts}]


def test_models_list_and_retrieve(client):
    c, _ = client
    ids = [m.id for m in c.models.list()]
    assert ids == ["hunyuanocr"]
    assert c.models.retrieve("hunyuanocr").owned_by == "edgeocr"


def test_chat_completion_plain_and_streamed(client):
    c, _ = client
    r = c.chat.completions.create(model="hunyuanocr", messages=_messages(), max_tokens=5)
    assert r.object == "chat.completion" and r.model == "hunyuanocr"
    assert r.usage.completion_tokens == 5 and r.usage.prompt_tokens > 1000
    assert r.choices[0].finish_reason == "length" and isinstance(r.choices[0].message.content, str)
    chunks = list(c.chat.completions.create(model="hunyuanocr", messages=_messages(None), max_tokens=6, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finals == ["length"] and chunks[-1].usage.completion_tokens == 6
    plain = c.chat.completions.create(model="hunyuanocr", messages=_messages(None), max_tokens=6)
    assert text == plain.choices[0].message.content          # greedy: the stream spells the same text


def test_errors_reach_the_client_as_api_errors(client):
    c, d = client
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="hunyuanocr", messages=[{"role": "user", "content": "no image"}])
    assert e.value.status_code == 400 and "no image" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="hunyuanocr", messages=_messages(), max_tokens=10 ** 6)
    assert "exceeds the cap" in str(e.value)
    bad = openai.OpenAI(base_url=f"{d.tcp}/v1", api_key="wrong", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("gpt-4o")
