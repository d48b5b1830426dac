"""What a new user meets first, against real processes: unknown fields refused over HTTP (the official client sees
a 400 naming the field), and `helios chat` at a terminal (a pty) surviving Ctrl-C."""
import signal
import time

import httpx
import openai
import pytest

from _server import Server

pexpect = pytest.importorskip("pexpect")


@pytest.fixture(scope="module")
def server(tiny_folder):
    s = Server("--model", str(tiny_folder), "--served-model-name", "tiny", "--page-size", "16",
               "--kv-cache-bytes", str(1 << 20))
    yield s
    assert s.stop() == 0


MESSAGES = [{"role": "user", "content": "Name three colours."}]


def test_a_misspelt_field_is_a_400_in_openais_shape(server):
    r = httpx.post(server.url + "/v1/chat/completions", headers=server.headers, timeout=60,
                   json={"model": "tiny", "messages": MESSAGES, "max_token": 8})
    assert r.status_code == 400
    assert r.json() == {"error": {"message": "max_token: unknown field; did you mean 'max_tokens'?",
                                  "type": "invalid_request_error", "param": "max_token", "code": None}}
    r = httpx.post(server.url + "/v1/completions", headers=server.headers, timeout=60,
                   json={"model": "tiny", "prompt": "hi", "temprature": 0.5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "temprature"


def test_the_official_client_sees_the_field_named(server):
    client = server.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4,
                                       extra_body={"response_fromat": {"type": "json_object"}})
    assert e.value.status_code == 400 and "did you mean 'response_format'?" in str(e.value)
    # OpenAI's own fields with no effect here pass, through the client's typed arguments
    answer = client.chat.completions.create(model="tiny", messages=MESSAGES, max_completion_tokens=4, temperature=0,
                                            store=False, metadata={"run": "test"}, service_tier="auto", user="u",
                                            seed=1, prompt_cache_key="k", safety_identifier="s")
    assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == 4
    completion = client.completions.create(model="tiny", prompt="hi", max_tokens=4, best_of=1, user="u")
    assert completion.usage.completion_tokens <= 4


def wait_for_prompt(chat, timeout: float = 120):
    chat.expect_exact("> ", timeout=timeout)


def interruptible():
    """In the child: Ctrl-C as a terminal gives it. A shell that started these tests in the background (CI scripts,
    `cmd &`) hands its children SIGINT ignored, and Python then installs no KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_chat_in_a_terminal_survives_ctrl_c():
    """Default model, in a pty: an answer, Ctrl-C mid-answer (the program stays, the next prompt comes), the first
    question again through the arrow keys (readline's history) and its answer, /reset, then Ctrl-D: exit status 0
    and no traceback."""
    chat = pexpect.spawn("helios", ["chat", "--threads", "2", "--max-tokens", "400", "--temperature", "0"],
                         encoding="utf-8", timeout=180, dimensions=(40, 200), preexec_fn=interruptible)
    try:
        wait_for_prompt(chat)
        chat.sendline("What is the capital of France? Answer in one word.")
        wait_for_prompt(chat)
        assert "Paris" in chat.before
        chat.sendline("Write a long story about a dragon who learns to cook.")
        chat.expect(r"\w+ \w+ \w+", timeout=120)   # the answer has started streaming
        time.sleep(0.5)
        chat.sendintr()                             # Ctrl-C mid-answer
        chat.expect_exact("[stopped]", timeout=30)
        wait_for_prompt(chat, timeout=30)
        assert chat.isalive()
        chat.send("\x1b[A\x1b[A\r")                # up, up, Enter: readline recalls the first question
        wait_for_prompt(chat)
        assert "Paris" in chat.before and "^[[A" not in chat.before, chat.before   # it answers again
        chat.sendline("/reset")
        chat.expect_exact("(conversation cleared)", timeout=10)
        wait_for_prompt(chat, timeout=10)
        chat.sendeof()                              # Ctrl-D at the prompt
        chat.expect(pexpect.EOF, timeout=60)
        output = chat.before
    finally:
        chat.close(force=True)
    assert chat.exitstatus == 0 and chat.signalstatus is None
    assert "Traceback" not in output


def test_chat_ctrl_c_at_the_prompt_exits_cleanly():
    chat = pexpect.spawn("helios", ["chat", "--threads", "2"], encoding="utf-8", timeout=180, preexec_fn=interruptible)
    try:
        wait_for_prompt(chat)
        chat.sendintr()
        chat.expect(pexpect.EOF, timeout=60)
        output = chat.before
    finally:
        chat.close(force=True)
    assert chat.exitstatus == 0 and "Traceback" not in output
