"""A small OpenAI-compatible HTTP server over any `Generator` (standard library only).

    python -m backends.serve --model DIR [--port 8000] [--host 127.0.0.1]

serves a local transformers model (through `HFGenerator`) at `/v1/completions` (plain-text
completions: `prompt` as a string or a list of strings, `max_tokens`, `temperature`, `top_p`, `n`,
`stop`, `seed`) and `/v1/models`, plus `/health`. On start it prints one JSON line,
`{"serving": NAME, "url": "http://HOST:PORT/v1", ...}`; `--port 0` picks a free port.

Answers follow the OpenAI format: the matched stop string is dropped from a choice's `text` and
given in its `stop_reason` (as vLLM does; `None` for EOS), so `OpenAICompatGenerator` restores our
convention (stop string kept). `usage` carries the generator's own token counts.

Concurrent requests are batched: requests that arrive within `--batch_wait_ms` of each other and
share their sampling parameters go to the generator as one batch (up to `--max_batch_prompts`
prompts), so a client's thread pool gets the batched speed of `HFGenerator`. With a `seed`, a
request's samples therefore depend on which other requests shared its batch.

Limits, so that no request can stall the server (each refused with a clear 4xx/5xx; the table is in docs/backends.md):
prompt tokens + `max_tokens` at most the model's context (400); at most `--max_prompts_per_request`
prompts, `--max_n` completions per prompt and `--max_stop` stop strings (400); a body of at most
`--max_body_bytes` (413); at most `--max_queued_requests` requests admitted at once, the rest 503
with `Retry-After`; a request still unanswered after `--request_timeout_s` gets 504; generation of a
batch whose requests all timed out or whose clients all disconnected is stopped at the next token;
a request must arrive in full within `--read_timeout_s` (408, or the connection is closed); the
listen backlog is `--backlog`.

`--api_key_env NAME` makes the server require `Authorization: Bearer <value of $NAME>`.
`--fail_first K` (testing) answers the first K completion requests with 503.
"""

from __future__ import annotations

import hmac
import inspect
import json
import logging
import math
import os
import queue
import select
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from backends.base import Completion, Generator, SamplingParams
from backends.prompt_limits import max_prompt_chars
from reasoning.json_input import JSONInputError
from reasoning.json_input import loads as json_loads

logger = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 16
"""OpenAI's (and vLLM's) default `max_tokens` for text completions."""
SEED_RANGE = (-(2**63), 2**64)
"""Seeds torch accepts."""


@dataclass
class ServerLimits:
    """What one request may ask for, and how long the server waits for it (see the module docstring)."""

    max_prompts_per_request: int = 64
    max_n: int = 16
    max_stop: int = 16
    max_body_bytes: int = 4 * 1024 * 1024
    max_queued_requests: int = 64
    """Completion requests admitted (queued or generating) at once; more get 503."""
    request_timeout_s: float = 300.0
    """A request not answered by then gets 504, and its share of generation is cancelled."""
    read_timeout_s: float = 30.0
    """A request's headers and body must arrive within this; idle keep-alive connections close after it."""
    backlog: int = 128
    """Connections the OS holds until the server accepts them."""
    context_tokens: int | None = None
    """Prompt plus completion tokens at most; default: the generator's `context_length`."""


