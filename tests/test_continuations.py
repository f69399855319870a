"""Continuations from step boundaries with shared prefixes (`rl/continuations.py`,
`--continuation_sampling shared`): equal prefixes are continued once, a response is encoded once and
each row's KV cache is cut from it, and the rows are what `generate` samples without the cache (the
same tokens under the same seed, greedy and sampled). Then the trainer's two ways agree in what they
measure and the shared one samples fewer rows in fewer calls."""

import pytest
import torch
from test_mc_values import make_trainer, policy_dir  # noqa: F401  (policy_dir: a fixture)

from rl.continuations import chunks, plan, row_cache, sample_separate, sample_shared, segment_ends
from rl.decoding import encode_sources
from rl.models import build_tiny_causal_lm
from rl.rollouts import _sources_of


@pytest.fixture(scope="module")
def model_and_tok():
    from reasoning.tokenizer import train_tokenizer

    texts = [f"Ava has {a} apples and gets {b} more, so she has {a + b} apples." for a in range(12) for b in range(6)]
    tok = train_tokenizer(texts, vocab_size=200)
    model = build_tiny_causal_lm(tok, hidden_size=32, num_layers=2, num_heads=2, seed=0).eval()
    return model, tok


def sources_of(model, tok, n=4, length=30, seed=0):
    """`n` sampled sequences of `length` tokens (no EOS inside) to cut prefixes from."""
    torch.manual_seed(seed)
    start = tok("Ava has 3 apples", add_special_tokens=False)["input_ids"]
    ids = torch.tensor([start] * n)
    gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=0,
                         max_new_tokens=length, min_new_tokens=length, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id)
    return gen.tolist()


def test_the_plan_shares_equal_prefixes_whichever_source_they_come_from():
    sources = [[1, 2, 3, 4], [1, 2, 9, 9], [1, 2, 3, 4, 5]]
    got = plan(sources, [(0, 2), (1, 2), (0, 3), (2, 3), (2, 5), (0, 2)])
    assert got.unique == [(0, 2), (0, 3), (2, 5)]
    assert got.of_request == [0, 0, 1, 1, 2, 0]
    for bad in [(0, 0), (0, 5)]:
        with pytest.raises(ValueError, match="a prefix of"):
            plan(sources, [bad])


def test_chunks_keep_a_source_whole_and_stay_within_the_batch():
    unique = [(0, 3), (0, 5), (1, 2), (1, 4), (1, 6), (2, 3)]
    assert chunks(unique, copies=2, batch_size=6) == [[0, 1], [2, 3, 4], [5]]
    assert chunks(unique, copies=1, batch_size=100) == [[0, 1, 2, 3, 4, 5]]
    # one source needing more rows than the batch still goes, alone
    assert chunks(unique, copies=4, batch_size=4) == [[0, 1], [2, 3, 4], [5]]


def test_sources_are_each_owners_longest_prefix():
    prefixes = [[1, 2], [1, 2, 3], [7], [1, 5], [7, 8]]
    sources, requests = _sources_of(prefixes, [0, 0, 1, 0, 1])
    assert sources[:2] == [[1, 2, 3], [7, 8]]
    assert requests[:3] == [(0, 2), (0, 3), (1, 1)] and requests[4] == (1, 2)
    assert sources[requests[3][0]] == [1, 5]  # not a prefix of its owner's longest: its own source
    assert _sources_of(prefixes, None) == (prefixes, [(i, len(p)) for i, p in enumerate(prefixes)])


def test_a_rows_cache_is_the_cache_of_its_own_prefix(model_and_tok):
    model, tok = model_and_tok
    sources = sources_of(model, tok, n=3, length=12)
    lengths = [len(sources[0]), len(sources[1]) - 4, len(sources[2]) - 7]
    layers, pads, _ = encode_sources(model, [s[:n] for s, n in zip(sources, lengths)], tok.pad_token_id, "cpu")
    pads = pads.tolist()
    rows = [(0, 5), (1, 9), (2, 1), (0, lengths[0])]
    width = max(n for _, n in rows) + 2
    cut = row_cache(layers, pads, rows, width)
    for r, (s, n) in enumerate(rows):
        alone = model(input_ids=torch.tensor([sources[s][:n]]), use_cache=True).past_key_values
        for layer, (keys, values) in enumerate(cut):
            want_k, want_v = alone.layers[layer].keys[0], alone.layers[layer].values[0]
            assert torch.allclose(keys[r, :, width - n :], want_k, atol=1e-5)
            assert torch.allclose(values[r, :, width - n :], want_v, atol=1e-5)
            assert keys[r, :, : width - n].abs().sum() == 0  # the left padding holds nothing


def _alone(model, tok, prefix, budget, **kwargs):
    gen = model.generate(input_ids=torch.tensor([prefix]), attention_mask=torch.ones(1, len(prefix), dtype=torch.long),
                         max_new_tokens=budget, **kwargs)[0, len(prefix) :].tolist()
    return gen[: gen.index(tok.eos_token_id) + 1] if tok.eos_token_id in gen else gen


