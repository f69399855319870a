"""The decoding loop that drops rows as they end (`rl/decoding.py`, `--hf_decoding loop`): greedy rows
are `generate`'s token for token whatever the rows' lengths, budgets and ends; sampled rows are
`generate`'s under the same seed while no row has left; each step computes only its live rows; a
generation config it would not apply is refused; and the trainer's rollouts and continuations use it."""

import pytest
import torch
from test_continuations import model_and_tok, sources_of  # noqa: F401  (model_and_tok: a fixture)
from test_mc_values import make_trainer, policy_dir  # noqa: F401  (policy_dir: a fixture)

from rl.continuations import sample_separate
from rl.decoding import check_generation_config, decode, left_padded, nest


def alone(model, head, budget, **kwargs):
    """What `generate` gives from one prefix alone (no padding), its new tokens up to the first EOS."""
    ids = torch.tensor([head])
    row = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=budget,
                         **kwargs)[0, len(head):].tolist()
    eos = kwargs.get("eos_token_id")
    return row[: row.index(eos) + 1] if eos is not None and eos in row else row


def test_greedy_rows_are_generates_with_rows_leaving_at_their_eos_or_budget(model_and_tok):  # noqa: F811
    model, tok = model_and_tok
    sources = sources_of(model, tok, n=3, length=20, seed=2)
    heads = [sources[s][:cut] for s in range(3) for cut in (3, 8, 14)]  # left padding of 0 to 11 tokens
    budgets = [4 + 3 * (i % 4) for i in range(len(heads))]  # 4, 7, 10 or 13 new tokens
    free = dict(do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=None)
    seen = [alone(model, h, b, **free) for h, b in zip(heads, budgets)]
    eos = seen[1][2]  # a token the greedy rows do emit: some rows end early, at different steps
    greedy = dict(free, eos_token_id=eos)
    want = [alone(model, h, b, **greedy) for h, b in zip(heads, budgets)]
    assert any(len(w) < b for w, b in zip(want, budgets)) and any(len(w) == b for w, b in zip(want, budgets))
    ids, mask = left_padded(heads, tok.pad_token_id)
    got, steps = decode(model, ids, mask, budgets, greedy)
    assert got == want
    assert steps == sum(len(w) for w in want) < len(heads) * max(budgets)  # rows left as they ended


