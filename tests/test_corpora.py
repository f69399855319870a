"""Training corpora for every prompt format, and the tiny tokenizer."""

import random

import pytest

from reasoning import prompts
from reasoning.corpora import TASKS, build_corpus, clarified_question, make_row
from reasoning.steps import split_steps
from reasoning.tokenizer import TAG_TOKENS, train_tokenizer
from reasoning.world import WorldConfig, earliest_error, generate


@pytest.fixture(scope="module")
def rows():
    return generate("train", 60, seed=0, config=WorldConfig(min_distractors=1))


def test_solve_rows_are_gold(rows):
    rng = random.Random(0)
    for row in rows:
        r = make_row(row, "solve", rng)
        assert r["prompt"] == prompts.solve_prompt(row["question"])
        assert earliest_error(row, split_steps(r["completion"]).steps) == -1


def test_revise_rows_point_at_the_error_and_complete_from_it(rows):
    rng = random.Random(0)
    for row in rows:
        r = make_row(row, "revise", rng)
        shown = split_steps(r["prompt"].split("Feedback:")[0].split("Answer:\n", 1)[1]).steps
        k = int(r["prompt"].split("Revise steps ")[1].split(" ")[0])
        assert earliest_error(row, shown) == k - 1
        kept = split_steps(r["prompt"].split("Revised answer:\n", 1)[1]).steps
        assert kept == row["steps"][: k - 1]
        assert earliest_error(row, kept + split_steps(r["completion"]).steps) == -1


def test_clarify_drops_exactly_the_distractors(rows):
    for row in rows:
        clarified = clarified_question(row)
        assert all(d not in clarified for d in row["world"]["distractors"])
        assert len(clarified) < len(row["question"])
        assert clarified.endswith("?")


def test_verify_verdicts_match_the_proposed_answer(rows):
    rng = random.Random(0)
    seen = set()
    for row in rows * 2:
        r = make_row(row, "verify", rng)
        proposed = r["prompt"].split("Proposed answer: ")[1].split("\n")[0]
        verdict = prompts.parse_verdict(r["completion"])
        assert verdict == (proposed == row["answer"])
        seen.add(verdict)
    assert seen == {True, False}


def test_explore_rows_hold_errors_and_gold(rows):
    rng = random.Random(0)
    errors = [earliest_error(row, split_steps(make_row(row, "explore", rng)["completion"]).steps) for row in rows]
    assert any(e == -1 for e in errors) and any(e >= 0 for e in errors)


def test_build_corpus_mixture(rows):
    corpus = build_corpus(rows, {"solve": 1.0, "revise": 0.5}, seed=0)
    tasks = [r["task"] for r in corpus]
    assert tasks.count("solve") == len(rows)
    assert 0 < tasks.count("revise") < len(rows)
    assert build_corpus(rows, {"solve": 1.0, "revise": 0.5}, seed=0) == corpus
    with pytest.raises(ValueError, match="unknown tasks"):
        build_corpus(rows, {"dance": 1.0})
    assert set(TASKS) == {"solve", "explore", "revise", "clarify", "verify"}


def test_revise_prompt_rejects_bad_index():
    with pytest.raises(ValueError):
        prompts.revise_prompt("q", ["a", "b"], 3, 0.2)


def test_tokenizer_round_trips_and_keeps_tags_whole(rows):
    corpus = build_corpus(rows, seed=0)
    tok = train_tokenizer((r["prompt"] + r["completion"] for r in corpus), vocab_size=400)
    for text in [corpus[0]["prompt"] + corpus[0]["completion"], "Let $x=\\frac{1}{2}$, café 12,345 ∑"]:
        assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    for tag in TAG_TOKENS:
        assert len(tok(tag, add_special_tokens=False)["input_ids"]) == 1
    digits = tok.convert_ids_to_tokens(tok(" 1234", add_special_tokens=False)["input_ids"])
    assert [d.lstrip("Ġ") for d in digits if d.lstrip("Ġ")] == ["1", "2", "3", "4"]
    assert tok.pad_token_id != tok.eos_token_id


def test_teacher_noise_misreads_at_its_rate_and_leaves_the_clean_corpus_alone(rows):
    from reasoning.corpora import parse_teacher_noise
    from reasoning.world import check_steps, misreadings_of

    weights = {"solve": 1.0, "explore": 0.1}
    clean = build_corpus(rows, weights, seed=0)
    assert build_corpus(rows, weights, seed=0, teacher_noise="none") == clean
    noisy = build_corpus(rows, weights, seed=0, teacher_noise="inverse=1.0,stale=0.0")
    by_id = {r["id"]: r for r in rows}
    solve = [r for r in noisy if r["task"] == "solve"]
    misread = [r for r in solve if r.get("misread")]
    having = [r for r in rows if "inverse" in misreadings_of(r)]
    assert len(misread) == len(having) > 0  # rate 1: every problem with an inverse phrasing
    for r in misread:
        assert r["misread"] == "inverse"
        steps = [s.strip() for s in r["completion"].replace("<Step>", "").split("</Step>") if s.strip()]
        assert any(c.kind == "misread_inverse" for c in check_steps(by_id[r["id"]], steps))
    # the other tasks keep gold steps
    assert [r for r in noisy if r["task"] != "solve"] == [r for r in clean if r["task"] != "solve"]
    assert parse_teacher_noise("inverse=0.7, stale=0.5") == {"inverse": 0.7, "stale": 0.5}
    assert parse_teacher_noise("none") == {}
    for bad in ("sloppy=0.5", "inverse=2", "inverse", "inverse=x"):
        with pytest.raises(ValueError):
            parse_teacher_noise(bad)
