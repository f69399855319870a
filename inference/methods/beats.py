"""BEATS: a pruned tree search with three actions, back-verification, then a majority vote.

Sun et al. 2024, "BEATS: Optimizing LLM Mathematical Capabilities with BackVerify and Adaptive
Disambiguate based Efficient Tree Search". A node of the tree is a question (the original or a
clarified one) plus the steps written so far. Three actions grow it:

- **clarify** (the root only): `clarify_prompt` asks the model to restate the question without
  its irrelevant sentences (greedy, one line). The clarified question becomes a second top node at
  depth 1; everything below it is prompted with the clarified question. An empty, truncated,
  malformed (holding step or answer tags) or unchanged clarification adds no node (the original
  branch already covers it).
- **one step forward**: `solve_prompt(question, steps)` continued for exactly one step (stop at
  `</Step>`), sampled `branching` times at `temperature` so siblings differ; identical siblings
  are merged. A path takes at most `max_forward_steps` of these. A step that already states the
  answer (`<ans>`, `\\boxed`, "the answer is") ends its path: it is a final-answer leaf.
- **final answer**: `final_answer_prompt(question, steps)`, whose prompt ends with
  `<Step> The answer is <ans>`; the model completes the answer and closes the tags. The node it
  makes is a leaf, and its answer is read from the opened step plus the completion.

Pruning as in the paper: clarification at the root only, final-answer nodes are leaves, at most
`max_forward_steps` forward steps on a path, and no node deeper than `max_depth` (with the
defaults, clarify + 5 forward steps + the answer = 7). On top of that a `width` limit per problem
and level keeps the first children in sibling-rank order (every parent's first child before any
parent's second), so both the clarified and the original branch survive the cut.

The candidates are the final-answer leaves. Each distinct answer of a problem (by
`answer_key`, so "5" and "5.0" are one answer) is **back-verified** once by the LLM
(`verify_prompt` on the *original* question; the model re-solves and ends with "Verdict:
correct|incorrect") and the verdict is shared by every leaf with that answer; optionally, or
instead, every distinct candidate path is scored by the step verifier and passes when its
aggregated score reaches `verifier_threshold`. The prediction is the majority vote over the
verified leaves; when none passes, over all leaves (flag `no_verified_candidate`); with no leaf
at all the prediction is None (flag `no_candidates`). Gold answers are never read (the original
evaluation code looked at the gold answer before back-verifying; this one cannot).

Batching: the clarify actions of all problems are one generator call; after that every round
expands every frontier node of every problem in one call (forward and final-answer prompts share
their sampling parameters and the `</Step>` stop; round r expands the original branch's depth-r
nodes beside the clarified branch's depth-(r+1) nodes). Whatever the number of problems, a search
costs one clarify call, at most `max_depth` round calls (6 with the defaults), one call for
back-verification and at most one verifier call. Final answers are therefore sampled at
`temperature` like the forward steps; set it to 0 (and the branching becomes 1) for a greedy tree.

Anomalies are flagged once per occurrence (`Counter(output.flags)` counts them): `truncated`,
`empty_output`, `unclosed_tags`, `no_tags`, `no_answer` (a final-answer action without an
answer), `no_verdict`, `clarify_empty`, `clarify_truncated`, `clarify_malformed`, `verifier_refused`,
`no_verified_candidate`, `no_candidates`. None of them stops the search.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from backends.base import Completion, SamplingParams
from inference.methods.base import MethodOutput, NoVerifierError, Tracker, answer_key, check_sampling_fields
from reasoning.answers import extract_answer
from reasoning.prompts import (
    ANS_CLOSE,
    ANS_OPEN,
    STEP_CLOSE,
    STEP_OPEN,
    VERDICT_CORRECT,
    VERDICT_INCORRECT,
    clarify_prompt,
    final_answer_prompt,
    parse_verdict,
    solve_prompt,
    verify_prompt,
)
from reasoning.steps import prefix_text, split_steps
from reasoning.types import Problem
from reward_models.verifier import AGGREGATIONS, aggregate

logger = logging.getLogger(__name__)

FINAL_OPENING = f"{STEP_OPEN} The answer is {ANS_OPEN}"
"""The text `final_answer_prompt` ends with; the completion continues it."""

_TAG_RE = re.compile(r"</?(?:Step|ans)>", re.IGNORECASE)
_STATES_ANSWER_RE = re.compile(r"<ans>|\\boxed|\bthe (?:final )?answer is\b", re.IGNORECASE)


@dataclass
class Config:
    max_new_tokens: int = 96
    """Most tokens generated for one forward step or one final answer."""
    seed: int = 0
    """Sampling seed; round r of the tree search passes seed + r to the generator."""
    max_depth: int = 7
    """Deepest node of the tree; the root is depth 0 and every action (clarify, forward step,
    final answer) adds one."""
    max_forward_steps: int = 5
    """Most one-step-forward actions on one path."""
    branching: int = 2
    """Samples of the one-step-forward action per node (identical ones are merged); 1 when
    `temperature` is 0, since greedy samples would all be the same."""
    temperature: float = 0.7
    """Sampling temperature of the tree's actions (forward steps and final answers)."""
    top_p: float = 1.0
    """Nucleus sampling mass of the tree's actions."""
    width: int = 8
    """Most non-leaf nodes kept per problem and level (first children of every parent first);
    0 keeps them all."""
    clarify: bool = True
    """Take the clarify-question action at the root (False: the ablation without it)."""
    clarify_max_new_tokens: int = 256
    """Most tokens of the clarified question (generated greedily, up to a newline)."""
    answer_at_every_node: bool = True
    """Take the final-answer action at every node, as BEATS does; False: only where no further
    forward step is allowed."""
    answer_in_step_is_leaf: bool = True
    """A forward step that states the answer ends its path as a candidate; False prunes it."""
    llm_backverify: bool = True
    """Back-verify each distinct answer with the LLM (`verify_prompt`, greedy)."""
    verify_max_new_tokens: int = 256
    """Most tokens of one back-verification (the model re-solves before its verdict)."""
    verifier_backverify: bool = False
    """Also (or, with llm_backverify False, instead) require the step verifier's aggregated score
    of a candidate path to reach `verifier_threshold`. Needs a verifier."""
    verifier_threshold: float = 0.5
    """Lowest aggregated verifier score that counts as verified."""
    verifier_aggregate: str = "min"
    """How step scores become one path score: mean, min, prod or last."""

    def __post_init__(self) -> None:
        check_sampling_fields(self)
        for name in ("max_new_tokens", "clarify_max_new_tokens", "verify_max_new_tokens", "max_depth", "branching"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_forward_steps", "width"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.verifier_aggregate not in AGGREGATIONS:
            raise ValueError(f"verifier_aggregate must be one of {', '.join(AGGREGATIONS)}; "
                             f"got {self.verifier_aggregate!r}")
        SamplingParams(temperature=self.temperature, top_p=self.top_p)  # validates both


@dataclass
class _Node:
    problem: int
    """Index of the problem in the batch."""
    question: str
    """The question the node's prompts use: the original or the clarified one."""
    clarified: bool
    steps: list[str]
    depth: int
    forward_steps: int


@dataclass
class _Candidate:
    """A final-answer leaf."""

    answer: str
    key: str
    steps: list[str]
    """The whole path, the answer step included."""
    text: str
    """The path as the model wrote it (the prediction's completion)."""
    depth: int
    forward_steps: int
    clarified: bool
    action: str
    """'final_answer', or 'answer_in_step' for a forward step that stated the answer."""
    llm_verdict: bool | None = None
    verifier_score: float | None = None
    verified: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "answer": self.answer, "key": self.key, "steps": self.steps, "depth": self.depth,
            "forward_steps": self.forward_steps, "clarified": self.clarified, "action": self.action,
            "llm_verdict": self.llm_verdict, "verifier_score": self.verifier_score, "verified": self.verified,
        }