class RequestError(Exception):
    """A request the server refuses: its HTTP status, message and the offending field."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind


# ------------------------------------------------------------------ request and answer


def parse_completion_request(body: Any, served_model: str,
                             limits: ServerLimits | None = None) -> tuple[list[str], SamplingParams]:
    """The prompts and sampling parameters of a `/v1/completions` body; `RequestError` if it is bad."""
    limits = limits or ServerLimits()
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != served_model:
        raise RequestError(404, f"The model `{model}` does not exist; this server serves `{served_model}`.",
                           "model", "NotFoundError")
    prompts = _request_prompts(body.get("prompt"), limits)
    for name, allowed in (("stream", (None, False)), ("echo", (None, False)), ("logprobs", (None,)),
                          ("best_of", (None, 1)), ("suffix", (None, ""))):
        if body.get(name) not in allowed:
            raise RequestError(400, f"{name}={body.get(name)!r} is not supported by this server", name)
    stop = _request_stop(body.get("stop"), limits)
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)
                             or not SEED_RANGE[0] <= seed < SEED_RANGE[1]):
        raise RequestError(400, "seed must be an integer in [-2**63, 2**64)", "seed")
    values = dict(max_new_tokens=_request_number(body, "max_tokens", DEFAULT_MAX_TOKENS, int),
                  temperature=_request_number(body, "temperature", 1.0), top_p=_request_number(body, "top_p", 1.0),
                  n=_request_number(body, "n", 1, int), stop=tuple(stop), seed=seed)
    if values["n"] > limits.max_n:
        raise RequestError(400, f"n must be at most {limits.max_n}, got {values['n']}", "n")
    try:
        params = SamplingParams(**values)
    except ValueError as err:
        param = {"max_new_tokens": "max_tokens"}.get(str(err).split()[0], str(err).split()[0])
        raise RequestError(400, str(err).replace("max_new_tokens", "max_tokens"), param) from None
    return prompts, params


def _request_prompts(prompt: Any, limits: ServerLimits) -> list[str]:
    """A string or a non-empty list of non-empty strings, at most `max_prompts_per_request`."""
    prompts = [prompt] if isinstance(prompt, str) else prompt
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise RequestError(400, "prompt must be a string or a non-empty list of strings", "prompt")
    if len(prompts) > limits.max_prompts_per_request:
        raise RequestError(400, f"at most {limits.max_prompts_per_request} prompts per request, got {len(prompts)}",
                           "prompt")
    if not all(prompts):
        raise RequestError(400, "prompt must not be empty", "prompt")
    return prompts


def _request_stop(stop: Any, limits: ServerLimits) -> list[str]:
    """None, a non-empty string or a list of them, at most `max_stop`."""
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError(400, "stop must be a non-empty string or a list of them", "stop")
    if len(stop) > limits.max_stop:
        raise RequestError(400, f"at most {limits.max_stop} stop strings, got {len(stop)}", "stop")
    return stop


def _request_number(body: dict, name: str, default: float, kind: type = float) -> Any:
    """body[name] as an integer (`kind` int) or a finite float; the default when absent."""
    value = body.get(name)
    if value is None:
        return default
    ok = isinstance(value, int) if kind is int else isinstance(value, int | float)
    if ok and kind is float:
        try:
            value = float(value)
        except OverflowError:
            ok = False
        ok = ok and math.isfinite(value)
    if not ok or isinstance(value, bool):
        raise RequestError(400, f"{name} must be {'an integer' if kind is int else 'a finite number'}", name)
    return value


def check_prompt_chars(prompts: list[str], max_tokens: int, context: int | None, token_chars: int | None) -> None:
    """400 for a prompt with more characters than `context` tokens can hold with `max_tokens` new
    ones (`prompt_limits.max_prompt_chars`), before any prompt is tokenised."""
    if context is None or max_tokens >= context:  # then max_tokens alone is too many (check_context)
        return
    bound = max_prompt_chars(context, max_tokens, token_chars)
    longest = max(len(p) for p in prompts)
    if bound is not None and longest > bound:
        raise RequestError(400, f"This model's maximum context length is {context} tokens. However, your prompt "
                                f"has {longest} characters, more than {context - max_tokens} tokens can hold "
                                f"({bound} characters) with {max_tokens} in the completion. Please reduce the "
                                "prompt or max_tokens.", "prompt")


def check_context(prompt_tokens: list[int], max_tokens: int, context: int | None) -> None:
    """400 unless every prompt plus `max_tokens` fits in the model's context (vLLM's message)."""
    if any(n == 0 for n in prompt_tokens):
        raise RequestError(400, "a prompt encodes to no tokens", "prompt")
    if context is None:
        return
    longest = max(prompt_tokens)
    if longest + max_tokens > context:
        raise RequestError(400, f"This model's maximum context length is {context} tokens. However, you requested "
                                f"{longest + max_tokens} tokens ({longest} in the prompt, {max_tokens} in the "
                                f"completion). Please reduce the prompt or max_tokens.",
                           "prompt" if longest >= context else "max_tokens")


def completion_response(prompts: list[str], params: SamplingParams, results: list[list[Completion]],
                        model: str) -> dict[str, Any]:
    """The OpenAI `text_completion` object: choice `i * n + j` is completion j of prompt i."""
    choices, prompt_tokens, completion_tokens = [], 0, 0
    for i, completions in enumerate(results):
        prompt_tokens += completions[0].prompt_tokens if completions else 0
        for j, c in enumerate(completions):
            text, stop_reason = c.text, None
            if c.finish_reason == "stop":
                matched = [s for s in params.stop if text.endswith(s)]
                if matched:
                    stop_reason = max(matched, key=len)
                    text = text[: -len(stop_reason)]
            choices.append({"index": i * params.n + j, "text": text, "logprobs": None,
                            "finish_reason": c.finish_reason, "stop_reason": stop_reason})
            completion_tokens += c.completion_tokens
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


# ------------------------------------------------------------------ batching


def _timed_out() -> RequestError:
    return RequestError(504, "the request was not answered within its deadline (--request_timeout_s)", kind="timeout")



@dataclass
class _Job:
    prompts: list[str]
    params: SamplingParams
    deadline: float = math.inf
    """time.monotonic() after which nobody waits for the answer."""
    done: threading.Event = field(default_factory=threading.Event)
    result: list[list[Completion]] | None = None
    error: BaseException | None = None
    cancelled: bool = False
    """Set by the request thread when its client disconnected or its deadline passed."""

    def abandoned(self) -> bool:
        return self.cancelled or time.monotonic() > self.deadline


class _Batcher:
    """One worker thread that runs the generator, merging queued jobs with equal parameters.

    At most `max_jobs` jobs are admitted at once (`submit` refuses more); jobs nobody waits for
    any longer are dropped before they run, and a running batch whose jobs are all abandoned is
    stopped at the next token when the generator takes `should_stop` (as `HFGenerator` does)."""

    def __init__(self, generator: Generator, max_batch_prompts: int, wait_s: float, max_jobs: int = 64):
        self.generator, self.max_batch_prompts, self.wait_s = generator, max_batch_prompts, wait_s
        self.max_jobs = max_jobs
        self.queue: queue.Queue[_Job | None] = queue.Queue()
        self.batches = 0
        self.cancelled_batches = 0
        self.admitted = 0
        """Jobs submitted and not yet finished."""
        self._lock = threading.Lock()
        self.stopped = False
        self._cancellable = "should_stop" in inspect.signature(generator.generate).parameters
        self._thread = threading.Thread(target=self._loop, name="serve-batcher", daemon=True)
        self._thread.start()

    def submit(self, prompts: list[str], params: SamplingParams, deadline: float = math.inf) -> _Job:
        """Queue a job; `RequestError` 503 when the server is shutting down or `max_jobs` are admitted."""
        if self.stopped:
            raise RequestError(503, "the server is shutting down", kind="service_unavailable")
        with self._lock:
            if self.admitted >= self.max_jobs:
                raise RequestError(503, f"the server is busy ({self.admitted} requests queued or running); "
                                        "retry later", kind="service_unavailable")
            self.admitted += 1
        job = _Job(prompts, params, deadline)
        self.queue.put(job)
        return job

    def stop(self) -> None:
        self.stopped = True
        self.queue.put(None)
        self._thread.join(timeout=10)

    def _finish(self, job: _Job, result: list[list[Completion]] | None = None,
                error: BaseException | None = None) -> None:
        job.result, job.error = result, error
        with self._lock:
            self.admitted -= 1
        job.done.set()

    def _loop(self) -> None:
        pending: list[_Job] = []
        stopping = False
        while pending or not stopping:
            if not pending:
                job = self.queue.get()
                if job is None:
                    break
                pending.append(job)
            deadline = time.monotonic() + self.wait_s
            while not stopping and sum(len(j.prompts) for j in pending) < self.max_batch_prompts:
                try:
                    job = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if job is None:
                    stopping = True
                else:
                    pending.append(job)
            for job in [j for j in pending if j.abandoned()]:
                self._finish(job, error=_timed_out())
            pending = [j for j in pending if not j.done.is_set()]
            if not pending:
                continue
            head = pending[0]
            batch: list[_Job] = []
            size = 0
            for job in pending:
                if job.params == head.params and (not batch or size + len(job.prompts) <= self.max_batch_prompts):
                    batch.append(job)
                    size += len(job.prompts)
            pending = [j for j in pending if all(j is not b for b in batch)]
            self._run(batch)

    def _run(self, batch: list[_Job]) -> None:
        prompts = [p for job in batch for p in job.prompts]
        self.batches += 1
        try:
            if self._cancellable:
                def should_stop() -> bool:
                    return all(job.abandoned() for job in batch)

                results = self.generator.generate(prompts, batch[0].params, should_stop=should_stop)  # type: ignore[call-arg]
                if should_stop():
                    self.cancelled_batches += 1
            else:
                results = self.generator.generate(prompts, batch[0].params)
            if len(results) != len(prompts):
                raise RuntimeError(f"the generator gave {len(results)} results for {len(prompts)} prompts")
        except BaseException as err:  # noqa: BLE001 - handed to every waiting request
            for job in batch:
                self._finish(job, error=err)
            return
        start = 0
        for job in batch:  # a job abandoned meanwhile may have been cut short: no answer, not a short one
            if job.abandoned():
                self._finish(job, error=_timed_out())
            else:
                self._finish(job, results[start : start + len(job.prompts)])
            start += len(job.prompts)


# ------------------------------------------------------------------ the server


class CompletionServer:
    """Serve `generator` as `model_name`; `start()` runs it in a background thread."""

    def __init__(self, generator: Generator, model_name: str, host: str = "127.0.0.1", port: int = 0,
                 api_key: str | None = None, max_batch_prompts: int = 64, batch_wait_s: float = 0.005,
                 fail_first: int = 0, delay_s: float = 0.0, limits: ServerLimits | None = None):
        self.model_name = model_name
        self.limits = limits = limits or ServerLimits()
        self.context_tokens = limits.context_tokens or getattr(generator, "context_length", None)
        self._count_tokens = getattr(generator, "count_tokens", None)
        self._max_token_chars = getattr(generator, "max_token_chars", None)
        """The most characters one token covers: a prompt longer than the context can hold is refused
        before it is tokenised (seconds of CPU for megabytes, which concurrent requests would wait on)."""
        self._api_key = api_key or None
        self.fail_first = fail_first
        """Completion requests still to be answered with 503 (testing retries)."""
        self.delay_s = delay_s
        """Seconds to wait before answering a completion request (testing timeouts)."""
        self.counts = {"completions": 0, "injected_503": 0, "unauthorized": 0, "errors": 0, "busy": 0,
                       "disconnected": 0, "timed_out": 0}
        self._lock = threading.Lock()
        self._batcher = _Batcher(generator, max_batch_prompts, batch_wait_s, limits.max_queued_requests)
        self.httpd = ThreadingHTTPServer((host, port), _Handler, bind_and_activate=False)
        self.httpd.request_queue_size = limits.backlog  # listen() backlog (the standard library's is 5)
        self.httpd.daemon_threads = True
        self.httpd.app = self  # type: ignore[attr-defined]
        try:
            self.httpd.server_bind()
            self.httpd.server_activate()
        except BaseException:
            self.httpd.server_close()
            self._batcher.stop()
            raise
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"CompletionServer(model={self.model_name!r}, url={self.url!r}, auth={'on' if self._api_key else 'off'})"

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host if isinstance(host, str) else host.decode()}:{port}/v1"

    def describe(self) -> dict[str, Any]:
        """What the CLI prints on start: the served name, the API root, the device, whether a key is required."""
        device = getattr(self._batcher.generator, "device", None)
        return {"serving": self.model_name, "url": self.url, "device": str(device) if device is not None else None,
                "auth": self._api_key is not None}

    @property
    def batches(self) -> int:
        """Generator calls so far (each serving one or more requests)."""
        return self._batcher.batches

    def start(self) -> CompletionServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="serve-http", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def shutdown(self) -> None:
        """Stop serving (if `start()` runs it in a thread), close the socket, stop the batcher."""
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread = None
        self.httpd.server_close()
        self._batcher.stop()

    def __enter__(self) -> CompletionServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # Called from request threads.

    def authorized(self, header: str | None) -> bool:
        if self._api_key is None:
            return True
        expected = f"Bearer {self._api_key}".encode()
        return hmac.compare_digest((header or "").encode(), expected)

    def bump(self, name: str) -> int:
        with self._lock:
            self.counts[name] += 1
            return self.counts[name]

    def take_injected_failure(self) -> bool:
        with self._lock:
            if self.fail_first > 0:
                self.fail_first -= 1
                self.counts["injected_503"] += 1
                return True
            return False

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                            "owned_by": "steprl"}]}

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "admitted": self._batcher.admitted, "max_queued": self.limits.max_queued_requests}

    def complete(self, body: Any, client_gone: Callable[[], bool] = lambda: False) -> dict[str, Any] | None:
        """The answer to a completion request; None when `client_gone()` turned true while waiting."""
        started = time.monotonic()
        prompts, params = parse_completion_request(body, self.model_name, self.limits)
        check_prompt_chars(prompts, params.max_new_tokens, self.context_tokens, self._max_token_chars)
        if self._count_tokens is not None:
            check_context(self._count_tokens(prompts), params.max_new_tokens, self.context_tokens)
        elif self.context_tokens is not None:
            check_context([1], params.max_new_tokens, self.context_tokens)
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        deadline = started + self.limits.request_timeout_s
        try:
            job = self._batcher.submit(prompts, params, deadline)
        except RequestError:
            self.bump("busy")
            raise
        while not job.done.wait(0.05):
            if client_gone():
                job.cancelled = True
                self.bump("disconnected")
                return None
            if time.monotonic() > deadline:
                job.cancelled = True  # the worker drops it, or stops its batch if nobody else waits on it
                if time.monotonic() > deadline + 1:  # a generator that cannot be stopped: answer anyway
                    job.error = _timed_out()
                    break
        if job.error is not None:
            if isinstance(job.error, RequestError) and job.error.status == 504:
                self.bump("timed_out")
            raise job.error
        return completion_response(prompts, params, job.result, self.model_name)  # type: ignore[arg-type]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "steprl-serve"

    @property
    def app(self) -> CompletionServer:
        return self.server.app  # type: ignore[attr-defined]

    def setup(self) -> None:
        self.timeout = self.app.limits.read_timeout_s  # type: ignore[misc]  # each socket read (headers, body, idle)
        super().setup()

    def _client_gone(self) -> bool:
        """Whether the client closed its end while we generate (readable with nothing to read)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        logger.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (e.g. its timeout)
            self.close_connection = True

    def _error(self, err: RequestError, headers: dict[str, str] | None = None) -> None:
        self._send(err.status, {"error": {"message": err.message, "type": err.kind, "param": err.param,
                                          "code": err.status}}, headers)

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None:
            self.close_connection = True
            raise RequestError(411, "a Content-Length header is required")
        try:
            n = int(length)
        except ValueError:
            self.close_connection = True
            raise RequestError(400, "bad Content-Length") from None
        limit = self.app.limits.max_body_bytes
        if n < 0 or n > limit:
            self.close_connection = True
            raise RequestError(413, f"the request body is larger than {limit} bytes (--max_body_bytes)")
        deadline = time.monotonic() + self.app.limits.read_timeout_s
        chunks, got = [], 0
        try:
            while got < n:
                if time.monotonic() > deadline:
                    raise TimeoutError
                chunk = self.rfile.read1(min(n - got, 1 << 16))
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
        except (TimeoutError, OSError):
            self.close_connection = True
            raise RequestError(408, f"the request body did not arrive within {self.app.limits.read_timeout_s:g}s "
                                    "(--read_timeout_s)", kind="timeout") from None
        if got < n:
            self.close_connection = True
            raise RequestError(400, f"the body ended after {got} of {n} bytes")
        return b"".join(chunks)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = self.path.split("?")[0].rstrip("/")
        if path == "/health":
            self._send(200, self.app.health())
        elif path == "/v1/models":
            if not self.app.authorized(self.headers.get("Authorization")):
                self.app.bump("unauthorized")
                self._error(RequestError(401, "missing or invalid API key", kind="authentication_error"))
                return
            self._send(200, self.app.models())
        else:
            self._error(RequestError(404, f"no route {self.path}", kind="NotFoundError"))

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?")[0].rstrip("/")
        try:
            raw = self._read_body()
            if path != "/v1/completions":
                raise RequestError(404, f"no route {self.path} (this server offers /v1/completions)",
                                   kind="NotFoundError")
            if not self.app.authorized(self.headers.get("Authorization")):
                self.app.bump("unauthorized")
                raise RequestError(401, "missing or invalid API key", kind="authentication_error")
            self.app.bump("completions")
            if self.app.take_injected_failure():
                raise RequestError(503, "injected failure (--fail_first)", kind="service_unavailable")
            try:
                body = json_loads(raw or b"null")
            except JSONInputError as err:
                raise RequestError(400, f"the body is not JSON: {err}") from None
            answer = self.app.complete(body, self._client_gone)
            if answer is None:  # the client left: nobody to answer
                self.close_connection = True
                return
            self._send(200, answer)
        except RequestError as err:
            self._error(err, {"Retry-After": "1"} if err.status == 503 else None)
        except Exception as err:  # noqa: BLE001 - a generator failure becomes a 500, the server lives on
            self.app.bump("errors")
            logger.exception("generation failed")
            self._error(RequestError(500, f"generation failed: {type(err).__name__}: {err}", kind="server_error"))


