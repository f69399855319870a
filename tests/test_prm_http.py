"""`qwen-prm-http:PATH@URL`: Qwen2.5-Math-PRM behind vLLM's OpenAI-compatible server (`/pooling`).

On this CPU: vLLM's CPU build serves the tiny stand-in of tests/test_prm_vllm.py in its own process,
and the scores over HTTP equal the transformers path's (`qwen-prm:PATH`) to 1e-4, one per step, the
same tokens counted. Without a server: the spec's refusals, and the reader's two reply shapes (rows
at `<extra_0>` only, or every token's row) and its one-line errors, on replies made up here."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import httpx
import pytest

from reward_models.load import check_spec, load_verifier
from reward_models.prm_families.base import PRMCheckpointError
from tests.test_prm_families import _paths
from tests.test_prm_vllm import prm, rows  # noqa: F401  (fixtures: the stand-in PRM and its world rows)
from tests.test_vllm_cpu import WHY_NO_VLLM, _env

_CLIENT = httpx.Client  # the real one: _fake_server replaces httpx.Client with one answered here


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(prm):  # noqa: F811
    from transformers import AutoTokenizer

    if WHY_NO_VLLM is not None:
        pytest.skip(WHY_NO_VLLM)
    folder, _ = prm
    tag = AutoTokenizer.from_pretrained(folder).convert_tokens_to_ids("<extra_0>")
    port = _free_port()
    # vLLM pools this architecture at <extra_0>: the published tokenizer's id unless told the stand-in's
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--runner", "pooling",
           "--dtype", "float32", "--enforce-eager", "--port", str(port), "--served-model-name", "standin",
           "--pooler-config", json.dumps({"step_tag_id": tag})]
    log = open(folder.parent / "server.log", "w")  # noqa: SIM115  (closed below)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env())
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while time.time() < deadline:
            if proc.poll() is not None:
                tail = (folder.parent / "server.log").read_text()[-2000:]
                pytest.fail(f"the vLLM server exited ({proc.returncode}): {tail}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(2)
        else:
            pytest.fail("the vLLM server did not start within 300 s")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.mark.slow
def test_scores_over_http_equal_the_transformers_path(prm, rows, server):  # noqa: F811
    folder, _ = prm
    questions, paths = _paths(rows)
    hf = load_verifier(f"qwen-prm:{folder}", None)
    expected = hf.score(questions, paths)
    remote = load_verifier(f"qwen-prm-http:{folder}@{server}", None, device="cpu")  # as PPO loads it
    got = remote.score(questions, paths)
    assert [len(s) for s in got] == [len(steps) for steps in paths]
    for a, b in zip(got, expected):
        assert a == pytest.approx(b, abs=1e-4)
    assert remote.tokens_used == hf.tokens_used > 0
    assert remote.model_name == "standin"
    remote.close()


def test_the_spec_is_checked_before_anything_loads(prm):  # noqa: F811
    folder, _ = prm
    with pytest.raises(ValueError, match=r"expected qwen-prm-http:PATH@URL"):
        check_spec(f"qwen-prm-http:{folder}")
    with pytest.raises(ValueError, match=r"must start with http:// or https://, got 'ftp://host'"):
        check_spec(f"qwen-prm-http:{folder}@ftp://host")
    with pytest.raises(ValueError, match=r"no such model directory"):
        check_spec(f"qwen-prm-http:{folder}-missing@http://127.0.0.1:1")
    check_spec(f"qwen-prm-http:{folder}@http://127.0.0.1:1")  # the form alone: no server is asked
    with pytest.raises(PRMCheckpointError, match=r"no vLLM server answers at http://127.0.0.1:1/v1/models"):
        load_verifier(f"qwen-prm-http:{folder}@http://127.0.0.1:1", None)


def _fake_server(monkeypatch, reply):
    """httpx.Client answered by `reply(request_body) -> dict` for /pooling, one model at /v1/models."""
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "prm", "max_model_len": 4096}]})
        body = json.loads(request.content)
        seen.append(body)
        return httpx.Response(200, json=reply(body))

    monkeypatch.setattr(httpx, "Client", lambda **kw: _CLIENT(transport=httpx.MockTransport(handler), **kw))
    return seen


def test_every_token_rows_are_read_at_the_separators_and_bad_replies_are_refused(prm, rows, monkeypatch):  # noqa: F811
    folder, _ = prm
    questions, paths = _paths(rows)

    def every_token(body):  # row k: P(positive) = k / 1000, so the picked rows name their positions
        return {"data": [{"index": i, "data": [[1 - k / 1000, k / 1000] for k in range(len(ids))]}
                         for i, ids in reversed(list(enumerate(body["input"])))]}  # out of order on purpose

    seen = _fake_server(monkeypatch, every_token)
    remote = load_verifier(f"qwen-prm-http:{folder}@http://fake:8000", None)
    got = remote.score(questions[:3], paths[:3])
    assert seen[0]["model"] == "prm" and seen[0]["task"] == "token_classify" and not seen[0]["add_special_tokens"]
    for i in range(3):
        ids, positions = remote.encode(questions[i], paths[i], i)
        assert seen[0]["input"][i] == ids
        assert got[i] == pytest.approx([k / 1000 for k in positions])

    _fake_server(monkeypatch, lambda body: {"data": [{"index": i, "data": [[0.5, 0.5]] * 2}
                                                     for i in range(len(body["input"]))]})
    remote = load_verifier(f"qwen-prm-http:{folder}@http://fake:8000", None)
    one_step = next(i for i, steps in enumerate(paths) if len(steps) != 2)
    with pytest.raises(RuntimeError, match=r"returned 2 rows for \d+ steps in \d+ tokens"):
        remote.score([questions[one_step]], [paths[one_step]])
    _fake_server(monkeypatch, lambda body: {"data": []})
    remote = load_verifier(f"qwen-prm-http:{folder}@http://fake:8000", None)
    with pytest.raises(RuntimeError, match=r"returned 0 results for 1 inputs"):
        remote.score(questions[:1], paths[:1])
