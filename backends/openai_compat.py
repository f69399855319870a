"""`openai` backend: any OpenAI-compatible server through the plain-text `/v1/completions` endpoint.

Works with vLLM's server, `python -m backends.serve` (this toolkit's small server),
and hosted APIs that still offer text completions. Our prompts are plain text, so the chat
endpoint is never used.

One HTTP request per prompt (its `n` completions come back as `n` choices), up to
`max_concurrency` requests in flight. Some servers ignore `n` (`transformers serve` answers one
choice whatever `n` says): when an answer has fewer choices than asked, the missing ones are asked
for one request each (`n=1`; with a `seed`, request j uses `seed + j` so that the samples differ),
and from then on this generator asks such a server for one choice per request
(`stats["n_ignored"]` counts the prompts where that happened).

Connection errors, timeouts, 408, 429 and 5xx answers are retried with exponential backoff and
jitter (honouring `Retry-After`); other 4xx answers are not. After the last attempt an
`OpenAICompatError` says what went wrong.

How the server's answer becomes our `Completion`:

- **Stop strings.** OpenAI-style servers drop the matched stop string from the text; our
  convention keeps it. A choice's `stop_reason` (vLLM and our server give the matched string;
  `None` means EOS; an integer is a stop *token*) says which string to re-append. A server that
  gives no `stop_reason` leaves us a guess: with `finish_reason == "stop"` and exactly one stop
  string, that string is re-appended (an EOS cannot be told apart from it; counted in
  `stats["stop_guessed"]`); with several, nothing is appended (`stats["stop_unknown"]`). The text
  is finally cut after the first stop string, so a server that ignored `stop` still gives our form.
- **Token counts** come from the response's `usage`. `prompt_tokens` is exact (one prompt per
  request). With `n == 1` `completion_tokens` is exact too. With `n > 1` most servers only give
  the total: if a choice carries its own `token_ids` (vLLM with `extra_body={"return_token_ids":
  True}`) those are counted; otherwise choices that finished on `length` get `max_tokens` each
  and the rest of the total is split over the other choices in proportion to their text length
  (largest remainders, so the per-choice counts always sum to the server's total).
- **finish_reason**: `length` stays `length`; everything else (`stop`, `eos`, `content_filter`,
  `abort`, missing) becomes `stop`.

The API key is read from the environment variable `api_key_env` (default `OPENAI_API_KEY`; none
set means no `Authorization` header) and sent as `Authorization: Bearer <key>`. It is never
logged, printed, put in an exception message or repr, or written anywhere.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from backends.base import Completion, SamplingParams, cut_at_stop

logger = logging.getLogger(__name__)

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
"""HTTP answers worth another try; any other 5xx is retried too, other 4xx are not."""


class OpenAICompatError(RuntimeError):
    """A request that failed for good (after its retries, or at once for a 4xx answer)."""

    def __init__(self, message: str, status: int | None = None, attempts: int = 1):
        super().__init__(message)
        self.status = status
        """HTTP status of the last answer, None when there was none (connection error, timeout)."""
        self.attempts = attempts


@dataclass
class OpenAICompatConfig:
    """How to reach an OpenAI-compatible server."""

    model: str = ""
    """The served model name (`/v1/models` lists it; vLLM's default is the path it was started with)."""
    base_url: str = "http://127.0.0.1:8000/v1"
    """The API root; `/completions` is appended."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the API key; unset or empty means no Authorization header."""
    max_concurrency: int = 8
    """Requests in flight at once (one request per prompt)."""
    timeout_s: float = 600.0
    """Seconds to wait for a server's answer (read timeout), per attempt."""
    connect_timeout_s: float = 10.0
    """Seconds to wait for a connection, per attempt."""
    max_retries: int = 4
    """Retries after the first attempt on connection errors, timeouts, 408, 429 and 5xx."""
    backoff_s: float = 0.5
    """First retry waits about this long; each further retry doubles it (with jitter)."""
    max_backoff_s: float = 30.0
    """Longest wait between attempts (also caps a server's Retry-After)."""
    extra_body: dict[str, Any] = field(default_factory=dict)
    """Extra request fields sent as they are, e.g. vLLM's {"top_k": 20, "return_token_ids": true}."""

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model: give the served model name (see the server's /v1/models)")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.timeout_s <= 0 or self.connect_timeout_s <= 0:
            raise ValueError("timeout_s and connect_timeout_s must be > 0")


class OpenAICompatGenerator:
    """A `Generator` over an OpenAI-compatible `/v1/completions` endpoint."""

    def __init__(self, config: OpenAICompatConfig | None = None, **fields: Any):
        """`OpenAICompatGenerator(OpenAICompatConfig(...))` or `OpenAICompatGenerator(model=..., base_url=...)`."""
        if config is None:
            config = OpenAICompatConfig(**fields)
        elif fields:
            raise TypeError("give either a config or keyword fields, not both")
        self.config = config
        self._api_key = os.environ.get(config.api_key_env, "") or None
        self._url = config.base_url.rstrip("/") + "/completions"
        self._client = httpx.Client(
            timeout=httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s),
            limits=httpx.Limits(max_connections=config.max_concurrency,
                                max_keepalive_connections=config.max_concurrency),
        )
        self._lock = threading.Lock()
        self.stats = {"requests": 0, "retries": 0, "stop_guessed": 0, "stop_unknown": 0, "usage_missing": 0,
                      "n_ignored": 0}
        """Counters: HTTP attempts, retries, stop strings guessed / left unknown, answers without usage,
        prompts whose server answered fewer than `n` choices."""
        self._one_choice_per_request = False
        """Set once the server has ignored `n`: later prompts send `n=1` requests from the start."""

    def __repr__(self) -> str:
        auth = "set" if self._api_key else "none"
        return (f"OpenAICompatGenerator(model={self.config.model!r}, base_url={self.config.base_url!r}, "
                f"api_key_env={self.config.api_key_env!r} ({auth}))")

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAICompatGenerator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----------------------------------------------------------------- Generator

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Completion]]:
        if not prompts:
            return []
        pool = ThreadPoolExecutor(max_workers=min(self.config.max_concurrency, len(prompts)),
                                  thread_name_prefix="openai-compat")
        try:
            futures = [pool.submit(self._complete, prompt, params) for prompt in prompts]
            out = []
            for i, future in enumerate(futures):
                try:
                    out.append(future.result())
                except OpenAICompatError as err:
                    raise OpenAICompatError(f"prompt {i} of {len(prompts)}: {err}", err.status,
                                            err.attempts) from err
            return out
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def models(self) -> list[str]:
        """The model names the server lists at `/v1/models`."""
        url = self.config.base_url.rstrip("/") + "/models"
        data = self._request("GET", url, None)
        return [str(m["id"]) for m in data.get("data", []) if isinstance(m, dict) and m.get("id") is not None]

    # ----------------------------------------------------------------- internals

    def _body(self, prompt: str, params: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.config.model,
            "prompt": prompt,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "n": params.n,
        }
        if params.stop:
            body["stop"] = list(params.stop)
        if params.seed is not None:
            body["seed"] = params.seed
        body.update(self.config.extra_body)
        return body

    def _complete(self, prompt: str, params: SamplingParams) -> list[Completion]:
        if params.n > 1 and self._one_choice_per_request:
            return self._one_by_one(prompt, params, 0)
        data = self._request("POST", self._url, self._body(prompt, params))
        choices = data.get("choices")
        if params.n > 1 and isinstance(choices, list) and 0 < len(choices) < params.n:
            with self._lock:
                self.stats["n_ignored"] += 1
                if not self._one_choice_per_request:
                    logger.warning("%s answered %d choice(s) for n=%d: asking for the rest one request each",
                                   self._url, len(choices), params.n)
                self._one_choice_per_request = True
            got = self._parse(data, replace(params, n=len(choices)))
            return got + self._one_by_one(prompt, params, len(choices))
        return self._parse(data, params)

    def _one_by_one(self, prompt: str, params: SamplingParams, start: int) -> list[Completion]:
        """Completions `start` .. `n - 1` of a prompt, one `n=1` request each (seed + j with a seed)."""
        out: list[Completion] = []
        for j in range(start, params.n):
            one = replace(params, n=1, seed=None if params.seed is None else params.seed + j)
            out += self._parse(self._request("POST", self._url, self._body(prompt, one)), one)
        return out

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "***") if self._api_key else text

    def _count(self, name: str, k: int = 1) -> None:
        with self._lock:
            self.stats[name] += k

    def _delay(self, retry: int, retry_after: float | None) -> float:
        cfg = self.config
        delay = min(cfg.max_backoff_s, cfg.backoff_s * 2 ** (retry - 1))
        delay *= 0.5 + 0.5 * random.random()  # jitter: half to all of the exponential step
        if retry_after is not None:
            delay = max(delay, min(retry_after, cfg.max_backoff_s))
        return delay

    def _request(self, method: str, url: str, body: dict[str, Any] | None) -> dict[str, Any]:
        cfg = self.config
        attempts = cfg.max_retries + 1
        problem, status, retry_after = "", None, None
        content = None if body is None else json.dumps(body).encode()
        for attempt in range(1, attempts + 1):
            if attempt > 1:
                delay = self._delay(attempt - 1, retry_after)
                logger.warning("%s %s: %s; retry %d of %d in %.2fs", method, url, problem, attempt - 1,
                               cfg.max_retries, delay)
                self._count("retries")
                time.sleep(delay)
            self._count("requests")
            status, retry_after = None, None
            try:
                response = self._client.request(method, url, content=content, headers=self._headers())
            except httpx.TimeoutException as err:
                kind = "connecting" if isinstance(err, httpx.ConnectTimeout) else "waiting for the answer"
                limit = cfg.connect_timeout_s if isinstance(err, httpx.ConnectTimeout) else cfg.timeout_s
                problem = f"timed out after {limit:g}s {kind} ({type(err).__name__})"
                continue
            except httpx.TransportError as err:
                problem = self._redact(f"connection error: {type(err).__name__}: {err}")
                continue
            status = response.status_code
            if status == 200:
                try:
                    data = response.json()
                except ValueError as err:
                    raise OpenAICompatError(f"{method} {url}: the answer is not JSON ({err})", status,
                                            attempt) from None
                if not isinstance(data, dict):
                    raise OpenAICompatError(f"{method} {url}: the answer is not a JSON object", status, attempt)
                return data
            problem = f"HTTP {status}: {self._redact(_error_message(response))}"
            if status in RETRY_STATUS or status >= 500:
                retry_after = _retry_after(response)
                continue
            raise OpenAICompatError(f"{method} {url} failed with {problem} (not retried)", status, attempt)
        raise OpenAICompatError(f"{method} {url} failed after {attempts} attempt(s); last error: {problem}",
                                status, attempts)

    def _parse(self, data: dict[str, Any], params: SamplingParams) -> list[Completion]:
        choices = data.get("choices")
        if not isinstance(choices, list) or len(choices) != params.n:
            got = len(choices) if isinstance(choices, list) else repr(type(choices).__name__)
            raise OpenAICompatError(f"{self._url}: expected {params.n} choice(s), got {got}")
        choices = sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0)
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else None
        if usage is None:
            self._count("usage_missing")
            if self.stats["usage_missing"] == 1:
                logger.warning("%s gives no usage: token counts are recorded as 0", self._url)
        texts, reasons = [], []
        for choice in choices:
            if not isinstance(choice, dict) or not isinstance(choice.get("text"), str):
                raise OpenAICompatError(f"{self._url}: a choice without text: {str(choice)[:200]!r}")
            text = self._restore_stop(choice, params.stop)
            text, stopped = cut_at_stop(text, params.stop)
            texts.append(text)
            reasons.append("stop" if stopped or choice.get("finish_reason") != "length" else "length")
        prompt_tokens = int(usage.get("prompt_tokens") or 0) if usage else 0
        total = int(usage.get("completion_tokens") or 0) if usage else 0
        if all(isinstance(c.get("token_ids"), list) for c in choices):
            counts = [len(c["token_ids"]) for c in choices]
        elif len(choices) == 1:
            counts = [total]
        else:
            counts = split_completion_tokens(total, texts, reasons, params.max_new_tokens)
        return [Completion(t, prompt_tokens, k, r) for t, k, r in zip(texts, counts, reasons)]

    def _restore_stop(self, choice: dict[str, Any], stop: tuple[str, ...]) -> str:
        text = choice["text"]
        if not stop or choice.get("finish_reason") == "length":
            return text
        if "stop_reason" in choice:
            reason = choice["stop_reason"]
            # A string is the matched stop string (re-append unless the server kept it); None is EOS;
            # an integer is a stop token id, whose text the server already decoded (or skipped).
            if isinstance(reason, str) and reason and not text.endswith(reason):
                text += reason
            return text
        if any(text.endswith(s) for s in stop):
            return text
        if len(stop) == 1:
            self._count("stop_guessed")
            return text + stop[0]
        self._count("stop_unknown")
        return text


