"""Prompts through a chat template: where the user's turn ends, what the assistant's reply starts
with, and that a tokenizer without a template (the tiny world policies) sees the plain prompts."""

import pytest

from reasoning.prompts import (
    chat_prompt,
    chat_turns,
    clarify_prompt,
    explore_prompt,
    final_answer_prompt,
    format_prompts,
    revise_prompt,
    solve_prompt,
    verify_prompt,
)

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


class FakeTokenizer:
    """Only what `chat_prompt` uses: a chat template and `apply_chat_template`."""

    def __init__(self, chat_template=TEMPLATE):
        self.chat_template = chat_template

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        import jinja2

        assert tokenize is False
        template = jinja2.Template(self.chat_template)
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt)


@pytest.mark.parametrize("prompt, user, reply", [
    (solve_prompt("Q?"), "Question: Q?\nAnswer:", ""),
    (solve_prompt("Q?", ["a", "b Answer:"]), "Question: Q?\nAnswer:", "<Step> a</Step>\n<Step> b Answer:</Step>\n"),
    (explore_prompt("Q?", ["x"]), "Question: Q?\nAnswer (exploratory, may contain mistakes):", "<Step> x</Step>\n"),
    (final_answer_prompt("Q?", ["a"]), "Question: Q?\nAnswer:", "<Step> a</Step>\n<Step> The answer is <ans>"),
    (clarify_prompt("Q?"), clarify_prompt("Q?"), ""),
    (verify_prompt("Q?", "5"), verify_prompt("Q?", "5").strip(), ""),
    ("no header at all", "no header at all", ""),
])
def test_chat_turns_split_instruction_from_the_reply_so_far(prompt, user, reply):
    assert chat_turns(prompt) == (user, reply)
    assert prompt.startswith(user) and prompt.endswith(reply)  # nothing lost or moved, only split


def test_revision_keeps_the_rejected_path_in_the_user_turn_and_continues_the_kept_steps():
    prompt = revise_prompt("Q?", ["a", "b", "c"], 3, 0.2)
    user, reply = chat_turns(prompt)
    assert user.endswith("Revised answer:") and "<Step> c</Step>" in user and "Feedback:" in user
    assert reply == "<Step> a</Step>\n<Step> b</Step>\n"


def test_chat_prompt_and_format_prompts():
    tok = FakeTokenizer()
    text = chat_prompt(tok, solve_prompt("Q?", ["a"]))
    assert text == "<|user|>Question: Q?\nAnswer:<|end|>\n<|assistant|><Step> a</Step>\n"
    prompts = [solve_prompt("Q?"), solve_prompt("R?")]
    assert format_prompts(tok, prompts) == [chat_prompt(tok, p) for p in prompts]
    assert format_prompts(tok, prompts, chat_template=False) == prompts
    assert format_prompts(FakeTokenizer(None), prompts) == prompts  # no template: plain prompts
