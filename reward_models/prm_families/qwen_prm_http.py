"""Qwen2.5-Math-PRM behind a vLLM server: `qwen-prm-http:PATH@URL`.

For a PRM that lives on another machine (a GPU server) while the policy trains or the inference
method runs here. The server is vLLM's OpenAI-compatible one serving the PRM as a pooling model:

    vllm serve Qwen/Qwen2.5-Math-PRM-7B --runner pooling --port 8000
    # or: python -m vllm.entrypoints.openai.api_server --model PATH --runner pooling --port 8000

PATH is a local copy of the same checkpoint's tokenizer files (tokenizer.json, tokenizer_config.json,
the chat template; no weights needed) and URL the server's address (`http://host:8000`). The input
is rendered and encoded here by `qwen-prm`'s own `render` (the model card's chat template, an
`<extra_0>` after each step), so the token ids and the score positions are the transformers path's;
they go to the server's `/pooling` endpoint as token ids (task `token_classify`), and a step's score
is the positive class of the row at its `<extra_0>`. vLLM serves this architecture with step pooling
on `<extra_0>` (the published tokenizer's id, 151651, unless `--pooler-config` names another), so it
returns one row per step; a server configured to return every token's row is read at the positions.

Before scoring: the tokenizer must carry `<extra_0>` and a chat template (as `qwen-prm` asks), and
the server must answer `/v1/models`; what fails is said in one line naming the URL.
"""

from __future__ import annotations

from collections.abc import Sequence

from reward_models.prm_families import qwen_prm
from reward_models.prm_families.base import (
    Checkpoint,
    FamilyVerifier,
    PRMCheckpointError,
    PRMFamily,
    load_tokenizer,
)
from reward_models.verifier import validate_paths

NAME = "qwen-prm-http"
USAGE = f"{NAME}:PATH@URL (PATH: the PRM's tokenizer files here; URL: its vLLM server, http://host:port)"


def split_spec(rest: str) -> tuple[str, str]:
    """(PATH, URL) of `PATH@URL`; ValueError in one line when either is missing or the URL is not http(s)."""
    path, at, url = rest.rpartition("@")
    if not at or not path or not url:
        raise ValueError(f"verifier {NAME}: expected {USAGE}, got {rest!r}")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"verifier {NAME}: the server address must start with http:// or https://, got {url!r}")
    return path, url.rstrip("/")


class HTTPQwenPRM(FamilyVerifier):
    """`qwen-prm` scoring with the forward pass on a vLLM server: one `/pooling` request per batch."""

    def __init__(self, spec: str, batch_size: int = 16, timeout: float = 600.0):
        import httpx

        path, self.url = split_spec(spec)
        self.family = qwen_prm.FAMILY
        self.tokenizer = load_tokenizer(path, NAME, chat_template=True, tokens=(qwen_prm.SEPARATOR,))
        self.batch_size = batch_size
        self.tokens_used = 0
        self.client = httpx.Client(timeout=timeout)
        try:
            listed = self.client.get(f"{self.url}/v1/models")
            listed.raise_for_status()
            served = listed.json()["data"]
        except (httpx.HTTPError, ValueError, KeyError) as err:
            raise PRMCheckpointError(f"{NAME}:{spec}: no vLLM server answers at {self.url}/v1/models "
                                     f"({type(err).__name__}: {err})") from None
        if not served:
            raise PRMCheckpointError(f"{NAME}:{spec}: the server at {self.url} serves no model")
        self.model_name = served[0]["id"]
        self.max_length = served[0].get("max_model_len")

    def score(self, questions: Sequence[str], paths: Sequence[Sequence[str]]) -> list[list[float]]:
        validate_paths(questions, paths)
        out: list[list[float]] = []
        for start in range(0, len(paths), self.batch_size):
            rows = range(start, min(start + self.batch_size, len(paths)))
            encoded = [self.encode(questions[i], paths[i], i) for i in rows]
            data = self._pool([ids for ids, _ in encoded])
            self.tokens_used += sum(len(ids) for ids, _ in encoded)
            for i, (item, (ids, positions)) in zip(rows, zip(data, encoded)):
                if len(item) == len(positions):  # step pooling: the rows at <extra_0>, in order
                    picked = item
                elif len(item) == len(ids):  # every token's row
                    picked = [item[k] for k in positions]
                else:
                    raise RuntimeError(f"row {i}: the server at {self.url} returned {len(item)} rows for "
                                       f"{len(positions)} steps in {len(ids)} tokens")
                out.append([float(p[1]) for p in picked])
        return out

    def _pool(self, inputs: list[list[int]]) -> list[list[list[float]]]:
        """The server's per-row class probabilities for each input, in input order."""
        import httpx

        body = {"model": self.model_name, "input": inputs, "task": "token_classify", "add_special_tokens": False}
        try:
            reply = self.client.post(f"{self.url}/pooling", json=body)
            reply.raise_for_status()
            data = sorted(reply.json()["data"], key=lambda d: d["index"])
        except (httpx.HTTPError, ValueError, KeyError) as err:
            raise RuntimeError(f"{NAME}: the server at {self.url}/pooling failed: {type(err).__name__}: "
                               f"{err}") from None
        if len(data) != len(inputs):
            raise RuntimeError(f"{NAME}: the server at {self.url} returned {len(data)} results for {len(inputs)} "
                               f"inputs")
        return [d["data"] for d in data]

    def close(self) -> None:
        self.client.close()


def recognise(ckpt: Checkpoint) -> str | None:
    return None  # a server is asked for by name; `auto:` picks `qwen-prm` for this architecture


FAMILY = PRMFamily(name=NAME, summary="Qwen2.5-Math-PRM on a vLLM server (/pooling): P(positive) at each "
                                      "<extra_0> of its chat template, as qwen-prm",
                   recognise=recognise, build=lambda spec, batch_size: HTTPQwenPRM(spec, batch_size),
                   spec_path=lambda rest: split_spec(rest)[0])