@dataclass
class _State:
    """Everything one problem's search records."""

    flags: list[str] = field(default_factory=list)
    clarify: str = "off"
    """off, clarified, unchanged, empty, truncated or malformed."""
    clarified_question: str | None = None
    nodes: int = 1  # the root
    nodes_expanded: int = 0
    generations: int = 0
    rounds: int = 0
    duplicates: int = 0
    pruned_width: int = 0
    pruned_answer_in_step: int = 0
    seen: set[tuple] = field(default_factory=set)
    candidates: list[_Candidate] = field(default_factory=list)
    verifications: list[dict[str, Any]] = field(default_factory=list)


def run(problems: list[Problem], tracker: Tracker, config: Config) -> list[MethodOutput]:
    if config.verifier_backverify and tracker.verifier is None:
        raise NoVerifierError("verifier_backverify needs a verifier; pass --verifier or set verifier_backverify false")
    if not problems:
        return []
    states = [_State() for _ in problems]
    frontier = [_Node(i, p.question, False, [], 0, 0) for i, p in enumerate(problems)]
    for node, state in zip(frontier, states):
        state.seen.add(_node_key(node))
    if config.clarify and config.max_depth >= 2:
        frontier += _clarify(problems, tracker, config, states)
    round_index = 0
    while frontier:
        logger.info("BEATS round %d: %d frontier nodes", round_index, len(frontier))
        frontier = _expand(frontier, problems, tracker, config, states, round_index)
        round_index += 1
    _back_verify(problems, tracker, config, states)
    return [_decide(problem, state, tracker, config, i) for i, (problem, state) in enumerate(zip(problems, states))]


