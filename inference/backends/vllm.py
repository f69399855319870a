"""`vllm` backend: vLLM's offline engine (`vllm.LLM`) on GPUs, with prefix caching.

`vllm` is imported inside the constructor, so this module imports without it; constructing a
`VLLMGenerator` without vLLM installed raises an ImportError naming the extra to install.

Matching the other backends:

- prompts are tokenized here with the engine's tokenizer and `add_special_tokens=False` (as
  `HFGenerator` does), then passed as token ids, so prompt token counts agree across backends;
- stop strings are kept in the text (`include_stop_str_in_output=True`); the text is also cut
  after the first stop string, as in `cut_at_stop`;
- `prompt_tokens` is `len(prompt_token_ids)`, `completion_tokens` is `len(outputs[i].token_ids)`
  (vLLM's own count, including an EOS token when one ended the completion);
- `finish_reason` `length` stays `length`; `stop` (EOS or a stop string) and anything else is `stop`.
"""

from __future__ import annotations

from typing import Any

from inference.backends.base import Completion, SamplingParams, cut_at_stop

INSTALL_HINT = "pip install 'steprl[vllm]'"


def _import_vllm():
    try:
        import vllm
    except ImportError as err:
        if err.name == "vllm":
            raise ImportError(
                f"the vllm backend needs vLLM, which is not installed: {INSTALL_HINT} (a GPU machine; "
                "vllm 0.31). On a CPU use the hf backend."
            ) from err
        raise ImportError(f"vLLM is installed but could not be imported ({err}); reinstall it with "
                          f"{INSTALL_HINT}") from err
    return vllm


class VLLMGenerator:
    """A `Generator` over `vllm.LLM`: continuous batching, prefix caching, n samples per prompt."""

    def __init__(
        self,
        model: str,
        *,
        tokenizer: str | None = None,
        dtype: str = "auto",
        seed: int = 0,
        gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None,
        tensor_parallel_size: int = 1,
        enable_prefix_caching: bool = True,
        add_special_tokens: bool = False,
        use_tqdm: bool = False,
        **engine_kwargs: Any,
    ):
        """`model`: a local directory or Hub id; `engine_kwargs` go to `vllm.LLM` (e.g. enforce_eager=True)."""
        self._vllm = _import_vllm()
        self.add_special_tokens = add_special_tokens
        self.use_tqdm = use_tqdm
        if max_model_len is not None:
            engine_kwargs["max_model_len"] = max_model_len
        self.llm = self._vllm.LLM(
            model=model,
            tokenizer=tokenizer,
            dtype=dtype,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            enable_prefix_caching=enable_prefix_caching,
            **engine_kwargs,
        )
        self.tokenizer = self.llm.get_tokenizer()

    def sampling_params(self, params: SamplingParams):
        """Our `SamplingParams` as vLLM's."""
        return self._vllm.SamplingParams(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            stop=list(params.stop) or None,
            include_stop_str_in_output=True,
            seed=params.seed,
        )

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Completion]]:
        if not prompts:
            return []
        inputs = [{"prompt_token_ids": self.tokenizer.encode(p, add_special_tokens=self.add_special_tokens)}
                  for p in prompts]
        outputs = self.llm.generate(inputs, self.sampling_params(params), use_tqdm=self.use_tqdm)
        return [completions_from_output(o, params) for o in outputs]


def completions_from_output(request_output: Any, params: SamplingParams) -> list[Completion]:
    """One vLLM `RequestOutput` as our completions (in the order of the outputs' `index`)."""
    prompt_tokens = len(request_output.prompt_token_ids or [])
    out = []
    for o in sorted(request_output.outputs, key=lambda o: o.index):
        text, stopped = cut_at_stop(o.text, params.stop)
        reason = "length" if (o.finish_reason == "length" and not stopped) else "stop"
        out.append(Completion(text, prompt_tokens, len(o.token_ids), reason))
    return out
