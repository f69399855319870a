"""Step rewards: where steps end (chars, then policy tokens), shaping, dense assignment, normalisation."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reasoning.steps import join_steps, split_steps
from reasoning.world import WorldConfig, generate
from rl.step_rewards import (
    RunningMeanStd,
    _prefix_ends,
    _window_ends,
    assign_rewards,
    char_to_token_positions,
    clip_rewards,
    decode_with_offsets,
    offsets_from_token_ids,
    shape_step_rewards,
    step_end_char_positions,
    step_end_token_positions,
)

ROWS = generate("train", 40, 0, WorldConfig(min_steps=2, max_steps=4))


@pytest.fixture(scope="module")
def policy_tok():
    """The toolkit's byte-level BPE: `<Step>` and `</Step>` are single tokens."""
    from reasoning.tokenizer import train_tokenizer

    return train_tokenizer([r["question"] + join_steps(r["steps"]) for r in ROWS], vocab_size=300)


@pytest.fixture(scope="module")
def psv_tok():
    """Another byte-level BPE, larger vocabulary, without tag tokens: `</Step>` is split up."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420,
        special_tokens=["<pad>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([r["question"] + " ".join(r["steps"]) for r in ROWS], trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>")


# --- where steps end, in characters ---------------------------------------------------------------


def test_closed_steps_end_at_the_gt_of_their_close_tag():
    text = "<Step> a = 1</Step>\n<Step> b = 2</Step>\n<Step> ans 3</Step>"
    # each "<Step> x = y</Step>" is 6 + 6 + 7 = 19 chars, joined by "\n": '>' at 18, 20+18, 40+18
    assert step_end_char_positions(text) == [18, 38, 58]
    assert all(text[p] == ">" for p in [18, 38, 58])


def test_unclosed_last_step_ends_at_its_last_non_space_char():
    text = "<Step> a = 1</Step>\n<Step> b = 2  \n"
    # second step: "<Step>" at 20..25, " b = 2" at 26..31, so '2' is at 31
    assert step_end_char_positions(text) == [18, 31]
    assert split_steps(text).steps == ["a = 1", "b = 2"]
    assert step_end_char_positions("<Step> a</Step>\n<Step>   \n") == [14]  # whitespace-only: no step


def test_broken_tags():
    # a forgotten </Step>: "a" (index 7) is cut by the next <Step>; "b" closes at 16..22
    assert step_end_char_positions("<Step> a<Step> b</Step>") == [7, 22]
    # a completion starting inside a step: "x" then "</Step>" at 1..7; "<Step> y</Step>" at 9..23
    assert step_end_char_positions("x</Step>\n<Step> y</Step>") == [7, 23]
    # an empty step is not a step: "<Step> </Step>" (0..13) is skipped
    assert step_end_char_positions("<Step> </Step>\n<Step> a</Step>") == [29]


def test_untagged_text_ends_each_chunk_at_its_last_char():
    assert step_end_char_positions("first line\nsecond") == [9, 16]  # lines
    assert step_end_char_positions("  para one\n\npara two\n") == [9, 19]  # blank_lines
    assert step_end_char_positions("  just one  ") == [9]  # whole
    assert step_end_char_positions("a\r\nb") == [0, 3]  # indices of the original text
    assert step_end_char_positions("a\r\rb\n \nc") == [0, 3, 7]
    assert step_end_char_positions("") == [] and step_end_char_positions(" \r\n ") == []


def _check_against_split_steps(text: str) -> None:
    steps = split_steps(text).steps
    positions = step_end_char_positions(text)
    assert len(positions) == len(steps), (text, positions, steps)
    assert positions == sorted(set(positions))
    for step, p in zip(steps, positions):
        # either the '>' of a closing tag, or the step's own last character
        assert text[p - 6 : p + 1] == "</Step>" or text[p] == step[-1], (text, p, step)


FRAGMENTS = [
    "<Step>",
    "</Step>",
    " ",
    "\n",
    "\r",
    "\r\n",
    "\t",
    "a",
    "7 + 8 = 15",
    "é",
    "日本",
    "🙂",
    "\n\n",
    "\u2028",
]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=14))
def test_one_position_per_step_of_split_steps(parts):
    _check_against_split_steps("".join(parts))


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=40))
def test_one_position_per_step_on_arbitrary_text(text):
    _check_against_split_steps(text)


def test_one_position_per_step_on_world_paths():
    for r in ROWS:
        text = join_steps(r["steps"])
        _check_against_split_steps(text)
        _check_against_split_steps(text + "\n<Step> and then")
        _check_against_split_steps("\n\n".join(r["steps"]))


# --- from characters to tokens --------------------------------------------------------------------

COMPLETION = "<Step> 3 + 4 = 7</Step>\n<Step> 7 * 2 = 14</Step>\n<Step> The answer is <ans>14</ans>.</Step>"


def test_rewards_land_on_the_close_tag_token(policy_tok):
    ids = policy_tok(COMPLETION, add_special_tokens=False)["input_ids"] + [policy_tok.eos_token_id]
    text, offsets = decode_with_offsets(policy_tok, ids)
    assert text == COMPLETION == policy_tok.decode(ids, skip_special_tokens=True)
    assert len(offsets) == len(ids) and offsets[-1] == (len(text), len(text))  # EOS: empty span
    chars = step_end_char_positions(text)
    positions = char_to_token_positions(offsets, chars)
    close_id = policy_tok.convert_tokens_to_ids("</Step>")
    assert [k for k, t in enumerate(ids) if t == close_id] == positions  # the 1st, 2nd, 3rd </Step>
    # dense rewards: the step scores on those tokens, the outcome on the EOS
    rewards = assign_rewards(shape_step_rewards([0.9, 0.2, 0.7], "raw"), positions, len(ids), outcome=1.0)
    expected = [0.0] * len(ids)
    expected[positions[0]], expected[positions[1]], expected[positions[2]] = 0.9, 0.2, 0.7
    expected[-1] = 1.0
    assert rewards == expected
    assert step_end_token_positions(policy_tok, ids) == (text, positions)


def test_offsets_mapping_and_generated_ids_agree(policy_tok, psv_tok):
    for tok in (policy_tok, psv_tok):
        for r in ROWS[:10]:
            text = join_steps(r["steps"])
            enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
            chars = step_end_char_positions(text)
            from_mapping = char_to_token_positions(enc["offset_mapping"], chars)
            decoded, offsets = decode_with_offsets(tok, enc["input_ids"])
            assert decoded == text
            assert char_to_token_positions(offsets, chars) == from_mapping
            assert offsets_from_token_ids(tok, enc["input_ids"]) == offsets
            decode_many = lambda batch, tok=tok: tok.batch_decode(batch, skip_special_tokens=True)  # noqa: E731
            assert _window_ends(decode_many, enc["input_ids"], text) is not None  # the O(n) path served


def test_different_tokenizers_each_find_their_own_last_token(policy_tok, psv_tok):
    assert len(policy_tok) != len(psv_tok)
    text = join_steps(ROWS[0]["steps"])
    chars = step_end_char_positions(text)
    for tok in (policy_tok, psv_tok):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        _, offsets = decode_with_offsets(tok, ids)
        positions = char_to_token_positions(offsets, chars)
        for c, p in zip(chars, positions):
            start, end = offsets[p]
            assert start <= c < end and text[c] == ">"  # the token holding the '>' of </Step>
            assert all(s >= end for s, e in offsets[p + 1 :] if e > s)  # nothing of the step after it
    psv_ids = psv_tok(text, add_special_tokens=False)["input_ids"]
    assert len(psv_ids) > len(policy_tok(text, add_special_tokens=False)["input_ids"])  # tags split up
    assert "</Step>" not in psv_tok.convert_ids_to_tokens(psv_ids)


def test_non_ascii_text_split_inside_characters(policy_tok):
    # the unclosed last step ends with an emoji: 4 UTF-8 bytes, several byte-level tokens
    text = "<Step> Zoë a 5 日本 apples.</Step>\n<Step> then 🙂🙂"
    ids = policy_tok(text, add_special_tokens=False)["input_ids"]
    decoded, offsets = decode_with_offsets(policy_tok, ids)
    assert decoded == text
    assert offsets[0][0] == 0 and offsets[-1][1] == len(text)
    for (s0, e0), (s1, e1) in zip(offsets, offsets[1:]):
        assert s0 <= e0 == s1 <= e1  # contiguous and non-decreasing
    assert any(s == e for s, e in offsets)  # some tokens end inside a character
    decode_many = lambda batch: policy_tok.batch_decode(batch, skip_special_tokens=True)  # noqa: E731
    assert _window_ends(decode_many, ids, text) == _prefix_ends(decode_many, ids, text)
    for i, (_, end) in enumerate(offsets):  # a span ends where the decoded prefix's complete text ends
        assert policy_tok.decode(ids[: i + 1]).startswith(text[:end])
    chars = step_end_char_positions(text)
    assert text[chars[1]] == "🙂"
    positions = char_to_token_positions(offsets, chars)
    assert positions[1] == len(ids) - 1  # the token completing the emoji
    mapping = policy_tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    assert char_to_token_positions(mapping, chars) == positions


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS + ["Zoë", "x² ", "<ans>", "</ans>"]), min_size=1, max_size=12))
def test_windowed_offsets_equal_the_exact_ones(policy_tok, parts):
    text = "".join(parts)
    ids = policy_tok(text, add_special_tokens=False)["input_ids"]
    if not ids:
        return
    full = policy_tok.decode(ids)

    def decode_many(batch):
        return policy_tok.batch_decode(batch, skip_special_tokens=True)

    exact = _prefix_ends(decode_many, ids, full)
    windowed = _window_ends(decode_many, ids, full)
    assert windowed is None or windowed == exact
    positions_text = step_end_char_positions(full)
    _, offsets = decode_with_offsets(policy_tok, ids)
    assert len(char_to_token_positions(offsets, positions_text)) == len(split_steps(full).steps)


class CharTokenizer:
    """A decoder-only stand-in without batch_decode; one token is a literal U+FFFD."""

    vocab = ["x", "\ufffd", "</Step>", "<Step>", " y"]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.vocab[i] for i in ids)


def test_a_literal_replacement_char_falls_back_to_exact_prefixes():
    ids = [3, 0, 1, 2, 3, 4]  # "<Step>x\ufffd</Step><Step> y"
    text, offsets = decode_with_offsets(CharTokenizer(), ids)
    assert text == "<Step>x\ufffd</Step><Step> y"
    assert _window_ends(lambda batch: [CharTokenizer().decode(b) for b in batch], ids, text) is None
    assert offsets == [(0, 6), (6, 7), (7, 8), (8, 15), (15, 21), (21, 23)]
    assert step_end_token_positions(CharTokenizer(), ids) == (text, [3, 5])
    assert decode_with_offsets(CharTokenizer(), []) == ("", [])


def test_char_to_token_positions_outside_the_text():
    assert char_to_token_positions([(0, 2), (2, 4)], [1, 3]) == [0, 1]
    with pytest.raises(ValueError, match="outside the 4 characters"):
        char_to_token_positions([(0, 2), (2, 4)], [4])
    with pytest.raises(ValueError, match="no token covers"):
        char_to_token_positions([(0, 0), (2, 4)], [1])


# --- shaping and assignment -----------------------------------------------------------------------


def test_shaping_modes_by_hand():
    p = [0.8, 0.3, 0.9]
    assert shape_step_rewards(p, "raw") == p
    assert shape_step_rewards(p, "centered") == pytest.approx([0.3, -0.2, 0.4])
    # delta from p_0 = 0.5: 0.8-0.5, 0.3-0.8, 0.9-0.3; sums to 0.9 - 0.5
    assert shape_step_rewards(p, "delta") == pytest.approx([0.3, -0.5, 0.6])
    assert sum(shape_step_rewards(p, "delta")) == pytest.approx(0.4)
    # min: only the weakest step (0.3) keeps its score
    assert shape_step_rewards(p, "min") == [0.0, 0.3, 0.0]
    assert shape_step_rewards([0.4, 0.2, 0.2], "min") == [0.0, 0.2, 0.0]  # tie: the earliest
    for mode in ("raw", "centered", "delta", "min"):
        assert shape_step_rewards([], mode) == []
    with pytest.raises(ValueError, match="raw, centered, delta, min"):
        shape_step_rewards(p, "sum")


def test_assign_rewards_by_hand():
    # steps end at tokens 1, 4, 4 (two steps in one token add up); outcome on the last token
    assert assign_rewards([0.5, 0.25, 0.25], [1, 4, 4], 6, outcome=1.0) == [0, 0.5, 0, 0, 0.5, 1.0]
    assert assign_rewards([0.5, 0.25, 0.25], [1, 4, 4], 6, outcome=1.0, last_token=4) == [
        0,
        0.5,
        0,
        0,
        1.5,
        0,
    ]
    assert assign_rewards([], [], 3) == [0.0, 0.0, 0.0]
    assert assign_rewards([], [], 0) == []
    with pytest.raises(ValueError, match="step 1 ends at token 6"):
        assign_rewards([0.1, 0.2], [0, 6], 6)
    with pytest.raises(ValueError, match="step 0 ends at token -1"):
        assign_rewards([0.1], [-1], 6)
    with pytest.raises(ValueError, match="2 step rewards but 1"):
        assign_rewards([0.1, 0.2], [0], 6)
    with pytest.raises(ValueError, match="outcome"):
        assign_rewards([], [], 0, outcome=1.0)
    with pytest.raises(ValueError, match="outcome"):
        assign_rewards([], [], 3, outcome=1.0, last_token=3)


# --- clipping and normalisation -------------------------------------------------------------------


def test_clip_rewards():
    assert clip_rewards([-3.0, 0.5, 2.0], 1.0) == [-1.0, 0.5, 1.0]
    assert clip_rewards(7, 2.0) == 2.0
    assert torch.equal(clip_rewards(torch.tensor([-3.0, 0.5]), 1.0), torch.tensor([-1.0, 0.5]))
    assert clip_rewards([5.0], None) == [5.0]
    with pytest.raises(ValueError, match="clip"):
        clip_rewards([1.0], 0.0)


def test_running_mean_std_by_hand():
    rms = RunningMeanStd()
    assert rms.normalize(5.0) == 5.0  # nothing seen yet: unchanged
    rms.update([1.0, 2.0, 3.0])
    rms.update(torch.tensor([[4.0]]))
    # 1, 2, 3, 4: mean 2.5; squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5; variance 5/4
    assert rms.count == 4 and rms.mean == pytest.approx(2.5)
    assert rms.var == pytest.approx(1.25) and rms.std == pytest.approx(math.sqrt(1.25))
    assert rms.normalize(5.0) == pytest.approx(5.0 / 1.118034, rel=1e-6)  # 4.472136
    assert rms.normalize([5.0], center=True) == pytest.approx([2.5 / 1.118034], rel=1e-6)  # 2.236068
    out = rms.normalize(torch.tensor([2.5]), center=True)
    assert isinstance(out, torch.Tensor) and out.item() == pytest.approx(0.0)
    restored = RunningMeanStd()
    restored.load_state_dict(rms.state_dict())
    assert (restored.count, restored.mean, restored.var) == (rms.count, rms.mean, rms.var)
    with pytest.raises(ValueError, match="NaN"):
        rms.update([float("nan")])
    assert rms.count == 4


def test_running_mean_std_matches_one_pass_statistics():
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(1000, generator=gen, dtype=torch.float64) * 3 + 7
    rms = RunningMeanStd()
    for chunk in values.split(37):
        rms.update(chunk)
    assert rms.mean == pytest.approx(values.mean().item(), rel=1e-12)
    assert rms.var == pytest.approx(values.var(unbiased=False).item(), rel=1e-10)


def test_credited_steps():
    from rl.step_rewards import credited_steps

    assert credited_steps([0.9, 0.2, 0.6], "raw") == [0, 1, 2]
    assert credited_steps([0.9, 0.2, 0.6], "delta") == [0, 1, 2]
    assert credited_steps([0.9, 0.2, 0.2], "min") == [1]  # the earliest of equal weakest
    assert credited_steps([], "min") == []
    with pytest.raises(ValueError):
        credited_steps([0.5], "sum")



def test_each_reward_says_what_it_pays():
    from rl.rewards import REWARDS

    assert [name for name, mode in REWARDS.items() if mode.pays_last_token] == ["outcome", "gold", "step+gold",
                                                                                "gold+progress"]
    assert [name for name, mode in REWARDS.items() if not mode.verifier] == ["gold", "progress", "gold+progress"]
    assert [name for name, mode in REWARDS.items() if mode.steps] == ["step", "step+gold"]
    assert [name for name, mode in REWARDS.items() if mode.progress] == ["progress", "gold+progress"]