# ----------------------------------------------------------------------------------------------
# the tree


def _node_key(node: _Node) -> tuple:
    return (node.question, tuple(node.steps))


def _can_forward(node: _Node, config: Config) -> bool:
    # a forward step must leave room below it for the final answer
    return node.forward_steps < config.max_forward_steps and node.depth + 2 <= config.max_depth


def _can_answer(node: _Node, config: Config) -> bool:
    if node.depth + 1 > config.max_depth:
        return False
    return config.answer_at_every_node or not _can_forward(node, config)


def _clarify(problems: list[Problem], tracker: Tracker, config: Config, states: list[_State]) -> list[_Node]:
    """The root's clarify action for every problem in one greedy call; the new depth-1 nodes."""
    params = SamplingParams(max_new_tokens=config.clarify_max_new_tokens, temperature=0.0, n=1,
                            stop=("\n",), seed=config.seed)
    outputs = tracker.generate(list(range(len(problems))), [clarify_prompt(p.question) for p in problems], params)
    nodes = []
    for i, (problem, (completion,)) in enumerate(zip(problems, outputs)):
        state = states[i]
        state.generations += 1
        text = completion.text.split("\n", 1)[0].strip()
        if completion.finish_reason == "length" and "\n" not in completion.text:
            state.clarify = "truncated"
            state.flags += ["truncated", "clarify_truncated"]
        elif not text:
            state.clarify = "empty"
            state.flags.append("clarify_empty")
        elif _TAG_RE.search(text):
            # a solution, not a question: the model did not follow the clarify format
            state.clarify = "malformed"
            state.clarified_question = text
            state.flags.append("clarify_malformed")
        elif " ".join(text.split()) == " ".join(problem.question.split()):
            state.clarify = "unchanged"
            state.clarified_question = text
        else:
            state.clarify = "clarified"
            state.clarified_question = text
            node = _Node(i, text, True, [], 1, 0)
            state.seen.add(_node_key(node))
            state.nodes += 1
            nodes.append(node)
    return nodes


def _expand(frontier: list[_Node], problems: list[Problem], tracker: Tracker, config: Config,
            states: list[_State], round_index: int) -> list[_Node]:
    """One round: every frontier node's actions for every problem in one generator call.

    Returns the next frontier (the new non-leaf nodes, merged and cut to `width`); leaves are
    recorded as candidates."""
    requests = _requests(frontier, config, states)
    if not requests:
        return []
    for p in {node.problem for _, node, _ in requests}:
        states[p].rounds += 1
    prompts = [solve_prompt(n.question, n.steps) if a == "forward" else final_answer_prompt(n.question, n.steps)
               for _, n, a in requests]
    params = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                            top_p=config.top_p, n=1, stop=(STEP_CLOSE,), seed=config.seed + round_index)
    outputs = tracker.generate([n.problem for _, n, _ in requests], prompts, params)

    children: dict[int, list[tuple[int, int, _Node]]] = {}  # problem -> (sibling rank, parent position, node)
    rank: Counter[int] = Counter()  # per parent (by id) forward children kept so far
    for (pos, node, action), (completion,) in zip(requests, outputs):
        state = states[node.problem]
        state.generations += 1
        kind = problems[node.problem].answer_kind
        if action == "final":
            candidate = _final_answer(node, completion, kind, state)
            if candidate is not None:
                state.candidates.append(candidate)
                state.nodes += 1
            continue
        child = _forward(node, completion, kind, state, config)
        if child is None:
            continue
        key = _node_key(child) if isinstance(child, _Node) else (node.question, tuple(child.steps))
        if key in state.seen:
            state.duplicates += 1
            continue
        state.seen.add(key)
        state.nodes += 1
        if isinstance(child, _Candidate):
            state.candidates.append(child)
            continue
        children.setdefault(node.problem, []).append((rank[id(node)], pos, child))
        rank[id(node)] += 1

    return _next_frontier(children, config, states)


