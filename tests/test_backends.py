"""The `openai` backend against a real server on loopback (`backends.serve` over a tiny
HF model), the server itself, the `vllm` backend's CPU behaviour, and the factory."""

import json
import sys
import threading
import types
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from backends import make_generator
from backends.base import SamplingParams
from backends.hf import HFGenerator
from backends.openai_compat import (
    OpenAICompatError,
    OpenAICompatGenerator,
    split_completion_tokens,
)
from backends.serve import CompletionServer
from reasoning.prompts import solve_prompt
from reasoning.steps import join_steps
from reasoning.world import WorldConfig, generate

ROOT = Path(__file__).resolve().parents[1]
NAME = "tiny-policy"
WORLD = WorldConfig(min_steps=1, max_steps=3)
FAST = dict(backoff_s=0.01, max_backoff_s=0.05)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny untrained Llama and a BPE tokenizer trained on world text, saved offline.

    Its projections are re-drawn with unit gain (std 1/sqrt(fan_in)): with the small default init
    and tied embeddings an untrained model only repeats its last token, and greedy agreement
    between backends would be trivially true."""
    import torch

    from reasoning.tokenizer import train_tokenizer
    from rl.models import build_tiny_causal_lm

    out = tmp_path_factory.mktemp("tiny")
    rows = generate("train", 100, 0, WORLD)
    tok = train_tokenizer([solve_prompt(r["question"]) + join_steps(r["steps"]) for r in rows], vocab_size=300)
    model = build_tiny_causal_lm(tok, hidden_size=32, num_layers=2, num_heads=2, seed=0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.normal_(0, p.shape[1] ** -0.5, generator=gen)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def hf(model_dir):
    return HFGenerator.from_pretrained(str(model_dir), batch_size=16, device="cpu")


@pytest.fixture(scope="module")
def server(model_dir):
    generator = HFGenerator.from_pretrained(str(model_dir), batch_size=16, device="cpu")
    with CompletionServer(generator, NAME, host="127.0.0.1", port=0) as srv:
        yield srv


@pytest.fixture
def client(server):
    with OpenAICompatGenerator(model=NAME, base_url=server.url, max_concurrency=4, **FAST) as gen:
        yield gen


@pytest.fixture(scope="module")
def prompts():
    return [solve_prompt(r["question"]) for r in generate("test", 12, 0, WORLD)]


def same(a, b):
    """Completions equal field by field (text, token counts, finish reason)."""
    assert [[(c.text, c.prompt_tokens, c.completion_tokens, c.finish_reason) for c in row] for row in a] == [
        [(c.text, c.prompt_tokens, c.completion_tokens, c.finish_reason) for c in row] for row in b
    ]


def test_greedy_equals_hf(client, hf, server, prompts):
    params = SamplingParams(max_new_tokens=20)
    batches_before = server.batches
    got = client.generate(prompts, params)
    same(got, hf.generate(prompts, params))
    assert all(len(row) == 1 for row in got) and got[0][0].prompt_tokens > 5
    assert len({row[0].text for row in got}) > len(prompts) // 2  # the model does not just repeat itself
    assert {c.finish_reason for row in got for c in row} <= {"stop", "length"}
    assert server.batches - batches_before <= len(prompts)
    assert client.stats["retries"] == 0 and client.stats["requests"] == len(prompts)


def test_stop_strings_behave_like_hf(client, hf, prompts):
    free = hf.generate(prompts, SamplingParams(max_new_tokens=20))
    # Stop strings the untrained model does produce: the commonest printable pairs in its output.
    pairs = Counter(c.text[k : k + 2] for row in free for c in row for k in range(2, len(c.text) - 1))
    pairs = Counter({p: k for p, k in pairs.items() if p.isascii() and p.isprintable()})
    stop = tuple(p for p, _ in pairs.most_common(2))
    params = SamplingParams(max_new_tokens=20, stop=stop)
    want = hf.generate(prompts, params)
    got = client.generate(prompts, params)
    same(got, want)
    stopped = [c for row in got for c in row if c.finish_reason == "stop" and c.text.endswith(stop)]
    assert len(stopped) >= 3, "the chosen stop strings should end several completions"
    assert client.stats["stop_guessed"] == client.stats["stop_unknown"] == 0  # the server gives stop_reason


def test_n_samples(client, hf, prompts):
    params = SamplingParams(max_new_tokens=12, temperature=1.0, n=4, seed=3)
    (got,) = client.generate(prompts[:1], params)
    (want,) = hf.generate(prompts[:1], params)  # one prompt: the server runs the very same generate call
    assert [c.text for c in got] == [c.text for c in want]
    assert len({c.text for c in got}) > 1
    assert sum(c.completion_tokens for c in got) == sum(c.completion_tokens for c in want)
    assert {c.prompt_tokens for c in got} == {want[0].prompt_tokens}
    many = client.generate(prompts[:5], SamplingParams(max_new_tokens=8, temperature=1.0, n=3, seed=0))
    assert [len(row) for row in many] == [3] * 5
    assert all(1 <= c.completion_tokens <= 8 for row in many for c in row)


def test_retries_on_503_then_succeeds(client, hf, server, prompts):
    server.fail_first = 2
    params = SamplingParams(max_new_tokens=6)
    with OpenAICompatGenerator(model=NAME, base_url=server.url, max_concurrency=1, max_retries=3, **FAST) as gen:
        got = gen.generate(prompts[:1], params)
    same(got, hf.generate(prompts[:1], params))
    assert server.counts["injected_503"] >= 2 and server.fail_first == 0
    assert gen.stats["retries"] == 2 and gen.stats["requests"] == 3


def test_gives_up_after_the_last_retry(server, prompts):
    server.fail_first = 10
    try:
        gen = OpenAICompatGenerator(model=NAME, base_url=server.url, max_retries=2, **FAST)
        with pytest.raises(OpenAICompatError, match=r"after 3 attempt\(s\).*HTTP 503") as info:
            gen.generate(prompts[:1], SamplingParams(max_new_tokens=4))
        assert info.value.status == 503 and info.value.attempts == 3
        assert "prompt 0 of 1" in str(info.value)
    finally:
        server.fail_first = 0


def test_4xx_is_not_retried(server, prompts):
    before = server.counts["completions"]
    gen = OpenAICompatGenerator(model="no-such-model", base_url=server.url, max_retries=3, **FAST)
    with pytest.raises(OpenAICompatError, match="404.*not retried") as info:
        gen.generate(prompts[:1], SamplingParams(max_new_tokens=4))
    assert info.value.status == 404 and info.value.attempts == 1
    assert server.counts["completions"] == before + 1
    bad = OpenAICompatGenerator(model=NAME, base_url=server.url, extra_body={"logprobs": 2}, **FAST)
    with pytest.raises(OpenAICompatError, match="logprobs") as info:
        bad.generate(prompts[:1], SamplingParams(max_new_tokens=4))
    assert info.value.status == 400 and bad.stats["requests"] == 1


def test_api_key_is_sent_as_bearer_and_never_leaks(model_dir, hf, prompts, monkeypatch, caplog, capsys):
    secret, wrong = "sk-test-9f8e7d6c5b4a", "sk-wrong-0123456789"
    monkeypatch.setenv("STEPRL_TEST_KEY", secret)
    monkeypatch.setenv("STEPRL_WRONG_KEY", wrong)
    caplog.set_level("DEBUG")
    params = SamplingParams(max_new_tokens=6)
    with CompletionServer(hf, NAME, port=0, api_key=secret) as srv:
        good = OpenAICompatGenerator(model=NAME, base_url=srv.url, api_key_env="STEPRL_TEST_KEY", **FAST)
        got = good.generate(prompts[:2], params)  # the server accepts only "Authorization: Bearer <secret>"
        assert good.models() == [NAME]
        messages = [repr(good), repr(good.config), repr(srv)]
        for env in ("STEPRL_WRONG_KEY", "STEPRL_UNSET_KEY"):
            gen = OpenAICompatGenerator(model=NAME, base_url=srv.url, api_key_env=env, max_retries=3, **FAST)
            with pytest.raises(OpenAICompatError, match="401") as info:
                gen.generate(prompts[:1], params)
            assert info.value.attempts == 1
            messages += [str(info.value), repr(info.value), repr(gen)]
        assert srv.counts["unauthorized"] == 2
    same(got, hf.generate(prompts[:2], params))
    captured = capsys.readouterr()
    everything = "\n".join(messages + [caplog.text, captured.out, captured.err])
    assert secret not in everything and wrong not in everything


def test_key_echoed_by_a_server_is_redacted(monkeypatch):
    """A server that echoes the Authorization header in its error body: the key stays out of the error."""

    class Echo(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            body = json.dumps({"error": {"message": f"bad header {self.headers['Authorization']}"}}).encode()
            self.send_response(400)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    secret = "sk-echo-5566778899"
    monkeypatch.setenv("STEPRL_TEST_KEY", secret)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        gen = OpenAICompatGenerator(model=NAME, base_url=f"http://127.0.0.1:{httpd.server_address[1]}/v1",
                                    api_key_env="STEPRL_TEST_KEY", **FAST)
        with pytest.raises(OpenAICompatError) as info:
            gen.generate(["x"], SamplingParams(max_new_tokens=2))
        assert "bad header Bearer ***" in str(info.value) and secret not in str(info.value)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_timeout_gives_a_clear_error(server, prompts):
    server.delay_s = 1.0
    try:
        gen = OpenAICompatGenerator(model=NAME, base_url=server.url, timeout_s=0.2, max_retries=1, **FAST)
        with pytest.raises(OpenAICompatError, match=r"after 2 attempt\(s\).*timed out after 0.2s") as info:
            gen.generate(prompts[:1], SamplingParams(max_new_tokens=4))
        assert info.value.status is None
    finally:
        server.delay_s = 0.0


def test_connection_refused_is_retried_then_reported():
    import socket

    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gen = OpenAICompatGenerator(model=NAME, base_url=f"http://127.0.0.1:{port}/v1", max_retries=2, **FAST)
    with pytest.raises(OpenAICompatError, match=r"after 3 attempt\(s\).*connection error"):
        gen.generate(["x"], SamplingParams(max_new_tokens=2))
    assert gen.stats["retries"] == 2


def test_server_speaks_the_openai_format(server):
    url = server.url
    r = httpx.post(f"{url}/completions", json={"model": NAME, "prompt": ["Question: a", "Question: b"],
                                                "max_tokens": 3, "temperature": 0, "n": 2})
    data = r.json()
    assert r.status_code == 200 and data["object"] == "text_completion" and data["model"] == NAME
    assert [c["index"] for c in data["choices"]] == [0, 1, 2, 3]
    assert data["usage"]["total_tokens"] == data["usage"]["prompt_tokens"] + data["usage"]["completion_tokens"]
    assert data["usage"]["completion_tokens"] <= 4 * 3
    assert httpx.get(f"{url}/models").json()["data"][0]["id"] == NAME
    for body, param in [({"prompt": "x", "stream": True}, "stream"), ({"max_tokens": 3}, "prompt"),
                        ({"prompt": "x", "n": 0}, "n"), ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
                        ({"prompt": "x", "temperature": "hot"}, "temperature"),
                        ({"prompt": "x", "stop": [""]}, "stop")]:
        r = httpx.post(f"{url}/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
    assert httpx.post(f"{url}/completions", content=b"{not json").status_code == 400
    assert httpx.post(f"{url}/chat/completions", json={}).status_code == 404


def test_stop_reason_missing_best_effort(client):
    """Servers without `stop_reason`: one stop string is re-appended (a guess, counted); several are not."""
    def answer(text, finish="stop", **extra):
        return {"choices": [{"index": 0, "text": text, "finish_reason": finish, **extra}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 3}}

    one = SamplingParams(max_new_tokens=3, stop=("</Step>",))
    (c,) = client._parse(answer("x = 1"), one)
    assert (c.text, c.finish_reason, c.prompt_tokens, c.completion_tokens) == ("x = 1</Step>", "stop", 5, 3)
    assert client.stats["stop_guessed"] == 1
    (c,) = client._parse(answer("x = 1", stop_reason=None), one)  # vLLM: None is EOS
    assert c.text == "x = 1"
    (c,) = client._parse(answer("x = 1", finish="length"), one)
    assert (c.text, c.finish_reason) == ("x = 1", "length")
    (c,) = client._parse(answer("a</Step>b", finish="length"), one)  # a server that ignored `stop`
    assert (c.text, c.finish_reason) == ("a</Step>", "stop")
    (c,) = client._parse(answer("x = 1"), SamplingParams(max_new_tokens=3, stop=("</Step>", "\n\n")))
    assert c.text == "x = 1" and client.stats["stop_unknown"] == 1
    with pytest.raises(OpenAICompatError, match="expected 2 choice"):
        client._parse(answer("x"), SamplingParams(n=2))


def test_split_completion_tokens():
    assert split_completion_tokens(10, ["a", "bbb"], ["stop", "stop"], 8) == [3, 7]
    assert split_completion_tokens(20, ["aaaa", "b", "cc"], ["length", "stop", "stop"], 8) == [8, 5, 7]
    counts = split_completion_tokens(17, ["x" * 5, "y" * 9, ""], ["stop"] * 3, 16)
    assert sum(counts) == 17 and counts[1] > counts[0] > counts[2] >= 0
    assert sum(split_completion_tokens(5, ["a", "b"], ["length", "length"], 8)) == 5  # inconsistent total


def test_vllm_absent_gives_a_clear_error():
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here; the missing-vllm error cannot be shown")
    from backends.vllm import VLLMGenerator

    with pytest.raises(ImportError, match=r"pip install 'steprl\[vllm\]'"):
        VLLMGenerator("any/model")
    with pytest.raises(ImportError, match=r"steprl\[vllm\]"):
        make_generator("vllm", "any/model")


def test_vllm_backend_maps_params_and_outputs(monkeypatch):
    """The conversion both ways, through a stand-in `vllm` module (the real engine needs a GPU;
    scripts/gpu_smoke_vllm.py runs it there)."""
    seen = {}

    class FakeSamplingParams:
        def __init__(self, **kwargs):
            seen["sampling"] = kwargs

    class FakeTokenizer:
        def encode(self, text, add_special_tokens=True):
            seen.setdefault("add_special_tokens", add_special_tokens)
            return list(range(len(text.split())))

    class FakeLLM:
        def __init__(self, **kwargs):
            seen["engine"] = kwargs

        def get_tokenizer(self):
            return FakeTokenizer()

        def generate(self, inputs, sampling_params, use_tqdm=True):
            out = types.SimpleNamespace
            return [out(prompt_token_ids=i["prompt_token_ids"], outputs=[
                out(index=1, text="b</Step>", token_ids=[5, 6, 7], finish_reason="stop", stop_reason="</Step>"),
                out(index=0, text="a a a", token_ids=[1, 2, 3, 4], finish_reason="length", stop_reason=None),
            ]) for i in inputs]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=FakeLLM, SamplingParams=FakeSamplingParams))
    from backends.vllm import VLLMGenerator

    gen = make_generator("vllm", "some/model", dtype="float32", enforce_eager=True)
    assert isinstance(gen, VLLMGenerator)
    assert seen["engine"]["enable_prefix_caching"] is True and seen["engine"]["enforce_eager"] is True
    rows = gen.generate(["one two three", "four"], SamplingParams(max_new_tokens=4, n=2, stop=["</Step>"], seed=7))
    assert seen["sampling"] == dict(n=2, temperature=0.0, top_p=1.0, max_tokens=4, stop=["</Step>"],
                                    include_stop_str_in_output=True, seed=7)
    assert seen["add_special_tokens"] is False
    assert [(c.text, c.prompt_tokens, c.completion_tokens, c.finish_reason) for c in rows[0]] == [
        ("a a a", 3, 4, "length"), ("b</Step>", 3, 3, "stop")]
    assert rows[1][0].prompt_tokens == 1


def test_factory(model_dir, server):
    assert isinstance(make_generator("hf", str(model_dir), device="cpu", batch_size=2), HFGenerator)
    gen = make_generator("openai", NAME, base_url=server.url, max_concurrency=2)
    assert isinstance(gen, OpenAICompatGenerator) and gen.config.max_concurrency == 2
    assert gen.generate(["Question: x"], SamplingParams(max_new_tokens=2))[0][0].completion_tokens >= 1
    with pytest.raises(ValueError, match="hf, vllm, openai"):
        make_generator("tgi", "m")
    with pytest.raises(ValueError, match="served model name"):
        make_generator("openai", "")


def test_serve_cli(model_dir, monkeypatch):
    """The `python -m backends.serve` path in-process: arguments, model loading, the key."""
    from backends import serve

    with pytest.raises(ValueError, match="not set"):
        serve.parse_args(["--model", str(model_dir), "--api_key_env", "STEPRL_UNSET_KEY"])
    monkeypatch.setenv("STEPRL_CLI_KEY", "sk-cli-424242")
    args = serve.parse_args(["--model", str(model_dir), "--port", "0", "--served_model_name", NAME,
                             "--device", "cpu", "--api_key_env", "STEPRL_CLI_KEY"])
    with serve.build_server(args) as srv:
        info = srv.describe()
        assert info == {"serving": NAME, "url": srv.url, "device": "cpu", "auth": True}
        assert info["url"].startswith("http://127.0.0.1:") and "sk-cli" not in json.dumps(info)
        gen = OpenAICompatGenerator(model=NAME, base_url=info["url"], api_key_env="STEPRL_CLI_KEY", **FAST)
        ((c,),) = gen.generate(["Question: Ava has 3 apples."], SamplingParams(max_new_tokens=5))
    assert 1 <= c.completion_tokens <= 5 and c.prompt_tokens > 3
    assert serve.main(["--port", "0"]) == 2


def test_a_server_that_ignores_n_gets_one_request_per_sample():
    """`transformers serve` answers one choice whatever `n` says: the rest are asked for one by one."""
    bodies = []

    class OneChoice(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append(body)
            answer = {"choices": [{"index": 0, "text": f"sample seed={body.get('seed')}", "finish_reason": "stop"}],
                      "usage": {"prompt_tokens": 4, "completion_tokens": 2}}
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), OneChoice)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        gen = OpenAICompatGenerator(model=NAME, base_url=f"http://127.0.0.1:{httpd.server_address[1]}/v1",
                                    max_concurrency=1, **FAST)
        out = gen.generate(["a", "b"], SamplingParams(max_new_tokens=2, temperature=1.0, n=4, seed=7))
        assert [len(row) for row in out] == [4, 4]
        assert [c.text for c in out[0]] == [f"sample seed={s}" for s in (7, 8, 9, 10)]
        assert all((c.prompt_tokens, c.completion_tokens) == (4, 2) for row in out for c in row)
        # the first prompt asks for n=4 once, then 3 single requests; the second goes one by one at once
        assert [(b["prompt"], b["n"]) for b in bodies] == [("a", 4)] + [("a", 1)] * 3 + [("b", 1)] * 4
        assert gen.stats["n_ignored"] == 1 and gen.stats["requests"] == 8
        unseeded = gen.generate(["c"], SamplingParams(max_new_tokens=2, temperature=1.0, n=2))
        assert len(unseeded[0]) == 2 and all("seed" not in b for b in bodies[-2:])
    finally:
        httpd.shutdown()
        httpd.server_close()
# ------------------------------------------------------------------ the server's limits


def _raw_post(url: str, body: bytes | str, timeout: float = 10.0) -> httpx.Response:
    return httpx.post(f"{url}/completions", content=body if isinstance(body, bytes) else body.encode(),
                      headers={"Content-Type": "application/json"}, timeout=timeout)


def test_server_refuses_what_would_stall_it(server):
    """Each of these used to hang the worker (and every later request) or answer 500."""
    import time

    url, context = server.url, server.context_tokens
    assert context == 1024  # the tiny model's max_position_embeddings
    start = time.monotonic()
    cases = [
        ('{"prompt": "Hal has", "max_tokens": 1000000000000}', "max_tokens", "maximum context length is 1024"),
        (json.dumps({"prompt": "Hal has " * 131072, "max_tokens": 4}), "prompt", "maximum context length"),  # 1 MB
        ('{"prompt": "", "max_tokens": 4}', "prompt", "must not be empty"),
        ('{"prompt": [], "max_tokens": 4}', "prompt", "non-empty list"),
        (json.dumps({"prompt": ["a"] * 65}), "prompt", "at most 64 prompts"),
        ('{"prompt": "a", "n": 1000000}', "n", "at most 16"),
        (json.dumps({"prompt": "a", "stop": [str(i) for i in range(17)]}), "stop", "at most 16 stop"),
        ('{"prompt": "a", "seed": ' + str(2**80) + "}", "seed", "seed must be an integer in"),
        ('{"prompt": "a", "temperature": NaN}', "temperature", "finite"),
        ('{"prompt": "a", "temperature": Infinity}', "temperature", "finite"),
        ('{"prompt": "a", "top_p": -Infinity}', "top_p", "finite"),
        ('{"prompt": "a", "temperature": 1%s}' % ("0" * 400), "temperature", "finite"),
        ("[" * 100_000, None, "nested too deeply"),
        ('{"prompt": "a", "max_tokens": 1%s}' % ("0" * 5000), None, "not JSON"),
    ]
    for body, param, message in cases:
        r = _raw_post(url, body)
        assert r.status_code == 400, (body[:60], r.status_code, r.text[:200])
        assert r.json()["error"]["param"] == param and message in r.json()["error"]["message"], r.text[:300]
    r = httpx.post(f"{url}/completions", json={"prompt": "a", "max_tokens": 1024})  # 1 prompt token + 1024 > 1024
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    assert _raw_post(url, b"x" * (server.limits.max_body_bytes + 1)).status_code == 413
    assert time.monotonic() - start < 20
    assert httpx.get(f"{url.removesuffix('/v1')}/health").json()["status"] == "ok"
    r = httpx.post(f"{url}/completions", json={"prompt": "Hal has", "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3


def test_a_prompt_too_long_in_characters_is_refused_before_it_is_tokenised(server, hf):
    """A 2 MB prompt used to be tokenised (seconds of CPU) before its 400, slowing every other request."""
    counted: list[int] = []
    real = server._count_tokens

    def counting(texts):
        counted.extend(len(t) for t in texts)
        return real(texts)

    server._count_tokens = counting
    try:
        r = _raw_post(server.url, json.dumps({"prompt": "Hal has " * 262144, "max_tokens": 4}))  # 2 MB
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        assert "maximum context length is 1024" in r.json()["error"]["message"] and counted == []
        # a prompt within the bound is still counted, and refused by its tokens when they do not fit
        bound = (1024 - 4) * hf.max_token_chars
        near = "Hal has " * (bound // 8)
        assert len(near) <= bound and hf.count_tokens([near])[0] + 4 > 1024
        r = _raw_post(server.url, json.dumps({"prompt": near, "max_tokens": 4}))
        assert r.status_code == 400 and counted == [len(near)]
    finally:
        server._count_tokens = real


def test_the_character_bound_never_refuses_a_prompt_that_fits(hf):
    from backends.prompt_limits import max_prompt_chars, prompts_fit

    texts = ["Hal has 3 apples. " * k for k in (1, 10, 60, 200, 2000)] + ["x" * 5000, "9" * 3000, " " * 4000]
    counts = hf.count_tokens(texts)
    for max_new in (1, 100, 1000):
        by_count = [n + max_new <= 1024 for n in counts]
        assert prompts_fit(texts, 1024, max_new, hf.count_tokens, hf.max_token_chars) == by_count
        bound = max_prompt_chars(1024, max_new, hf.max_token_chars)
        assert all(not fits for t, fits in zip(texts, by_count) if len(t) > bound)


class SlowGenerator:
    """One 'token' per 10 ms up to max_new_tokens; stops early when `should_stop()` says so."""

    context_length = 1_000_000

    def __init__(self):
        self.stopped = threading.Event()
        self.calls = 0

    def count_tokens(self, texts):
        return [len(t) for t in texts]

    def generate(self, prompts, params, should_stop=None):
        import time

        from backends.base import Completion

        self.calls += 1
        done = 0
        while done < params.max_new_tokens:
            if should_stop is not None and should_stop():
                self.stopped.set()
                break
            time.sleep(0.01)
            done += 1
        return [[Completion("x", len(p), done, "length")] * params.n for p in prompts]


def _send_and_leave(url: str, body: dict) -> None:
    """Send a whole completion request, then close the connection without reading the answer."""
    import socket

    host, port = url.removeprefix("http://").removesuffix("/v1").split(":")
    data = json.dumps(body).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(data), data))


def test_generation_stops_when_its_client_leaves_or_its_deadline_passes():
    import time

    from backends.serve import ServerLimits

    slow = SlowGenerator()
    with CompletionServer(slow, NAME, port=0, batch_wait_s=0, limits=ServerLimits(request_timeout_s=1.0)) as srv:
        _send_and_leave(srv.url, {"prompt": "a", "max_tokens": 100_000})  # 1,000 s of generation
        assert slow.stopped.wait(5), "generation went on after its client left"
        start = time.monotonic()
        r = httpx.post(f"{srv.url}/completions", json={"prompt": "a", "max_tokens": 3}, timeout=10)
        assert r.status_code == 200 and time.monotonic() - start < 2
        assert srv.counts["disconnected"] == 1 and srv._batcher.cancelled_batches == 1

        slow.stopped.clear()
        start = time.monotonic()
        r = httpx.post(f"{srv.url}/completions", json={"prompt": "a", "max_tokens": 100_000}, timeout=10)
        assert r.status_code == 504 and "request_timeout_s" in r.json()["error"]["message"]
        assert slow.stopped.wait(2) and time.monotonic() - start < 3
        assert srv.health()["admitted"] == 0


def test_a_half_sent_request_is_dropped_after_the_read_timeout():
    import socket
    import time

    from backends.serve import ServerLimits

    with CompletionServer(SlowGenerator(), NAME, port=0, limits=ServerLimits(read_timeout_s=0.3)) as srv:
        host, port = srv.httpd.server_address[:2]
        for partial in (b"POST /v1/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"pro",
                        b"POST /v1/completions HTTP/1.1\r\nContent-Le", b""):
            with socket.create_connection((host, port)) as sock:
                sock.settimeout(5)
                sock.sendall(partial)
                start = time.monotonic()
                answer = b""
                while chunk := sock.recv(4096):  # the server closes the connection
                    answer += chunk
                assert time.monotonic() - start < 3
                assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:100]


def test_sixty_concurrent_requests_are_all_answered_with_a_bounded_queue(model_dir):
    """A burst larger than the queue: every connection is accepted (backlog), the server answers each
    with 200 or a quick 503 + Retry-After (never a refused connection or a timeout), in seconds."""
    import socket
    import time
    from concurrent.futures import ThreadPoolExecutor

    from backends.serve import ServerLimits

    generator = HFGenerator.from_pretrained(str(model_dir), batch_size=16, device="cpu")
    with CompletionServer(generator, NAME, port=0, limits=ServerLimits(max_queued_requests=8)) as srv:
        host, port = srv.httpd.server_address[:2]
        body = json.dumps({"prompt": "Question: Hal has 3 apples.", "max_tokens": 8, "temperature": 0}).encode()
        request = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        ready = threading.Barrier(60)

        def one(_):
            ready.wait()
            try:
                with socket.create_connection((host, port), timeout=30) as sock:
                    sock.sendall(request)
                    answer = b""
                    while chunk := sock.recv(65536):
                        answer += chunk
            except OSError as err:
                return type(err).__name__
            head = answer.split(b"\r\n\r\n")[0]
            return int(head.split()[1]) if head else "empty", b"Retry-After: 1" in head

        start = time.monotonic()
        with ThreadPoolExecutor(60) as pool:
            results = list(pool.map(one, range(60)))
        elapsed = time.monotonic() - start
    statuses = Counter(r[0] if isinstance(r, tuple) else r for r in results)
    assert set(statuses) <= {200, 503}, statuses
    assert statuses[200] >= 8 and all(retry for status, retry in results if status == 503)
    assert elapsed < 30, elapsed
    print(f"60 concurrent requests: {dict(statuses)} in {elapsed:.1f}s")


def test_hf_generation_stops_when_asked(hf, prompts):
    params = SamplingParams(max_new_tokens=40, temperature=0)
    (stopped,) = hf.generate(prompts[:1], params, should_stop=lambda: True)
    assert stopped[0].completion_tokens <= 1 and stopped[0].finish_reason in ("length", "stop")
    assert hf.count_tokens(["Hal has", ""]) [1] == 0 and hf.context_length == 1024