def test_greedy_continuations_equal_generate_from_each_prefix(model_and_tok):
    model, tok = model_and_tok
    sources = sources_of(model, tok)
    requests = [(s, cut) for s in range(4) for cut in (3, 11, 20, len(sources[s]))] + [(0, 11)]
    budgets = [9 + (i % 4) for i in range(len(requests))]
    greedy = dict(do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    out, stats = sample_shared(model, sources, requests, budgets, copies=2, batch_size=10, generate_kwargs=greedy,
                               pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, device="cpu")
    assert len(out) == 2 * len(requests)
    distinct = len({tuple(sources[s][:cut]) for s, cut in requests})  # the sources share their first tokens
    assert distinct < len(requests) - 1 and stats["distinct"] == distinct and stats["rows"] == 2 * distinct
    assert stats["generate_calls"] >= 2  # a batch of 10 rows holds two sources' 8 rows at most
    for r, ((s, cut), budget) in enumerate(zip(requests, budgets)):
        want = _alone(model, tok, sources[s][:cut], budget, **greedy)
        assert out[2 * r] == want and out[2 * r + 1] == want, (r, s, cut)


def test_sampled_rows_are_generates_own_samples_under_the_same_seed(model_and_tok):
    """The cache changes nothing of the sampling: the same rows (a chunk's left-padded prefixes) given
    to `generate` without a cache, under the same seed, sample the same tokens."""
    model, tok = model_and_tok
    sources = sources_of(model, tok, n=3, length=16, seed=1)
    requests = [(0, 6), (0, 12), (1, 4), (1, 17), (2, 9)]
    sampling = dict(do_sample=True, temperature=1.0, top_p=0.9, top_k=0, pad_token_id=tok.pad_token_id,
                    eos_token_id=tok.eos_token_id)
    torch.manual_seed(5)
    out, stats = sample_shared(model, sources, requests, [15] * len(requests), copies=3, batch_size=64,
                               generate_kwargs=sampling, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id,
                               device="cpu")
    assert stats["generate_calls"] == 1
    rows = [sources[s][:cut] for s, cut in requests for _ in range(3)]
    width = max(len(r) for r in rows)
    ids = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    torch.manual_seed(5)
    gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=15, **sampling)[:, width:].tolist()
    want = []
    for g in gen:  # up to and with the first EOS; without one, the trailing padding off
        g = g[: g.index(tok.eos_token_id) + 1] if tok.eos_token_id in g else g
        while g and g[-1] == tok.pad_token_id and tok.pad_token_id != tok.eos_token_id:
            g = g[:-1]
        want.append(g)
    assert out == want
    assert len({tuple(o) for o in out[:3]}) > 1  # three copies of a prefix are three samples


@pytest.mark.parametrize("reward, estimator", [("gold+progress", "group"), ("gold", "mc_values")])
def test_the_trainer_measures_the_same_either_way_and_shares_samples(policy_dir, tmp_path, reward,  # noqa: F811
                                                                     estimator):
    """Shared and separate sampling of one batch: the same requests, each `m` continuations within
    budget; shared samples no more rows, in fewer generate calls, and counts a shared continuation once."""
    got = {}
    for way in ("shared", "separate"):
        counts = dict(progress_rollouts=3) if reward == "gold+progress" else dict(mc_rollouts=3)
        trainer, tok, train = make_trainer(policy_dir, tmp_path / way, reward=reward, advantage_estimator=estimator,
                                           continuation_sampling=way, num_generations=4, prompts_per_update=2,
                                           generation_batch_size=8, **counts)
        torch.manual_seed(0)
        batch = trainer.sampler.generate(0)
        torch.manual_seed(1)
        rewards, _ = trainer.rewards(batch)
        if reward == "gold+progress":
            stats = trainer.sampler.progress_rewards(batch, rewards)[1]
        else:
            stats = trainer.sampler.mc_step_values(batch, rewards, trainer.rewards).stats
        _, tstats = trainer.sampler.sample_continuations([[5, 6, 7]] * 2, [4, 4], copies=3, owners=[0, 1])
        got[way] = (stats, tstats)
    shared, separate = got["shared"][0], got["separate"][0]
    assert shared["continuations/requests"] == separate["continuations/requests"] > 0
    assert shared["continuations/rows"] <= separate["continuations/rows"]
    assert shared["continuations/generate_calls"] < separate["continuations/generate_calls"]
    tokens = "rollout/progress_tokens" if reward == "gold+progress" else "rollout/mc_tokens"
    assert shared[tokens] == shared["continuations/tokens"] > 0
    # two equal prefixes: shared samples 3 rows for both, separate 6
    assert got["shared"][1]["continuations/rows"] == 3 and got["separate"][1]["continuations/rows"] == 6