def _requests(frontier: list[_Node], config: Config, states: list[_State]) -> list[tuple[int, _Node, str]]:
    """The generations a round asks for: (position of the parent among its problem's frontier, node,
    action), `branching` forward steps where a node may go on and a final answer where it may stop."""
    branching = config.branching if config.temperature > 0 else 1
    requests: list[tuple[int, _Node, str]] = []
    position: Counter[int] = Counter()
    for node in frontier:
        pos = position[node.problem]
        position[node.problem] += 1
        actions = []
        if _can_forward(node, config):
            actions += ["forward"] * branching
        if _can_answer(node, config):
            actions.append("final")
        if actions:
            states[node.problem].nodes_expanded += 1
        requests += [(pos, node, a) for a in actions]
    return requests


def _next_frontier(children: dict[int, list[tuple[int, int, _Node]]], config: Config,
                   states: list[_State]) -> list[_Node]:
    """Each problem's new nodes in sibling-rank then parent order, cut to `width` (the cut counted)."""
    next_frontier = []
    for p in sorted(children):
        ordered = [c for _, _, c in sorted(children[p], key=lambda t: (t[0], t[1]))]
        if config.width and len(ordered) > config.width:
            states[p].pruned_width += len(ordered) - config.width
            ordered = ordered[: config.width]
        next_frontier += ordered
    return next_frontier


def _forward(node: _Node, completion: Completion, kind: str, state: _State,
             config: Config) -> _Node | _Candidate | None:
    """The child one forward step makes: a node, a leaf when the step states the answer, or
    None for an unusable generation (flagged)."""
    if completion.finish_reason == "length":
        state.flags.append("truncated")  # an unfinished step: this sample is dropped
        return None
    path = split_steps(completion.text)
    if not path.steps:
        state.flags.append("empty_output")
        return None
    if path.segmentation == "unclosed_tags":
        state.flags.append("unclosed_tags")
    elif path.segmentation != "tags":
        state.flags.append("no_tags")
    # Stopping at </Step> leaves one step; a stray extra <Step> or untagged lines are one step too.
    step = "\n".join(path.steps) if path.segmentation in ("blank_lines", "lines") else " ".join(path.steps)
    steps = node.steps + [step]
    if _STATES_ANSWER_RE.search(step):
        if not config.answer_in_step_is_leaf:
            state.pruned_answer_in_step += 1
            return None
        answer = extract_answer(step, kind)
        key = answer_key(answer, kind)
        if key is None:
            state.flags.append("no_answer")
            return None
        return _Candidate(answer=answer, key=key, steps=steps, text=prefix_text(node.steps) + completion.text,
                          depth=node.depth + 1, forward_steps=node.forward_steps + 1, clarified=node.clarified,
                          action="answer_in_step")
    return _Node(node.problem, node.question, node.clarified, steps, node.depth + 1, node.forward_steps + 1)


def _final_answer(node: _Node, completion: Completion, kind: str, state: _State) -> _Candidate | None:
    """The leaf a final-answer action makes, or None (flagged) when it gives no usable answer."""
    text = completion.text
    if not text.strip():
        state.flags.append("empty_output")
        return None
    truncated = completion.finish_reason == "length"
    if truncated:
        state.flags.append("truncated")
        if ANS_CLOSE not in text:  # the answer itself may be cut short
            return None
    elif ANS_CLOSE not in text or STEP_CLOSE not in text:
        state.flags.append("unclosed_tags")
    step_text = FINAL_OPENING + text
    path = split_steps(step_text)
    answer = extract_answer(step_text, kind)
    key = answer_key(answer, kind)
    if key is None or not path.steps:
        state.flags.append("no_answer")
        return None
    return _Candidate(answer=answer.strip(), key=key, steps=node.steps + [" ".join(path.steps)],
                      text=prefix_text(node.steps) + step_text, depth=node.depth + 1,
                      forward_steps=node.forward_steps, clarified=node.clarified, action="final_answer")


# ----------------------------------------------------------------------------------------------
# back-verification and the vote


def _back_verify(problems: list[Problem], tracker: Tracker, config: Config, states: list[_State]) -> None:
    """Set every candidate's verdicts: one LLM verification per distinct answer of a problem (one
    call for all problems), one verifier score per distinct path (one call)."""
    if config.llm_backverify:
        _llm_verdicts(problems, tracker, config, states)
    if config.verifier_backverify:
        _verifier_scores(problems, tracker, config, states)
    for state in states:
        for c in state.candidates:
            ok = True
            if config.llm_backverify:
                ok = ok and c.llm_verdict is True
            if config.verifier_backverify:
                ok = ok and c.verifier_score is not None and c.verifier_score >= config.verifier_threshold
            c.verified = ok


