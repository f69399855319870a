"""`hf` backend: batched transformers `generate`, on CPU or GPU.

Prompts go through the tokenizer's chat template when it has one (an instruct model), unless
`chat_template=False`: see `reasoning.prompts.format_prompts`. Prompt token counts are those of
the text the model read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from backends.base import Completion, SamplingParams, cut_at_stop
from backends.prompt_limits import context_of, max_token_chars
from reasoning.prompts import format_prompts

_TOKENIZER_LOCK = threading.Lock()


class HFGenerator:
    def __init__(self, model, tokenizer, batch_size: int = 64, device: str | torch.device | None = None,
                 chat_template: bool = True):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.chat_template = chat_template
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer needs a pad token for batched generation")

    @classmethod
    def from_pretrained(cls, path: str, batch_size: int = 64, device: str | None = None, dtype=None,
                        chat_template: bool = True):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        model.to(device or ("cuda" if torch.cuda.is_available() else "cpu")).eval()  # type: ignore[arg-type]
        return cls(model, tokenizer, batch_size=batch_size, chat_template=chat_template)

    @property
    def context_length(self) -> int | None:
        """The most tokens (prompt and completion) the model takes, from its config; None when
        the config states none."""
        return context_of(self.model.config)

    @property
    def max_token_chars(self) -> int | None:
        """The most characters one token stands for (`prompt_limits.max_token_chars`)."""
        return max_token_chars(self.tokenizer)

    def _encode(self, texts: list[str], **kwargs):
        # A fast tokenizer keeps its padding setting in shared state: a call without padding on one
        # thread (a server's request handler counting tokens) while another pads a batch (the
        # server's batcher) used to leave that batch unpadded. One call at a time.
        with _TOKENIZER_LOCK:
            return self.tokenizer(texts, add_special_tokens=False, **kwargs)

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Tokens of each text as `generate` encodes a prompt (no special tokens added)."""
        return [len(ids) for ids in self._encode(list(texts))["input_ids"]]

    @torch.no_grad()
    def generate(self, prompts: list[str], params: SamplingParams,
                 should_stop: Callable[[], bool] | None = None) -> list[list[Completion]]:
        """`params.n` completions per prompt; `should_stop()` true ends generation at the next token
        (a server's cancelled requests), the completions so far then end with 'length'."""
        tok = self.tokenizer
        tok.padding_side = "left"
        out: list[list[Completion]] = [[] for _ in prompts]
        prompts = format_prompts(tok, prompts, self.chat_template)
        if params.seed is not None:
            torch.manual_seed(params.seed)
        jobs = [(i, p) for i, p in enumerate(prompts) for _ in range(params.n)]
        for start in range(0, len(jobs), self.batch_size):
            chunk = jobs[start : start + self.batch_size]
            enc = self._encode([p for _, p in chunk], return_tensors="pt", padding=True)
            enc = {k: v.to(self.device) for k, v in enc.items()}
            # synced_gpus off: the model's weights are whole here (a trainer gathers ZeRO-3 or FSDP2
            # shards first), and a rank with fewer prompts must not wait on the others' decoding
            kwargs = dict(max_new_tokens=params.max_new_tokens, pad_token_id=tok.pad_token_id, synced_gpus=False)
            if params.temperature > 0:
                kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p)
            else:
                kwargs.update(do_sample=False)
            if params.stop:
                kwargs.update(stop_strings=list(params.stop), tokenizer=tok)
            if should_stop is not None:
                kwargs.update(stopping_criteria=StoppingCriteriaList([_Cancel(should_stop)]))
            gen = self.model.generate(**enc, **kwargs)
            new = gen[:, enc["input_ids"].shape[1] :]
            prompt_lens = enc["attention_mask"].sum(dim=1).tolist()
            for row, (i, _) in enumerate(chunk):
                ids = new[row].tolist()
                finished = False
                if tok.eos_token_id in ids:
                    ids = ids[: ids.index(tok.eos_token_id)]
                    finished = True
                while ids and ids[-1] == tok.pad_token_id:
                    ids.pop()
                text = tok.decode(ids, skip_special_tokens=True)
                text, stopped = cut_at_stop(text, params.stop)
                n_tokens = len(ids) + int(finished)
                if stopped:
                    n_tokens = min(n_tokens, len(tok(text, add_special_tokens=False)["input_ids"]))
                reason = "stop" if (finished or stopped) else "length"
                out[i].append(Completion(text, int(prompt_lens[row]), n_tokens, reason))
        return out


class _Cancel(StoppingCriteria):
    """Ends every sequence of a `generate` call once `should_stop()` is true."""

    def __init__(self, should_stop: Callable[[], bool]):
        self.should_stop = should_stop

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), bool(self.should_stop()), dtype=torch.bool, device=input_ids.device)