def test_segment_ends_keep_k_evenly_spaced_boundaries_and_the_last_end():
    ends = [3, 7, 12, 20, 25, 31]  # six steps: five boundaries inside
    assert segment_ends(ends, 0) == ends and segment_ends(ends, 5) == ends and segment_ends(ends, 9) == ends
    assert segment_ends(ends, 1) == [12, 31]  # after step 3 of 6
    assert segment_ends(ends, 2) == [7, 20, 31]  # after steps 2 and 4
    assert segment_ends(ends, 3) == [7, 12, 25, 31]  # after steps 1.5, 3 and 4.5, rounded half up
    assert segment_ends([5], 2) == [5] and segment_ends([], 2) == []
    for k in range(1, 8):
        for n in range(1, 12):
            got = segment_ends(list(range(n)), k)
            assert got[-1] == n - 1 and got == sorted(set(got)) and len(got) - 1 == min(k, n - 1)


def test_a_run_stored_before_the_continuation_settings_existed_resumes_with_their_defaults():
    from rl.ppo_config import StepPPOConfig
    from rl.run_dir import settings_changes

    defaults = StepPPOConfig(output_dir="unused", report_to="none")
    names = ("continuation_sampling", "continuation_batch_size", "continuation_boundaries")
    current = {"learning_rate": 1e-3, **{n: getattr(defaults, n) for n in names}}
    assert settings_changes({"learning_rate": 1e-3}, current) == []  # stored before they existed
    assert settings_changes({"learning_rate": 1e-3}, {**current, "continuation_boundaries": 2}) == [
        "continuation_boundaries: 0 -> 2"]


def test_separate_chunks_follow_the_expected_lengths_and_report_their_fill(policy_dir, tmp_path):  # noqa: F811
    """--continuation_sampling separate with `expected`: rows sorted by how long they likely run
    (not by budget), so that a call's rows end together; `fill` is the share of the calls' decoding
    steps (rows x steps) that sampled a kept token."""
    trainer, tok, _ = make_trainer(policy_dir, tmp_path, reward="gold+progress", advantage_estimator="group",
                                   continuation_sampling="separate", generation_batch_size=2)
    policy = trainer.accelerator.unwrap_model(trainer.model).policy
    real, calls = policy.generate, []

    def spy(**kwargs):
        gen, ids = real(**kwargs), kwargs["input_ids"]
        calls.append((ids[:, -1].tolist(), gen.shape[0] * (gen.shape[1] - ids.shape[1])))
        return gen

    policy.generate = spy
    prefixes = [[5, 6, 10 + i] for i in range(4)]  # each request known by its last token
    out, stats = trainer.sampler.sample_continuations(prefixes, [12, 12, 12, 12], expected=[1, 12, 2, 11])
    assert [sorted(ids) for ids, _ in calls] == [[11, 13], [10, 12]]  # the two longest together, then the rest
    assert stats["continuations/generate_calls"] == 2 and stats["continuations/tokens"] == sum(len(c) for c in out)
    assert stats["continuations/fill"] == pytest.approx(sum(len(c) for c in out) / sum(s for _, s in calls))
    assert 0 < stats["continuations/fill"] <= 1


@pytest.mark.parametrize("round_tokens", [0, 1, 4])
def test_separate_rounds_continue_where_they_stopped(model_and_tok, round_tokens):
    """Greedy, so that the draws cannot differ: in rounds of 1 or 4 new tokens each row is the row
    `generate` gives from its prefix alone, within its budget and ended at the first EOS (here a
    token the greedy continuations do emit, so that some rows end inside a round and leave)."""
    model, tok = model_and_tok
    sources = sources_of(model, tok, n=3, length=20, seed=2)
    prefixes = [sources[s][:cut] for s in range(3) for cut in (4, 9, 15)]
    budgets = [5 + 3 * (i % 3) for i in range(len(prefixes))]  # 5, 8 or 11 new tokens
    free = dict(do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=None)
    seen = [model.generate(input_ids=torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                           max_new_tokens=b, **free)[0, len(p):].tolist() for p, b in zip(prefixes, budgets)]
    eos = seen[0][2]  # the third token of the first row: that row ends inside the first round of 4
    greedy = dict(do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=eos)
    out, stats = sample_separate(model, prefixes, budgets, copies=2, batch_size=4, generate_kwargs=greedy,
                                 pad_id=tok.pad_token_id, eos_id=eos, device="cpu",
                                 expected=[b - 2 for b in budgets], round_tokens=round_tokens)
    for i, row in enumerate(seen):
        want = row[: row.index(eos) + 1] if eos in row else row
        assert out[2 * i] == want and out[2 * i + 1] == want, (i, round_tokens)
    assert sum(eos in row for row in seen) < len(seen)  # some rows run to their budget
    assert stats["tokens"] == sum(len(c) for c in out) and 0 < stats["fill"] <= 1
    if round_tokens:
        assert stats["rounds"] == -(-max(budgets) // round_tokens)  # the longest row's budget, round by round
    else:
        assert stats["rounds"] == 1 and stats["generate_calls"] == 5  # 18 rows in chunks of 4