# ------------------------------------------------------------------ CLI


@dataclass
class ServeArguments:
    """Serve a local causal LM over an OpenAI-compatible API."""

    model: str = field(default="", metadata={"help": "A local model directory (or Hub id) loaded with transformers."})
    host: str = field(default="127.0.0.1", metadata={"help": "Address to bind; keep loopback unless you set a key."})
    port: int = field(default=8000, metadata={"help": "Port; 0 picks a free one (printed on start)."})
    served_model_name: str | None = field(
        default=None, metadata={"help": "The name clients send as `model`; default: --model as given."}
    )
    device: str | None = field(default=None, metadata={"help": "cpu or cuda; default: cuda when available."})
    dtype: str | None = field(default=None, metadata={"help": "float32, bfloat16 or float16; default: the model's."})
    batch_size: int = field(default=64, metadata={"help": "Sequences per transformers generate call."})
    max_batch_prompts: int = field(default=64, metadata={"help": "Most prompts merged into one generator call."})
    batch_wait_ms: float = field(default=5.0, metadata={"help": "How long to wait for requests to batch together."})
    api_key_env: str | None = field(
        default=None, metadata={"help": "Require `Authorization: Bearer $NAME` (the variable's value)."}
    )
    fail_first: int = field(default=0, metadata={"help": "Testing: answer the first K completion requests with 503."})
    max_prompts_per_request: int = field(default=64, metadata={"help": "Most prompts in one request (400 beyond)."})
    max_n: int = field(default=16, metadata={"help": "Most completions per prompt, `n` (400 beyond)."})
    max_queued_requests: int = field(
        default=64, metadata={"help": "Completion requests queued or generating at once; more are answered 503."}
    )
    request_timeout_s: float = field(
        default=300.0, metadata={"help": "A request unanswered after this gets 504 and its generation is stopped."}
    )
    read_timeout_s: float = field(
        default=30.0, metadata={"help": "A request must arrive within this (408 or closed); idle connections close."}
    )
    max_body_bytes: int = field(default=4 * 1024 * 1024, metadata={"help": "Largest request body (413 beyond)."})
    backlog: int = field(default=128, metadata={"help": "Listen backlog: connections waiting to be accepted."})
    max_context_tokens: int | None = field(
        default=None, metadata={"help": "Prompt + max_tokens at most this; default: the model's context length."}
    )