def split_completion_tokens(total: int, texts: list[str], reasons: list[str], max_tokens: int) -> list[int]:
    """Per-choice completion tokens from a server's total for all choices (see the module docstring).

    Choices that finished on `length` get `max_tokens` each; the rest of `total` is split over the
    other choices in proportion to their text length, by largest remainders, so that the counts
    sum to `total` exactly (when the total is too small for that, everything is split by length).
    """
    counts = [0] * len(texts)
    fixed = [i for i, r in enumerate(reasons) if r == "length"]
    free = [i for i, r in enumerate(reasons) if r != "length"]
    rest = total - max_tokens * len(fixed)
    if rest < 0 or (rest > 0 and not free):
        fixed, free, rest = [], list(range(len(texts))), total
    for i in fixed:
        counts[i] = max_tokens
    weights = [len(texts[i]) + 1 for i in free]  # +1: an empty text still took its stop token
    if free:
        shares = [rest * w / sum(weights) for w in weights]
        floors = [int(s) for s in shares]
        left = rest - sum(floors)
        order = sorted(range(len(free)), key=lambda j: shares[j] - floors[j], reverse=True)
        for j in order[:left]:
            floors[j] += 1
        for i, k in zip(free, floors):
            counts[i] = k
    return counts


def _error_message(response: httpx.Response) -> str:
    """The server's error message: OpenAI's {"error": {"message"}} or a few common shapes, else the text."""
    try:
        data = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:500]
        for key in ("message", "detail", "error"):
            if data.get(key):
                return str(data[key])[:500]
    return json.dumps(data)[:500]


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff
