# A dependency-free smoke test of `fern serve` over HTTP (Python standard library only), for machines without
# Node.js, such as the GPU machine: starts the server with the given arguments, checks /health, /v1/models, a
# plain and a streamed chat completion (with usage), a second turn that hits the session cache, /metrics, and a
# clean exit on SIGTERM. Prints one line per check; exits non-zero on the first failure.
#   python3 tools/server_smoke.py build/fern [serve args...]
import json
import re
import signal
import subprocess
import sys
import time
import urllib.request


def post(base, path, body, stream=False):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer x"})
    with urllib.request.urlopen(req, timeout=300) as r:
        text = r.read().decode()
    if not stream:
        return json.loads(text)
    frames = [l[len("data: "):] for l in text.split("\n") if l.startswith("data: ")]
    assert frames[-1] == "[DONE]", frames[-3:]
    return [json.loads(f) for f in frames[:-1]]


def main():
    fern, args = sys.argv[1], sys.argv[2:]
    proc = subprocess.Popen([fern, "serve", "--port", "0", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    base = None
    t0 = time.time()
    for line in proc.stdout:
        m = re.search(r"on (http://\S+)/v1", line)
        if m:
            base = m.group(1)
            break
    assert base, "server did not start: " + proc.stderr.read()
    print(f"started in {time.time() - t0:.1f} s at {base}")
    ok = lambda what: print("ok", what, flush=True)
    with urllib.request.urlopen(base + "/health", timeout=10) as r:
        assert r.status == 200
    ok("/health")
    models = json.loads(urllib.request.urlopen(base + "/v1/models", timeout=10).read())
    model = models["data"][0]["id"]
    ok(f"/v1/models: {model}")
    msgs = [{"role": "user", "content": "Say hello in three words."}]
    t = time.time()
    r = post(base, "/v1/chat/completions", {"model": model, "messages": msgs, "max_tokens": 24, "temperature": 0})
    c = r["choices"][0]
    assert c["finish_reason"] in ("stop", "length"), c
    assert r["usage"]["completion_tokens"] > 0, r["usage"]
    ok(f"chat completion: {r['usage']['completion_tokens']} tokens in {time.time() - t:.2f} s, finish {c['finish_reason']}")
    chunks = post(base, "/v1/chat/completions", {"model": model, "messages": msgs, "max_tokens": 24, "temperature": 0,
                                                 "stream": True, "stream_options": {"include_usage": True}}, stream=True)
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    streamed = "".join((ch["choices"][0]["delta"].get("content") or "") + (ch["choices"][0]["delta"].get("reasoning_content") or "")
                       for ch in chunks if ch["choices"])
    plain = (c["message"].get("content") or "") + (c["message"].get("reasoning_content") or "")
    assert streamed == plain, (streamed, plain)
    ok(f"streamed completion: {len(chunks)} chunks, same text as the plain one (greedy)")
    msgs2 = msgs + [{"role": "assistant", "content": c["message"].get("content") or ""},
                    {"role": "user", "content": "Again, shorter."}]
    r2 = post(base, "/v1/chat/completions", {"model": model, "messages": msgs2, "max_tokens": 8, "temperature": 0})
    cached = r2["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
    assert cached > 0, r2["usage"]
    ok(f"second turn: {cached} of {r2['usage']['prompt_tokens']} prompt tokens from the session cache")
    metrics = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    assert "fern_" in metrics
    ok("/metrics")
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=30)
    assert code == 0, code
    ok("SIGTERM: exit 0")


if __name__ == "__main__":
    main()
