"""`exact-noisy`: the exact step checker with systematic errors (reward_models.exact_noisy)."""

import random

import pytest

from reasoning import world as w
from reward_models.exact import ExactVerifier
from reward_models.exact_noisy import NoiseSpec, SystematicExactVerifier, parse_noise_spec, step_draw
from reward_models.load import check_spec, load_verifier
from tests.test_world import HAND, INVERSE

ROWS = [HAND, INVERSE]
GOLD = HAND["steps"]  # draws (seed 0): 0.203, 0.275, 0.039
STALE = ["Ben has 7 + 3 = 10 marbles.", "The answer is <ans>10</ans>."]  # misread_stale (0.709), propagated
MISREAD = ["Fay has 6 - 4 = 2 marbles.", "The answer is <ans>2</ans>."]  # misread_inverse (0.028), propagated
DIRECT = ["Ava now has 7 - 2 = 5 marbles.", "Ben has 5 - 3 = 2 marbles.", "The answer is <ans>2</ans>."]
SLIP = ["Ava now has 7 - 2 = 4 marbles.", "Ben has 4 + 3 = 7 marbles.", "The answer is <ans>7</ans>."]  # slip 0.185


def verifier(spec: str):
    return load_verifier(f"exact-noisy:{spec}", world_rows=ROWS)


def score(spec: str, question: str, steps: list[str]) -> list[float]:
    return verifier(spec).score([question], [steps])[0]


def test_the_draws_are_fixed_hashes_of_question_and_step():
    # pinned, so that a change of the hash (which would move every level's F1) is seen
    assert [round(step_draw(HAND["question"], s), 3) for s in GOLD] == [0.203, 0.275, 0.039]
    assert round(step_draw(HAND["question"], STALE[0]), 3) == 0.709
    assert round(step_draw(INVERSE["question"], MISREAD[0]), 3) == 0.028
    assert round(step_draw(HAND["question"], SLIP[0]), 3) == 0.185
    assert round(step_draw(HAND["question"], STALE[0], seed=3), 3) == 0.279
    # surrounding blanks are not part of the step; the question is
    assert step_draw(HAND["question"], "  " + STALE[0] + "\n") == step_draw(HAND["question"], STALE[0])
    assert step_draw(INVERSE["question"], STALE[0]) != step_draw(HAND["question"], STALE[0])


@pytest.mark.parametrize(
    "spec, question, steps, want",
    [
        # false accepts: a wrong step of a chosen kind with draw < accept is judged right, and what
        # is computed from its value (the propagated answer) is believed with it
        ("accept=0.75/kinds=misread_stale", HAND["question"], STALE, [1.0, 1.0]),
        ("accept=0.70/kinds=misread_stale", HAND["question"], STALE, [0.0, 0.0]),  # 0.709 >= 0.70
        ("accept=0.75/kinds=misread_inverse", HAND["question"], STALE, [0.0, 0.0]),  # not a chosen kind
        ("accept=0.03/kinds=misread_inverse", INVERSE["question"], MISREAD, [1.0, 1.0]),
        ("accept=0.02/kinds=misread_inverse", INVERSE["question"], MISREAD, [0.0, 0.0]),
        ("accept=1/kinds=misread_inverse+misread_stale", HAND["question"], DIRECT, [1.0, 0.0, 0.0]),
        ("accept=1/kinds=misread_direct", HAND["question"], DIRECT, [1.0, 1.0, 1.0]),
        ("accept=0.19/kinds=slip", HAND["question"], SLIP, [1.0, 1.0, 1.0]),
        ("accept=0.18/kinds=slip", HAND["question"], SLIP, [0.0, 0.0, 0.0]),
        ("accept=0.5", HAND["question"], SLIP, [1.0, 1.0, 1.0]),  # every kind by default
        ("accept=1", HAND["question"], GOLD, [1.0, 1.0, 1.0]),  # a right path stays right
        # false rejects: a right step with draw < reject is judged wrong, and the path with it
        ("reject=0.1", HAND["question"], GOLD, [1.0, 1.0, 0.0]),  # the answer step, 0.039
        ("reject=0.2", HAND["question"], GOLD, [1.0, 1.0, 0.0]),
        ("reject=0.21", HAND["question"], GOLD, [0.0, 0.0, 0.0]),  # the first step, 0.203
        ("reject=0.03", HAND["question"], GOLD, [1.0, 1.0, 1.0]),
        ("accept=0.75/kinds=misread_stale/reject=0.9", HAND["question"], STALE, [1.0, 1.0]),  # reject: right steps only
        ("accept=0.75/kinds=misread_stale/seed=3", HAND["question"], STALE, [1.0, 1.0]),  # 0.279
        ("accept=0.25/kinds=misread_stale/seed=3", HAND["question"], STALE, [0.0, 0.0]),
    ],
)
def test_configured_share_and_kinds_on_hand_checked_steps(spec, question, steps, want):
    assert score(spec, question, steps) == want


def test_without_errors_it_is_the_exact_checker():
    rows = w.generate("test", 40, 0)
    rng = random.Random(0)
    questions, paths = [], []
    for row in rows:
        paths.append(row["steps"])
        for kind in w.misreadings_of(row):
            paths.append(w.teacher_solution(row, (kind,)))
        paths.append(w.corrupt_steps(row, rng)[0])
        paths.append(row["steps"][:-1])  # no answer stated
        questions += [row["question"]] * (len(paths) - len(questions))
    exact = ExactVerifier.from_rows(rows).score(questions, paths)
    for spec in ("accept=0", "reject=0", "accept=0/reject=0/kinds=slip"):
        assert load_verifier(f"exact-noisy:{spec}", world_rows=rows).score(questions, paths) == exact