def nested_case(model, tok, copies=1):
    """Rows cut at three boundaries of three sequences (nested, some equal), mixed budgets, and an EOS
    the greedy rows emit, so that they end at different steps; with what `generate` gives each alone."""
    sources = sources_of(model, tok, n=3, length=20, seed=2)
    heads = [sources[s][:cut] for s in range(3) for cut in (3, 8, 14) for _ in range(copies)]
    budgets = [4 + 3 * (i // copies % 4) for i in range(len(heads))]
    free = dict(do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=None)
    eos = alone(model, heads[copies], budgets[copies], **free)[2]
    greedy = dict(free, eos_token_id=eos)
    return heads, budgets, greedy, [alone(model, h, b, **greedy) for h, b in zip(heads, budgets)]


def test_ended_rows_are_dropped_once_they_are_a_share_of_the_batch(model_and_tok, monkeypatch):  # noqa: F811
    """DROP_SHARE: ended rows stay in the batch (computed, not kept) until they are 1/DROP_SHARE of it;
    whatever the share, every row is `generate`'s."""
    import rl.decoding as D

    model, tok = model_and_tok
    heads, budgets, greedy, want = nested_case(model, tok, copies=2)  # 18 rows: dropped 2 at a time
    ids, mask = left_padded(heads, tok.pad_token_id)
    got, steps = decode(model, ids, mask, budgets, greedy)
    assert got == want and sum(len(w) for w in want) <= steps < len(heads) * max(budgets)
    monkeypatch.setattr(D, "DROP_SHARE", 1)  # dropped only when all have ended: every row computed to the end
    got, steps = decode(model, ids, mask, budgets, greedy)
    assert got == want and steps == len(heads) * max(len(w) for w in want)


@pytest.mark.parametrize("arch, heads, kv_heads, eager", [("llama", 6, 2, False), ("llama", 6, 2, True),
                                                          ("qwen2", 4, 4, False), ("qwen2", 4, 2, True)])
def test_grouped_query_heads_qwen2_and_the_plain_attention_path(model_and_tok, monkeypatch, arch,  # noqa: F811
                                                                 heads, kv_heads, eager):
    """Grouped-query attention (SmolLM2 has 9 query heads on 3 key-value heads), Qwen2, and the
    attention in plain operations that devices other than the CPU take: rows still `generate`'s."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    import rl.decoding as D

    sampler, tok = model_and_tok
    config = (LlamaConfig if arch == "llama" else Qwen2Config)(
        vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=heads,
        num_key_value_heads=kv_heads, max_position_embeddings=256, pad_token_id=tok.pad_token_id, initializer_range=0.2)
    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_config(config).eval()
    monkeypatch.setattr(D, "EAGER_ATTENTION", eager)
    heads_, budgets, greedy, _ = nested_case(sampler, tok, copies=2)
    want = [alone(model, h, b, **greedy) for h, b in zip(heads_, budgets)]
    ids, mask = left_padded(heads_, tok.pad_token_id)
    assert decode(model, ids, mask, budgets, greedy)[0] == want


@pytest.mark.parametrize("precision, eager", [("weights", False), ("autocast", False), ("autocast", True)])
def test_bf16_weights_and_bf16_autocast_decode_as_generate_does(model_and_tok, monkeypatch, precision,  # noqa: F811
                                                                eager):
    """bf16 weights (--dtype bfloat16) and bf16 autocast over float32 weights (--bf16 on a CPU, where
    rotary embeddings hand the attention float32 queries and keys beside bf16 values): the loop's
    attention computes in the dtype `generate`'s does, and the greedy rows are `generate`'s."""
    import contextlib
    import copy

    import rl.decoding as D

    sampler, tok = model_and_tok
    monkeypatch.setattr(D, "EAGER_ATTENTION", eager)
    model = copy.deepcopy(sampler).to(torch.bfloat16) if precision == "weights" else sampler
    heads, budgets, greedy, _ = nested_case(sampler, tok, copies=2)
    ids, mask = left_padded(heads, tok.pad_token_id)
    scope = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "autocast" else contextlib.nullcontext()
    with scope:
        want = [alone(model, h, b, **greedy) for h, b in zip(heads, budgets)]
        got = decode(model, ids, mask, budgets, greedy)[0]
    assert got == want


def test_a_lora_policy_decodes_through_the_loop_as_generate_does(model_and_tok):  # noqa: F811
    """A PEFT-wrapped policy (--use_peft): the loop's attention is reached through the adapter."""
    import copy

    from peft import LoraConfig, get_peft_model

    sampler, tok = model_and_tok
    torch.manual_seed(3)
    model = get_peft_model(copy.deepcopy(sampler), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                              init_lora_weights=False)).eval()
    heads, budgets, greedy, _ = nested_case(sampler, tok)
    want = [alone(model, h, b, **greedy) for h, b in zip(heads, budgets)]
    assert want != [alone(sampler, h, b, **greedy) for h, b in zip(heads, budgets)]  # the adapter changes the rows
    ids, mask = left_padded(heads, tok.pad_token_id)
    assert decode(model, ids, mask, budgets, greedy)[0] == want


def test_a_model_whose_attention_the_loop_cannot_reach_is_refused(model_and_tok, monkeypatch):  # noqa: F811
    import contextlib

    import rl.decoding as D

    model, tok = model_and_tok
    ids, mask = left_padded([[5, 6, 7], [5, 6]], tok.pad_token_id)
    greedy = dict(do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=None)
    monkeypatch.setattr(D, "_shared_prefix_attention_on", lambda model: contextlib.nullcontext())
    with pytest.raises(ValueError, match="attention dispatches through transformers' AttentionInterface"):
        decode(model, ids, mask, [4, 4], greedy)
    q = torch.zeros((1, 2, 1, 4))
    with pytest.raises(ValueError, match="does not apply sliding_window attention: use --hf_decoding generate"):
        D._shared_prefix_attention(None, q, q, q, None, sliding_window=8)


def test_a_softcapped_model_is_refused_in_one_line(model_and_tok):  # noqa: F811
    """Gemma 2 caps its attention logits (softcap), which the loop's attention does not apply: the
    first decoding step says so and names the way out (its layers are all full attention here, so the
    softcap is what is refused, not a sliding window)."""
    from transformers import AutoModelForCausalLM, Gemma2Config

    _, tok = model_and_tok
    config = Gemma2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                          layer_types=["full_attention"] * 2, pad_token_id=tok.pad_token_id)
    model = AutoModelForCausalLM.from_config(config).eval()
    assert model.config.attn_logit_softcapping is not None
    ids, mask = left_padded([[5, 6, 7], [5, 6]], tok.pad_token_id)
    greedy = dict(do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=None)
    with pytest.raises(ValueError, match="does not apply softcap attention: use --hf_decoding generate"):
        decode(model, ids, mask, [4, 4], greedy)