def _llm_verdicts(problems: list[Problem], tracker: Tracker, config: Config, states: list[_State]) -> None:
    """The policy's verdict on each distinct answer of each problem (as first written), in one call;
    an unreadable verdict is None and flagged."""
    requests: list[tuple[int, str, str]] = []  # (problem, answer key, answer as first written)
    for i, state in enumerate(states):
        firsts: dict[str, str] = {}
        for c in state.candidates:
            firsts.setdefault(c.key, c.answer)
        requests += [(i, key, answer) for key, answer in firsts.items()]
    params = SamplingParams(max_new_tokens=config.verify_max_new_tokens, temperature=0.0, n=1,
                            stop=(VERDICT_CORRECT, VERDICT_INCORRECT), seed=config.seed)
    outputs = tracker.generate([i for i, _, _ in requests],
                               [verify_prompt(problems[i].question, answer) for i, _, answer in requests], params)
    verdicts: dict[tuple[int, str], bool | None] = {}
    for (i, key, answer), (completion,) in zip(requests, outputs):
        state = states[i]
        state.generations += 1
        verdict = parse_verdict(completion.text)
        if verdict is None:
            state.flags.append("no_verdict")
            if completion.finish_reason == "length":
                state.flags.append("truncated")
        verdicts[(i, key)] = verdict
        state.verifications.append({"answer": answer, "key": key, "verdict": verdict,
                                    "finish_reason": completion.finish_reason})
    for i, state in enumerate(states):
        for c in state.candidates:
            c.llm_verdict = verdicts[(i, c.key)]


def _verifier_scores(problems: list[Problem], tracker: Tracker, config: Config, states: list[_State]) -> None:
    """The verifier's aggregated score of each distinct candidate path, in one call; a path it
    refuses keeps no score and is flagged."""
    distinct: dict[tuple[int, tuple[str, ...]], int] = {}
    owners, questions, paths = [], [], []
    for i, state in enumerate(states):
        for c in state.candidates:
            k = (i, tuple(c.steps))
            if k not in distinct:
                distinct[k] = len(paths)
                owners.append(i)
                questions.append(problems[i].question)
                paths.append(c.steps)
    scores = tracker.score_paths(owners, questions, paths) if paths else []
    for i, state in enumerate(states):
        for c in state.candidates:
            s = scores[distinct[(i, tuple(c.steps))]]
            if s is None or not s:
                state.flags.append("verifier_refused")
            else:
                c.verifier_score = aggregate(s, config.verifier_aggregate)


def _decide(problem: Problem, state: _State, tracker: Tracker, config: Config, index: int) -> MethodOutput:
    checked = config.llm_backverify or config.verifier_backverify
    candidates = state.candidates
    verified = [c for c in candidates if c.verified]
    if not checked:
        pool, pool_name = candidates, "all (no back-verification)"
    elif verified:
        pool, pool_name = verified, "verified"
    else:
        pool, pool_name = candidates, "all (none verified)"
        if candidates:
            state.flags.append("no_verified_candidate")
    votes: dict[str, int] = {}
    first: dict[str, _Candidate] = {}
    for c in pool:
        votes[c.key] = votes.get(c.key, 0) + 1
        first.setdefault(c.key, c)
    chosen = None
    if votes:
        order = list(first)
        chosen = first[max(votes, key=lambda k: (votes[k], -order.index(k)))]
    else:
        state.flags.append("no_candidates")
    trace = {
        "clarify": state.clarify,
        "clarified_question": state.clarified_question,
        "nodes": state.nodes,
        "nodes_expanded": state.nodes_expanded,
        "generations": state.generations,
        "rounds": state.rounds,
        "duplicates_merged": state.duplicates,
        "pruned_width": state.pruned_width,
        "pruned_answer_in_step": state.pruned_answer_in_step,
        "candidates": [c.to_dict() for c in candidates],
        "verifications": state.verifications,
        "vote_pool": pool_name,
        "fallback": bool(checked and candidates and not verified),
        "votes": {first[k].answer: v for k, v in votes.items()},
        "vote_keys": votes,
        "anomalies": dict(Counter(state.flags)),
    }
    return MethodOutput(
        prediction=chosen.answer if chosen else None,
        completion=chosen.text if chosen else "",
        usage=tracker.usage[index],
        trace=trace,
        flags=list(state.flags),
    )
