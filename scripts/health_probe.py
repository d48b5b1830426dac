"""How long /health takes to answer while a server works through one large request.

    python scripts/health_probe.py http://127.0.0.1:8000 [--api-key KEY] [--chars 663000 7800000]

For each size, one completions request whose prompt has that many characters is sent while /health is polled
every 10 ms; prints the request's status and the polls' median and maximum latency. Used for issue 18's
measurement (the event loop must not block on tokenization): run it against `helios serve` of the default model.
"""
import argparse
import json
import statistics
import threading
import time

import httpx

WORDS = "the quick brown fox jumps over a lazy dog and keeps running "


def probe(url: str, headers: dict, chars: int) -> tuple[str, list[float]]:
    raw = json.dumps({"prompt": (WORDS * (chars // len(WORDS) + 1))[:chars], "max_tokens": 1}).encode()
    done, latencies, answer = threading.Event(), [], {}

    def big():
        start = time.perf_counter()
        try:
            r = httpx.post(url + "/v1/completions", content=raw, timeout=600,
                           headers={**headers, "content-type": "application/json"})
            answer["text"] = f"{r.status_code} in {time.perf_counter() - start:.2f} s: {r.text[:90]}"
        except httpx.HTTPError as e:
            answer["text"] = f"{type(e).__name__} after {time.perf_counter() - start:.2f} s"
        done.set()

    thread = threading.Thread(target=big)
    thread.start()
    with httpx.Client(base_url=url, timeout=600) as client:
        while not done.is_set():
            start = time.perf_counter()
            client.get("/health")
            latencies.append(time.perf_counter() - start)
            time.sleep(0.01)
    thread.join()
    return answer["text"], latencies


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url")
    p.add_argument("--api-key", default=None)
    p.add_argument("--chars", type=int, nargs="+", default=[663_000, 7_800_000])
    args = p.parse_args()
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    for chars in args.chars:
        answer, lat = probe(args.url, headers, chars)
        print(f"prompt of {chars:,} characters -> {answer}")
        if lat: print(f"  /health: {len(lat)} polls, median {1000 * statistics.median(lat):.1f} ms, max {1000 * max(lat):.1f} ms")


if __name__ == "__main__":
    main()