def test_equal_and_nested_rows_are_encoded_once_and_decoded_as_generate_does(model_and_tok):  # noqa: F811
    """A prompt's samples, a prefix's copies, a response's boundaries: the first forward sees each
    source (the longest row that others begin) once, and the rows, each reading its part of its source
    and then its own tokens, are still `generate`'s, greedy, row by row."""
    model, tok = model_and_tok
    sources = sources_of(model, tok, n=2, length=12, seed=4)
    heads = [sources[0][:5], sources[1][:9], sources[0][:5], sources[0][:5], sources[1][:9], sources[1][:4]]
    budgets = [6, 3, 6, 2, 8, 5]
    greedy = dict(do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=None)
    want = [alone(model, h, b, **greedy) for h, b in zip(heads, budgets)]
    widths = []
    real = model.forward

    def spy(*args, **kwargs):
        widths.append(tuple(kwargs["input_ids"].shape))
        return real(*args, **kwargs)

    model.forward = spy
    shapes = []  # what the output layer is given: the rows' last prefix tokens only, then a token a row
    hook = model.get_output_embeddings().register_forward_hook(lambda m, args, out: shapes.append(args[0].shape))
    try:
        ids, mask = left_padded(heads, tok.pad_token_id)
        got, steps = decode(model, ids, mask, budgets, greedy)
    finally:
        del model.forward
        hook.remove()
    assert tuple(shapes[0]) == (1, len(heads), model.config.hidden_size)
    assert got == want and steps == sum(budgets)
    distinct = {tuple(h) for h in heads}
    longest = [h for h in distinct if not any(o != h and o[: len(h)] == h for o in distinct)]
    assert len(longest) < len(distinct) == 3  # all 3 open with the same prompt: nested ones are read from others
    assert widths[0] == (len(longest), 9) and all(w[1] == 1 for w in widths[1:])  # encoded once, then a token a step


def test_nest_reads_each_sequence_from_the_longest_it_begins():
    heads = [(1, 2), (1, 2, 3), (1, 5), (1, 2, 3, 4), (7,), (1,), (1, 2, 4)]
    sources, source_of = nest(heads)
    assert sorted(sources) == [(1, 2, 3, 4), (1, 2, 4), (1, 5), (7,)]
    for head, s in zip(heads, source_of):
        assert sources[s][: len(head)] == head
    assert nest([]) == ([], [])


def test_sampled_rows_are_generates_under_the_same_seed_while_none_has_left(model_and_tok):  # noqa: F811
    """Temperature, top-k and top-p as `generate` applies them, one multinomial draw per row and step:
    with no EOS and one budget for all, every draw is the one `generate` makes."""
    model, tok = model_and_tok
    sources = sources_of(model, tok, n=4, length=16, seed=3)
    heads = [sources[s][: 4 + 3 * s] for s in range(4)]
    kwargs = dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, pad_token_id=tok.pad_token_id,
                  eos_token_id=None)
    ids, mask = left_padded(heads, tok.pad_token_id)
    torch.manual_seed(11)
    want = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=9, **kwargs)[:, ids.shape[1]:].tolist()
    torch.manual_seed(11)
    got, steps = decode(model, ids, mask, [9] * 4, kwargs)
    assert got == want and steps == 36
    torch.manual_seed(12)  # another seed, other draws: the comparison above can fail
    assert decode(model, ids, mask, [9] * 4, kwargs)[0] != want


def test_zero_budgets_and_a_generation_config_it_would_not_apply(model_and_tok):  # noqa: F811
    model, tok = model_and_tok
    ids, mask = left_padded([[5, 6], [7]], tok.pad_token_id)
    greedy = dict(do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=None)
    got, steps = decode(model, ids, mask, [0, 3], greedy)
    assert got[0] == [] and len(got[1]) == 3 and steps == 3
    assert decode(model, ids, mask, [0, 0], greedy) == ([[], []], 0)
    model.generation_config.repetition_penalty = 1.3
    try:
        with pytest.raises(ValueError, match="repetition_penalty=1.3: use --hf_decoding generate"):
            check_generation_config(model)
    finally:
        model.generation_config.repetition_penalty = 1.0
    check_generation_config(model)


