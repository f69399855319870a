"""Prompt templates: one place for every format a policy is trained on and prompted with.

Plain-text templates so that tiny models trained from scratch and base models share them; the
completions use StepCo's `<Step>...</Step>` tags and `<ans>...</ans>` answers. A model with a chat
template (an instruct model) gets the same prompt as one conversation turn: `chat_prompt` puts the
instruction in the user's message and whatever the prompt already wrote of the reply (the kept
steps a generation continues) at the start of the assistant's.
"""

from __future__ import annotations

from typing import Any

from reasoning.steps import join_steps, prefix_text

STEP_OPEN, STEP_CLOSE = "<Step>", "</Step>"
ANS_OPEN, ANS_CLOSE = "<ans>", "</ans>"
VERDICT_CORRECT, VERDICT_INCORRECT = "Verdict: correct", "Verdict: incorrect"

# The line each template ends its instruction with; what follows it is the start of the reply.
REPLY_HEADERS = ("Answer:\n", "Answer (exploratory, may contain mistakes):\n", "Revised answer:\n",
                 "Clarified question:", "Check the proposed answer.\n")


def solve_prompt(question: str, prefix_steps: list[str] | None = None) -> str:
    """Chain of thought with step tags (StepCo's positive style, D+); continues `prefix_steps` if given."""
    return f"Question: {question.strip()}\nAnswer:\n" + prefix_text(prefix_steps or [])


def explore_prompt(question: str, prefix_steps: list[str] | None = None) -> str:
    """StepCo's exploratory style (D-): steps that may be wrong, used to grow the annotation tree."""
    return f"Question: {question.strip()}\nAnswer (exploratory, may contain mistakes):\n" + prefix_text(
        prefix_steps or []
    )


def final_answer_prompt(question: str, prefix_steps: list[str]) -> str:
    """BEATS' final-answer action: the path so far, then the answer step is opened for the model."""
    return solve_prompt(question, prefix_steps) + f"{STEP_OPEN} The answer is {ANS_OPEN}"


def feedback_text(step_index: int, probability: float) -> str:
    """StepCo's verifier feedback for the first rejected step (1-based `step_index`)."""
    keep = f"steps 1 to {step_index - 1}" if step_index > 1 else "no steps"
    return (
        f"The probability that step {step_index} leads to the correct answer is {probability:.2f}. "
        f"Revise steps {step_index} onward while keeping {keep}."
    )


def revise_prompt(question: str, steps: list[str], step_index: int, probability: float) -> str:
    """StepCo's revision prompt: the path, the feedback, then the kept steps 1..k-1 to continue from."""
    if not 1 <= step_index <= max(len(steps), 1):
        raise ValueError(f"step_index must be in [1, {len(steps)}], got {step_index}")
    return (
        f"Question: {question.strip()}\nAnswer:\n{join_steps(steps)}\n"
        f"Feedback: {feedback_text(step_index, probability)}\nRevised answer:\n"
        + prefix_text(steps[: step_index - 1])
    )


def clarify_prompt(question: str) -> str:
    """BEATS' clarify-question action (root only): restate the question without irrelevant sentences."""
    return f"Question: {question.strip()}\nRewrite the question without irrelevant sentences.\nClarified question:"


def verify_prompt(question: str, answer: str) -> str:
    """BEATS' back-verification: is `answer` correct for `question`? The model ends with a verdict."""
    return f"Question: {question.strip()}\nProposed answer: {answer.strip()}\nCheck the proposed answer.\n"


def parse_verdict(text: str) -> bool | None:
    """True / False from a back-verification completion, None when it gives no verdict."""
    if VERDICT_INCORRECT in text:
        return False
    if VERDICT_CORRECT in text:
        return True
    return None


def chat_turns(prompt: str) -> tuple[str, str]:
    """(the user's message, the start of the assistant's reply) of a prompt built by this module.

    The user's turn ends with the last reply header (`REPLY_HEADERS`) followed by the prompt's end
    or a `<Step>`; the tagged steps after it start the reply. A prompt without one is all user
    message.
    """
    cut = None
    for header in REPLY_HEADERS:
        start = prompt.find(header)
        while start >= 0:
            end = start + len(header)
            rest = prompt[end:]
            if (not rest or rest.startswith(STEP_OPEN)) and (cut is None or end > cut):
                cut = end
            start = prompt.find(header, start + 1)
    if cut is None:
        return prompt.strip(), ""
    return prompt[:cut].strip(), prompt[cut:]


def chat_prompt(tokenizer: Any, prompt: str) -> str:
    """`prompt` through `tokenizer`'s chat template: the instruction as the user's message, then the
    assistant's turn opened and continued with the steps the prompt already holds (as text, special
    tokens written out, to be tokenized without adding any)."""
    user, reply = chat_turns(prompt)
    opened = tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                           add_generation_prompt=True)
    return opened + reply


def has_chat_template(tokenizer: Any) -> bool:
    """Whether `tokenizer` carries a chat template (an instruct model's tokenizer does)."""
    return bool(getattr(tokenizer, "chat_template", None))


def format_prompts(tokenizer: Any, prompts: list[str], chat_template: bool = True) -> list[str]:
    """The prompts as the model reads them: through its chat template when it has one and
    `chat_template` is on, else unchanged (the plain templates)."""
    if not (chat_template and has_chat_template(tokenizer)):
        return list(prompts)
    return [chat_prompt(tokenizer, p) for p in prompts]