def parse_args(argv: list[str] | None = None) -> ServeArguments:
    from transformers import HfArgumentParser

    (args,) = HfArgumentParser(ServeArguments).parse_args_into_dataclasses(args=argv)  # type: ignore[arg-type]
    if not args.model:
        raise ValueError("--model is required")
    from backends.model_files import check_model_path

    check_model_path("--model", args.model)  # a typo or a broken folder, said before anything loads
    for name in ("max_prompts_per_request", "max_n", "max_queued_requests", "max_body_bytes", "backlog"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")
    for name in ("request_timeout_s", "read_timeout_s"):
        if not getattr(args, name) > 0:
            raise ValueError(f"--{name} must be > 0, got {getattr(args, name)}")
    if args.api_key_env and not os.environ.get(args.api_key_env):
        raise ValueError(f"--api_key_env {args.api_key_env}: the variable is not set")
    return args


def build_server(args: ServeArguments) -> CompletionServer:
    """Load the model into an `HFGenerator` and bind the server (not yet serving)."""
    from backends.hf import HFGenerator

    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    dtype = None if args.dtype in (None, "auto") else args.dtype
    generator = HFGenerator.from_pretrained(args.model, batch_size=args.batch_size, device=args.device, dtype=dtype)
    if api_key is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning("serving on %s without an API key: anyone who can reach it can use it", args.host)
    limits = ServerLimits(max_prompts_per_request=args.max_prompts_per_request, max_n=args.max_n,
                          max_body_bytes=args.max_body_bytes, max_queued_requests=args.max_queued_requests,
                          request_timeout_s=args.request_timeout_s, read_timeout_s=args.read_timeout_s,
                          backlog=args.backlog, context_tokens=args.max_context_tokens)
    return CompletionServer(generator, args.served_model_name or args.model, host=args.host, port=args.port,
                            api_key=api_key, max_batch_prompts=args.max_batch_prompts,
                            batch_wait_s=args.batch_wait_ms / 1000, fail_first=args.fail_first, limits=limits)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = build_server(args)
    print(json.dumps(server.describe()), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
