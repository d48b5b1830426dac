"""A real `helios serve` with a KV pool far smaller than its load and a host tier: preemption and host hits over HTTP."""
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from _server import Server

PAGE = 16
PAGE_BYTES = PAGE * 2 * 2 * 2 * 32 * 4  # the tiny checkpoint: 2 layers, 2 KV heads of 32, float32


@pytest.fixture(scope="module")
def server(tiny_folder):
    s = Server("--model", str(tiny_folder), "--served-model-name", "tiny", "--page-size", str(PAGE),
               "--kv-cache-bytes", str(8 * PAGE_BYTES), "--kv-offload-bytes", str(16 * PAGE_BYTES),
               "--max-batch-size", "8", "--prefill-chunk-size", "64", "--kv-cache-dtype", "float32")  # PAGE_BYTES' pages
    yield s
    assert s.stop() == 0


def complete(server, prompt, max_tokens):
    return server.client().completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                              extra_body={"ignore_eos": True})


def tiers(server) -> dict:
    pages = httpx.get(server.url + "/health").json()["kv_pages"]
    for tier in pages.values(): assert tier["free"] + tier["used"] + tier["cached"] == tier["total"]
    return pages


def test_a_pool_too_small_preempts_and_every_answer_matches_it_alone(server):
    prompts = [f"Request number {i}: tell me about the weather in town {i}." for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda p: complete(server, p, 40), prompts))
    assert server.metric("helios:num_preemptions_total") > 0
    for prompt, out in zip(prompts, together):
        assert out.usage.completion_tokens == 40
        assert out.choices[0].text == complete(server, prompt, 40).choices[0].text
    server.wait_idle()
    pages = tiers(server)
    assert pages["device"]["total"] == 8 and pages["host"]["total"] == 16 and pages["host"]["used"] == 0


def test_a_prefix_pushed_off_the_device_is_a_host_hit(server):
    prefix = "The quick brown fox jumps over the lazy dog. " * 8      # 80 tokens: 5 full pages of 16
    first = complete(server, prefix + "First?", 2)
    for i in range(3): complete(server, f"Something unrelated, number {i}, " * 10, 2)  # fill the device pool
    hits_before = server.metric("helios:prefix_cache_host_hits_total")
    again = complete(server, prefix + "Second?", 2)
    assert again.usage.prompt_tokens_details.cached_tokens >= 4 * PAGE
    assert server.metric("helios:prefix_cache_host_hits_total") > hits_before
    assert server.metric('helios:kv_offload_bytes_total') > 0 and first.usage.completion_tokens == 2
    text = httpx.get(server.url + "/metrics", headers=server.headers).text
    for state in ("total", "free", "used", "cached"):
        for tier in ("device", "host"):
            assert f'helios:kv_tier_pages{{model_name="tiny",state="{state}",tier="{tier}"}}' in text
    assert "helios:kv_offload_seconds_total" in text and "helios:recompute_tokens_total" in text
    tiers(server)