@pytest.mark.parametrize("round_tokens", [0, 4])
def test_separate_continuations_through_the_loop_are_generates(model_and_tok, round_tokens):  # noqa: F811
    """sample_separate with decoding='loop': each greedy row is `generate`'s from its prefix alone,
    and the steps computed are the tokens kept (fill 1), against under 1 through `generate` in one round."""
    model, tok = model_and_tok
    sources = sources_of(model, tok, n=3, length=20, seed=2)
    prefixes = [sources[s][:cut] for s in range(3) for cut in (4, 9, 15)]
    budgets = [5 + 3 * (i % 3) for i in range(len(prefixes))]
    free = dict(do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=None)
    eos = alone(model, prefixes[0], budgets[0], **free)[2]
    greedy = dict(free, eos_token_id=eos)
    common = dict(copies=2, batch_size=4, generate_kwargs=greedy, pad_id=tok.pad_token_id, eos_id=eos, device="cpu",
                  round_tokens=round_tokens)
    import rl.continuations as C

    real, sizes = C.decode, []

    def spy(model, ids, *args, **kwargs):
        sizes.append(ids.shape[0])
        return real(model, ids, *args, **kwargs)

    C.decode = spy
    try:
        looped, stats = sample_separate(model, prefixes, budgets, decoding="loop", **common)
    finally:
        C.decode = real
    generated, before = sample_separate(model, prefixes, budgets, **common)
    assert looped == generated
    for i, (p, b) in enumerate(zip(prefixes, budgets)):
        assert looped[2 * i] == looped[2 * i + 1] == alone(model, p, b, **greedy)
    assert stats["tokens"] == before["tokens"] and stats["fill"] == 1.0
    if not round_tokens:  # in one round generate computes ended rows until its chunk's longest ends
        assert before["fill"] < 1.0
    assert stats["generate_calls"] == len(sizes) and max(sizes) <= 4  # chunks of whole sources, within the batch
    if not round_tokens:  # one round: every row sampled once
        assert sum(sizes) == 18


def test_the_trainer_samples_rollouts_and_continuations_through_the_loop(policy_dir, tmp_path):  # noqa: F811
    """--hf_decoding loop: an mc_values update runs with its rollouts and continuations decoded by the
    loop (spied on), every continuation's decoding steps its own tokens; a bad value, vLLM rollouts or
    the shared sampling is refused when the config is made."""
    import rl.continuations as C
    import rl.rollouts as R
    from rl.ppo_config import StepPPOConfig

    calls = {"rollouts": 0, "continuations": 0}

    def spy(name, real):
        def wrapped(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return wrapped

    trainer, _, _ = make_trainer(policy_dir, tmp_path, hf_decoding="loop")
    policy = trainer.model.policy
    policy.generate = None  # generate is not called: the loop does it all
    real_r, real_c = R.decode, C.decode
    R.decode, C.decode = spy("rollouts", real_r), spy("continuations", real_c)
    try:
        metrics = trainer.step(0)
    finally:
        R.decode, C.decode = real_r, real_c
    assert calls["rollouts"] == 1 and calls["continuations"] >= 1
    assert metrics["continuations/fill"] == 1.0 and metrics["continuations/tokens"] > 0
    with pytest.raises(ValueError, match="--hf_decoding must be one of generate, loop; got 'fast'"):
        StepPPOConfig(output_dir=str(tmp_path / "x"), hf_decoding="fast", report_to="none")
    with pytest.raises(ValueError, match="--hf_decoding loop decodes with transformers; with --use_vllm true"):
        StepPPOConfig(output_dir=str(tmp_path / "x"), hf_decoding="loop", use_vllm=True, report_to="none")
    with pytest.raises(ValueError, match="--hf_decoding loop applies to --continuation_sampling separate"):
        StepPPOConfig(output_dir=str(tmp_path / "x"), hf_decoding="loop", continuation_sampling="shared",
                      advantage_estimator="mc_values", report_to="none")
