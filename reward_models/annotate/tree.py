"""`tree` (StepCo): a binary tree per question, grown one step at a time from the positive and the
exploratory prompt; a step's label is the fraction of correct leaves below it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from backends.base import Completion, Generator, SamplingParams
from reasoning.prompts import explore_prompt, solve_prompt
from reasoning.steps import CLOSE_TAG, answer_correct, has_answer, split_steps
from reasoning.types import Problem
from reward_models.annotate.base import AnnotateConfig, RunStats, derive_seed, make_row

STEP_STOP = (CLOSE_TAG,)


@dataclass
class TreeNode:
    """A node of StepCo's annotation tree: one step (None at the root) and its continuations."""

    step: str | None = None
    children: list[TreeNode] = field(default_factory=list)
    correct: bool = False
    """For a leaf: whether its answer is the gold one."""
    status: str = "open"
    """answer, capped, truncated or dead_end for a leaf; open while it may still grow."""


def _leaf_counts(node: TreeNode, memo: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """(leaves, correct leaves) of the subtree at `node`, the node itself counting when a leaf."""
    key = id(node)
    if key not in memo:
        if not node.children:
            memo[key] = (1, int(node.correct))
        else:
            counts = [_leaf_counts(child, memo) for child in node.children]
            memo[key] = (sum(c[0] for c in counts), sum(c[1] for c in counts))
    return memo[key]


def tree_paths(root: TreeNode) -> list[tuple[list[str], list[float], TreeNode]]:
    """Every root-to-leaf path as (steps, labels, leaf), depth first with children in order.

    A step's label is the fraction of correct leaves in its subtree. A root without children
    gives no path (the root is the question, not a step).
    """
    memo: dict[int, tuple[int, int]] = {}
    out: list[tuple[list[str], list[float], TreeNode]] = []
    stack: list[tuple[TreeNode, list[str], list[float]]] = [(child, [], [])
                                                             for child in reversed(root.children)]
    while stack:
        node, steps, labels = stack.pop()
        leaves, correct = _leaf_counts(node, memo)
        steps, labels = steps + [node.step or ""], labels + [correct / leaves]
        if not node.children:
            out.append((steps, labels, node))
        for child in reversed(node.children):
            stack.append((child, steps, labels))
    return out


def _first_step(completion: Completion) -> tuple[str | None, bool]:
    """(the step a one-step generation wrote or None, whether the token limit cut it)."""
    steps = split_steps(completion.text).steps
    truncated = completion.finish_reason == "length" and CLOSE_TAG not in completion.text
    return (steps[0] if steps else None), truncated


def grow_trees(generator: Generator, problems: Sequence[Problem], cfg: AnnotateConfig, group: int,
               stats: RunStats) -> list[TreeNode]:
    """StepCo's annotation trees of a group of problems, grown level by level."""
    roots = [TreeNode() for _ in problems]
    frontier: list[tuple[int, TreeNode, list[str]]] = [(i, root, []) for i, root in enumerate(roots)]
    depth = 0
    while frontier:
        depth += 1
        calls = []
        for kind, make_prompt, temperature in (("pos", solve_prompt, cfg.temperature_pos),
                                               ("neg", explore_prompt, cfg.temperature_neg)):
            params = SamplingParams(max_new_tokens=cfg.step_max_new_tokens, temperature=temperature, n=1,
                                    stop=STEP_STOP, seed=derive_seed(cfg.seed, "tree", group, depth, kind))
            prompts = [make_prompt(problems[i].question, prefix) for i, _, prefix in frontier]
            calls.append(stats.generate(generator, prompts, params))
        next_frontier = []
        for (i, node, prefix), (pos,), (neg,) in zip(frontier, *calls):
            seen: set[str] = set()
            for completion in (pos, neg):
                step, truncated = _first_step(completion)
                if step is None:
                    stats.count("step_empty")
                    continue
                if step in seen:
                    stats.count("duplicate_steps_merged")
                    continue
                seen.add(step)
                child = TreeNode(step)
                node.children.append(child)
                if has_answer(step):
                    child.status, child.correct = "answer", answer_correct(step, problems[i], cfg.answer_match)
                elif truncated:
                    child.status = "truncated"
                elif depth >= cfg.max_depth:
                    child.status = "capped"
                else:
                    next_frontier.append((i, child, prefix + [step]))
                if child.status != "open":
                    stats.count(f"leaf_{child.status}")
            if not node.children and node.step is not None:
                node.status = "dead_end"
                stats.count("leaf_dead_end")
        frontier = next_frontier
    return roots


def annotate_group(generator, problems, cfg, group, stats) -> dict[str, list[dict]]:
    out = {}
    for problem, root in zip(problems, grow_trees(generator, problems, cfg, group, stats)):
        paths = tree_paths(root)
        if not paths:
            stats.count("problem_no_paths")
        out[problem.id] = [make_row(problem, "tree", k, steps, labels, leaf.correct)
                           for k, (steps, labels, leaf) in enumerate(paths)]
    return out