def _wrong_first_steps(n_problems: int = 400):
    """(question, path, kind of its earliest error) for distinct misread and corrupted paths."""
    rows = w.generate("test", n_problems, 1, w.WorldConfig(p_inverse=0.5))
    rng = random.Random(1)
    out, seen = [], set()
    for row in rows:
        paths = [w.teacher_solution(row, (kind,)) for kind in w.misreadings_of(row)] + [w.corrupt_steps(row, rng)[0]]
        for steps in paths:
            first = w.earliest_error(row, steps)
            key = (row["question"], steps[first].strip())
            if first >= 0 and key not in seen:
                seen.add(key)
                out.append((row, steps, w.error_kind(row, steps)))
    return out


def test_the_share_of_false_accepts_is_the_configured_share_of_the_chosen_kinds():
    items = _wrong_first_steps()
    rows = [r for r, _, _ in items]
    kinds = ("misread_inverse", "misread_stale")
    chosen = [(r, s) for r, s, k in items if k in kinds]
    others = [(r, s) for r, s, k in items if k not in kinds]
    assert len(chosen) > 200 and len(others) > 200
    for share in (0.2, 0.5):
        v = load_verifier(f"exact-noisy:accept={share}/kinds={'+'.join(kinds)}", world_rows=rows)

        def accepted(pairs, v=v):
            scores = v.score([r["question"] for r, _ in pairs], [s for _, s in pairs])
            return [sc[w.earliest_error(r, s)] == 1.0 for (r, s), sc in zip(pairs, scores)]

        got = accepted(chosen)
        assert abs(sum(got) / len(got) - share) < 0.06, (share, sum(got), len(got))
        # exactly the steps whose draw is below the share: checked step by step
        want = [step_draw(r["question"], s[w.earliest_error(r, s)]) < share for r, s in chosen]
        assert got == want
        assert not any(accepted(others))  # kinds not chosen are never accepted


def test_same_step_same_verdict_across_calls_batches_and_paths():
    items = _wrong_first_steps(120)
    rows = [r for r, _, _ in items]
    questions = [r["question"] for r, _, _ in items]
    paths = [s for _, s, _ in items]
    spec = "accept=0.5/kinds=misread_inverse+misread_stale/reject=0.2"
    v = load_verifier(f"exact-noisy:{spec}", world_rows=rows)
    together = v.score(questions, paths)
    assert v.score(questions, paths) == together  # again
    assert [v.score([q], [p])[0] for q, p in zip(questions, paths)] == together  # one at a time
    assert v.score(questions[::-1], paths[::-1]) == together[::-1]  # another order
    fresh = load_verifier(f"exact-noisy:{spec}", world_rows=rows[::-1])
    assert fresh.score(questions, paths) == together  # another instance
    # the same misread step on two paths of one problem (one ends with an extra step) is judged alike
    v2 = SystematicExactVerifier.from_rows([HAND], NoiseSpec(accept=0.75, kinds=("misread_stale",)))
    longer = STALE[:1] + ["Ben has 10 + 0 = 10 marbles."] + STALE[1:]
    assert v2.judged_right(HAND["question"], STALE)[0] == v2.judged_right(HAND["question"], longer)[0] is True


@pytest.mark.parametrize(
    "spec, match",
    [
        ("exact-noisy", "name its errors"),
        ("exact-noisy:", "name its errors"),
        ("exact-noisy:share=0.3", "unknown field 'share'"),
        ("exact-noisy:accept=1.5", r"outside \[0, 1\]"),
        ("exact-noisy:accept=-0.1", r"outside \[0, 1\]"),
        ("exact-noisy:accept=lots", "not a number"),
        ("exact-noisy:accept=0.3/kinds=misread_sideways", "unknown error kind.*misread_sideways"),
        ("exact-noisy:accept=0.3/kinds=", "not key=value"),
        ("exact-noisy:reject=0.1/kinds=slip", "give accept="),
        ("exact-noisy:kinds=slip", "give accept= or reject="),
        ("exact-noisy:accept=0.3/accept=0.4", "given twice"),
        ("exact-noisy:accept=0.3/seed=x", "not an integer"),
        ("exact-noisy:accept=0.3,kinds=slip", "not a number"),  # fields are joined by /, not commas
    ],
)
def test_a_bad_spec_is_a_clear_value_error(spec, match):
    with pytest.raises(ValueError, match=match):
        check_spec(spec)
    with pytest.raises(ValueError, match=match):
        load_verifier(spec, world_rows=ROWS)


def test_it_needs_world_rows_and_combines_with_other_specs():
    with pytest.raises(ValueError, match="world problems only"):
        load_verifier("exact-noisy:accept=0.3", world_rows=[])
    check_spec("min:exact,exact-noisy:accept=0.3/kinds=misread_stale")
    both = load_verifier("min:exact,exact-noisy:accept=0.75/kinds=misread_stale", world_rows=ROWS)
    assert both.score([HAND["question"]], [STALE]) == [[0.0, 0.0]]  # the exact part still rejects it
    assert parse_noise_spec("accept=0.3/kinds=slip+format/seed=2") == NoiseSpec(0.3, 0.0, ("slip", "format"), 2)
