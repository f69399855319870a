"""The decoding loop that drops rows as they end (`rl/decoding.py`, `--hf_decoding loop`): greedy rows
are `generate`'s token for token whatever the rows' lengths, budgets and ends; sampled rows are
`generate`'s under the same seed while no row has left; each step computes only its live rows; a
generation config it would not apply is refused; and the trainer's rollouts and continuations use it."""

import pytest
import torch
from test_continuations import model_and_tok, sources_of  # noqa: F401  (model_and_tok: a fixture)
from test_mc_values import make_trainer, policy_dir  # noqa: F401  (policy_dir: a fixture)

from rl.continuations import sample_separate
from rl.decoding import check_generation_config, decode, left_padded


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


def test_equal_rows_are_encoded_once_and_decoded_as_generate_does(model_and_tok):  # noqa: F811
    """A prompt's samples and a prefix's copies: the first forward sees each distinct row once, and the
    rows (repeated cache rows, each then its own) are still `generate`'s, greedy, row by row."""
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
    try:
        ids, mask = left_padded(heads, tok.pad_token_id)
        got, steps = decode(model, ids, mask, budgets, greedy)
    finally:
        del model.forward
    assert got == want and steps == sum(budgets)
    assert widths[0] == (3, 9) and all(w[1] == 1 for w in widths[1:])  # 3 distinct rows encoded, then one token a step


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
    looped, stats = sample_separate(model, prefixes, budgets, decoding="loop", **common)
    generated, before = sample_separate(model, prefixes, budgets, **common)
    assert looped == generated
    for i, (p, b) in enumerate(zip(prefixes, budgets)):
        assert looped[2 * i] == looped[2 * i + 1] == alone(model, p, b, **greedy)
    assert stats["tokens"] == before["tokens"] and stats["fill"] == 1.0
    if not round_tokens:  # in one round generate computes ended rows until its chunk's longest ends
        assert before["fill"] < 1.0
    assert stats["generate_calls"] == before["generate_calls"]


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
