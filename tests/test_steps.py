"""Step segmentation: the tagged format, its broken variants, and untagged fallbacks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reasoning.steps import (
    ANSWER_MATCHES,
    answer_correct,
    check_answer_match,
    has_answer,
    join_steps,
    prefix_text,
    split_steps,
)
from reasoning.types import Problem, ReasoningPath
from reasoning.world import generate, row_to_problem


def test_join_steps_renders_tags_joined_by_newlines():
    assert join_steps(["a", "b c"]) == "<Step> a</Step>\n<Step> b c</Step>"
    assert join_steps([]) == ""


@pytest.mark.parametrize("bad", ["x <Step> y", "x </Step>", "<Step>", "</Step>"])
def test_join_steps_rejects_tags_inside_a_step(bad):
    with pytest.raises(ValueError, match="step 1"):
        join_steps(["fine", bad])


def test_prefix_text_is_where_generation_resumes():
    assert prefix_text([]) == ""
    assert prefix_text(["a"]) == "<Step> a</Step>\n"
    steps = ["3 + 4 = 7", "7 * 2 = 14", "The answer is <ans>14</ans>."]
    for k in range(len(steps) + 1):
        continued = prefix_text(steps[:k]) + join_steps(steps[k:])
        assert split_steps(continued).steps == steps


def test_closed_tags():
    text = "<Step>Tom has 3 + 4 = 7.</Step>\n<Step> He gives 2 away: 5. The answer is <ans>5</ans>. </Step>"
    path = split_steps(text)
    assert isinstance(path, ReasoningPath)
    assert path.steps == ["Tom has 3 + 4 = 7.", "He gives 2 away: 5. The answer is <ans>5</ans>."]
    assert path.segmentation == "tags"
    assert path.answer == "5"
    assert path.raw == text
    assert path.num_steps == 2


def test_unclosed_last_tag_keeps_the_partial_step():
    path = split_steps("<Step>a = 1</Step>\n<Step>b = a + 2 = 3, so the ans")
    assert path.steps == ["a = 1", "b = a + 2 = 3, so the ans"]
    assert path.segmentation == "unclosed_tags"


def test_unclosed_tag_with_only_whitespace_adds_no_step():
    path = split_steps("<Step>a</Step>\n<Step>   \n")
    assert path.steps == ["a"]
    assert path.segmentation == "unclosed_tags"


def test_stray_close_tag_at_start_closes_the_leading_text():
    # a generation that continues a prompt ending in "<Step>" starts inside a step
    path = split_steps("first step</Step>\n<Step>second step</Step>")
    assert path.steps == ["first step", "second step"]
    assert path.segmentation == "tags"


def test_stray_close_tag_in_the_middle():
    path = split_steps("<Step>a</Step> b </Step><Step>c</Step>")
    assert path.steps == ["a", "b", "c"]
    assert path.segmentation == "tags"


def test_text_outside_tags_is_not_a_step_but_a_trailing_answer_counts():
    text = "Let me think.\n<Step>2 * 3 = 6</Step>\nnoise\n<Step>6 + 1 = 7</Step>\nThe answer is 7."
    path = split_steps(text)
    assert path.steps == ["2 * 3 = 6", "6 + 1 = 7"]
    assert path.segmentation == "tags"
    assert path.answer == "7"


def test_open_tag_inside_an_open_step_starts_a_new_step():
    path = split_steps("<Step>a <Step>b</Step>")
    assert path.steps == ["a", "b"]
    assert path.segmentation == "tags"


def test_nested_looking_text_that_is_not_a_tag_stays_in_the_step():
    text = "<Step>compare <step> and < Step > and Step> and </Step  ></Step><Step>x < 3 > 1</Step>"
    path = split_steps(text)
    assert path.steps == ["compare <step> and < Step > and Step> and </Step  >", "x < 3 > 1"]
    assert path.segmentation == "tags"


def test_whitespace_only_steps_are_dropped():
    path = split_steps("<Step>  </Step>\n<Step>\n\t</Step><Step>x</Step><Step></Step>")
    assert path.steps == ["x"]
    assert path.segmentation == "tags"


def test_only_empty_tags_give_zero_steps():
    path = split_steps("<Step></Step>")
    assert path.steps == []
    assert path.segmentation == "tags"


def test_no_tags_blank_lines():
    path = split_steps("First, 2 + 2 = 4.\nStill first.\n\n  \nThen 4 * 3 = 12.\n\nThe answer is 12.\n")
    assert path.steps == ["First, 2 + 2 = 4.\nStill first.", "Then 4 * 3 = 12.", "The answer is 12."]
    assert path.segmentation == "blank_lines"
    assert path.answer == "12"


def test_no_tags_lines():
    path = split_steps("a = 1\r\nb = 2\n   \nc = 3")
    # "   " between two newlines is a blank line, so this is paragraphs
    assert path.segmentation == "blank_lines"
    path = split_steps("a = 1\r\nb = 2\nc = 3\n")
    assert path.steps == ["a = 1", "b = 2", "c = 3"]
    assert path.segmentation == "lines"


def test_no_tags_single_line():
    path = split_steps("  The answer is 42  ")
    assert path.steps == ["The answer is 42"]
    assert path.segmentation == "whole"
    assert path.answer == "42"


@pytest.mark.parametrize("text", ["", " ", "\n\n\t  \r\n"])
def test_empty(text):
    path = split_steps(text)
    assert path.steps == []
    assert path.segmentation == "empty"
    assert path.answer is None
    assert path.raw == text


def test_very_long_text():
    steps = [f"step {i}: {i} + 1 = {i + 1}" for i in range(20_000)]
    path = split_steps(join_steps(steps) + "\n<Step>trunc")
    assert path.steps == steps + ["trunc"]
    assert path.segmentation == "unclosed_tags"
    assert path.answer == "20000"  # the last number, no explicit answer form
    long_untagged = "word " * 200_000
    path = split_steps(long_untagged)
    assert path.segmentation == "whole"
    assert len(path.steps) == 1


step_text = st.text(min_size=1).filter(lambda s: s.strip() and "<Step>" not in s and "</Step>" not in s)


@settings(max_examples=300, deadline=None)
@given(st.lists(step_text, max_size=8))
def test_round_trip(steps):
    assert split_steps(join_steps(steps)).steps == [s.strip() for s in steps]


@settings(max_examples=300, deadline=None)
@given(st.lists(step_text, min_size=1, max_size=6), st.data())
def test_round_trip_through_a_kept_prefix(steps, data):
    k = data.draw(st.integers(0, len(steps)))
    assert split_steps(prefix_text(steps[:k]) + join_steps(steps[k:])).steps == [s.strip() for s in steps]


tag_soup = st.lists(
    st.one_of(
        st.sampled_from(["<Step>", "</Step>", "\n", "\n\n", " ", "<ans>", "</ans>"]), st.text(max_size=10)
    ),
    max_size=20,
).map("".join)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(), tag_soup))
def test_split_never_raises_and_steps_are_clean(text):
    path = split_steps(text)
    assert path.segmentation in ("tags", "unclosed_tags", "blank_lines", "lines", "whole", "empty")
    assert path.raw == text
    for step in path.steps:
        assert step and step == step.strip()
        assert "<Step>" not in step and "</Step>" not in step
    assert (path.segmentation == "empty") == (not text.strip())


def test_answer_rules():
    problem = row_to_problem(generate("train", 1, 0)[0])
    assert answer_correct(f"The answer is <ans>{problem.answer}</ans>.", problem)
    assert not answer_correct(f"Ava has 1 + {problem.answer} = {problem.answer} cards.", problem)  # no answer
    assert has_answer("so the answer is 3") and not has_answer("Ava has 3 cards.")
    assert has_answer(r"\boxed{3}") and has_answer("<ans>3</ans>")
    # a problem without a gold answer is never answered right
    assert not answer_correct("The answer is <ans></ans>.", Problem(id="p", question="q", answer=""))


def test_answer_match_modes_differ_only_on_an_unstated_answer():
    problem = Problem(id="p", question="q", answer="12")
    stated, trailing, none, stated_wrong = ("The answer is <ans>12</ans>.", "So she has 3 + 9 = 12",
                                            "She has many apples.", "The answer is 11, not 12")
    assert ANSWER_MATCHES == ("strict", "flexible")
    # a stated answer: right under both
    assert answer_correct(stated, problem, "strict") and answer_correct(stated, problem, "flexible")
    assert answer_correct(r"so \boxed{12}", problem, "strict")
    # a trailing number only: flexible counts it, strict (the default) does not
    assert not answer_correct(trailing, problem) and not answer_correct(trailing, problem, "strict")
    assert answer_correct(trailing, problem, "flexible")
    # no number, or a stated wrong answer: wrong under both (a stated answer wins over the last number)
    for text in (none, stated_wrong):
        assert not answer_correct(text, problem, "strict") and not answer_correct(text, problem, "flexible")
    # a prediction taken elsewhere (a method's vote) is graded in place of the text's own extraction
    assert answer_correct(trailing, problem, "flexible", prediction="12")
    assert not answer_correct(trailing, problem, "strict", prediction="12")
    assert answer_correct(stated, problem, "strict", prediction="12.0")
    assert not answer_correct(stated, problem, "flexible", prediction="13")
    # no gold answer: wrong under both
    assert not answer_correct(trailing, Problem(id="p", question="q", answer=""), "flexible")
    with pytest.raises(ValueError, match="--answer_match must be one of strict, flexible; got 'loose'"):
        check_answer_match("loose")
    with pytest.raises(ValueError, match="match must be one of"):
        answer_correct(stated, problem, "loose")
