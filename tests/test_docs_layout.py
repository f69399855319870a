"""The README stays a ten-minute read, its Quick start keeps its two commands, every relative link of
README.md and docs/**/*.md points at a file, and every figure under docs/ is shown on some page."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 400
QUICK_START = ("bash scripts/setup_env.sh && .venv/bin/steprl-ppo", "bash scripts/test.sh")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def pages() -> list[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def _without_code(text: str) -> str:
    """The page with fenced blocks and inline code blanked, so a bracket in code is not a link."""
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"`[^`\n]*`", "``", text)


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """`page:line: target` for each relative link of the page whose file does not exist."""
    broken = []
    for number, line in enumerate(_without_code(page.read_text()).splitlines(), 1):
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL, a mail address or an anchor of the same page
            path = unquote(target.split("#", 1)[0])
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(root)}:{number}: {target}")
    return broken


def test_readme_is_at_most_400_lines():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, (f"README.md has {lines} lines, more than {README_MAX_LINES}: move figures "
                                       f"to docs/results/ and details to docs/")


def test_quick_start_keeps_its_two_commands():
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    for command in QUICK_START:
        assert f"\n{command}\n" in quick, f"the Quick start lost `{command}`"


QUICK_START_BUILDS = ("outputs/sft_tiny",)
"""What command 1 of the Quick start leaves on disk that an evaluation can name (its policy)."""


@pytest.mark.parametrize("page", ["README.md", "docs/inference.md"])
def test_the_headline_evaluation_runs_on_what_the_quick_start_builds(page):
    """The first `inference.evaluate` command of the page names only folders the Quick start builds
    (a later, optional policy or PSV comes with the commands that build it)."""
    text = (ROOT / page).read_text()
    start = text.index("```bash\npython -m inference.evaluate")
    command = text[start: text.index("```", start + 3)]
    folders = set(re.findall(r"outputs/[\w.-]+", command))
    assert folders and folders <= set(QUICK_START_BUILDS), f"{page}: the headline command names {sorted(folders)}"
    for later in re.findall(r"outputs/[\w.-]+", text):
        if later not in QUICK_START_BUILDS and page == "docs/inference.md":
            assert f"--output_dir {later}" in text, f"{page} names {later} without the command that builds it"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_a_file(page):
    assert not broken_links(page), "links to files that do not exist:\n" + "\n".join(broken_links(page))


def test_every_results_page_is_in_the_index_and_every_figure_is_shown():
    index = (ROOT / "docs" / "results" / "README.md").read_text()
    for page in sorted((ROOT / "docs" / "results").glob("*.md")):
        if page.name != "README.md":
            assert f"]({page.name})" in index, f"docs/results/README.md does not list {page.name}"
    shown = {(page.parent / unquote(t)).resolve() for page in pages()
             for t in LINK.findall(_without_code(page.read_text()))}
    for figure in sorted((ROOT / "docs").rglob("*.png")):
        assert figure.resolve() in shown, f"{figure.relative_to(ROOT)} is shown on no page"


def test_the_link_checker_finds_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("x")
    page.write_text("[ok](there.md) [ok too](there.md#part) [web](https://example.org/x.md) [anchor](#a)\n"
                    "`[not a link](nowhere.md)`\n![gone](results/gone.png) and [gone too](../nowhere.md)\n")
    found = [entry.split(": ", 1)[1] for entry in broken_links(page, tmp_path)]
    assert found == ["results/gone.png", "../nowhere.md"]

