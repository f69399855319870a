"""Every toolkit command quoted in README.md and docs/**/*.md still parses.

A quoted command is a line of a fenced bash block, or an inline code span of the prose, that invokes
the toolkit: `python -m X`, `python scripts/X.py` (or `rl/ppo_step.py`), `accelerate launch S.py`,
a `steprl-*` console script or `bash scripts/X.sh`. For each, the module or script must exist and
every `--flag` it uses must be one its parser offers. Nothing is run but `--help`, once per entry
point, all in one Python process (the imports are paid once); outputs a command names need not
exist. A bash script's flags are looked up in its own source. Lines the checker cannot read (loops,
command substitution) are counted as skipped, and kept few.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYTHONS = {"python", "python3", ".venv/bin/python"}
ACCELERATES = {"accelerate", ".venv/bin/accelerate"}
EXTERNAL_MODULES = {"pytest", "mypy"}  # not the toolkit's: only the paths it is given are checked
SHELL_WORDS = {"for", "while", "do", "done", "if", "then", "fi", "case", "esac"}
FLAG = re.compile(r"--[A-Za-z][A-Za-z0-9_-]*")


def doc_files() -> list[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def console_scripts() -> dict[str, str]:
    """pyproject.toml's [project.scripts], name to module (read by hand: tomllib needs Python 3.11)."""
    section = (ROOT / "pyproject.toml").read_text().split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^([\w-]+)\s*=\s*"([\w.]+):\w+"', section, re.M))


# ---- finding the commands ---------------------------------------------------------------------

def _fenced_lines(text: str) -> list[tuple[int, str]]:
    """(line number, command) for each command of the bash/sh fenced blocks, continuations joined,
    comments dropped."""
    out, in_block, shell, pending, start = [], False, False, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            if in_block:
                in_block = False
            else:
                in_block, shell = True, stripped[3:].strip() in ("bash", "sh", "shell", "console")
            pending = ""
            continue
        if not (in_block and shell):
            continue
        if not pending:
            start = number
        if stripped.startswith("#") and not pending:
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        command, pending = (pending + stripped).strip(), ""
        if command:
            out.append((start, command))
    return out


def _prose_spans(text: str) -> list[tuple[int, str]]:
    """(line number, span) for each inline code span of the prose (outside fenced blocks), a span
    broken over lines read as one line."""
    prose, in_block = [], False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            in_block = not in_block
            prose.append("")
            continue
        prose.append("" if in_block else line)
    joined = "\n".join(prose)
    return [(joined.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split()))
            for m in re.finditer(r"`([^`]+)`", joined)]


@dataclass
class Invocation:
    where: str
    kind: str  # module, script, shell, external
    target: str  # module name or repository path
    flags: list[str]
    paths: list[str]  # repository paths it is given that must exist (configs/, tests/)
    method: str | None = None  # inference.evaluate's --method: its options depend on it
    launcher_flags: list[str] = field(default_factory=list)  # accelerate launch's own

    @property
    def help_key(self) -> str:
        return f"{self.kind}:{self.target}" + (f"::{self.method}" if self.method else "")


def _strip(token: str) -> str:
    return token.strip("[]()")


def _flags_and_paths(tokens: list[str]) -> tuple[list[str], list[str]]:
    flags, paths = [], []
    for raw in tokens:
        token = _strip(raw)
        match = FLAG.fullmatch(token.split("=", 1)[0])
        if match:
            flags.append(match.group(0))
        elif re.match(r"(configs|tests)/", token) and not re.search(r"[*{}$<>]", token):
            paths.append(token)
    return flags, paths


def _words(command: str) -> list[str] | None:
    """The command's words up to its end (`&&`, `;`, `>`, a pipe outside brackets), None where the
    line is shell the checker does not read."""
    if "$(" in command or re.search(r"(^|\s)(for|while|if)\s", command):
        return None
    try:
        tokens = shlex.split(command, comments=True)
    except ValueError:
        return None
    words, depth = [], 0
    for token in tokens:
        depth += token.count("[") - token.count("]")
        if token in ("&&", ";", "||") or token.startswith(">") or token.startswith("2>"):
            words.append("&&")
            continue
        if token == "|":
            if depth <= 0:
                words.append("&&")
            continue  # `[--a X | --b Y]`: alternatives of a usage line
        words.append(token)
    return words


def _module_invocation(where: str, module: str, args: list[str]) -> Invocation:
    """`python -m MODULE ARGS`: the toolkit's module or an external one, and for inference.evaluate
    the method it names when that method's file is here."""
    kind = "external" if module.split(".")[0] in EXTERNAL_MODULES else "module"
    flags, paths = _flags_and_paths(args)
    method = None
    if module == "inference.evaluate" and "--method" in args:
        value = args[args.index("--method") + 1] if args.index("--method") + 1 < len(args) else ""
        # a method by name (inference/methods/NAME.py) or by module path (a lab method, PKG.MOD)
        home = ROOT / Path(*value.split(".")) if "." in value else ROOT / "inference" / "methods" / value
        if home.with_suffix(".py").is_file():
            method = value
    return Invocation(where, kind, module, flags, paths, method)


def parse_invocations(command: str, where: str) -> list[Invocation] | None:
    """The toolkit invocations in one command line ([] when it invokes none), None when unreadable."""
    words = _words(command)
    if words is None:
        return None
    groups, current = [], []
    for word in words:
        if word == "&&":
            groups.append(current)
            current = []
        else:
            current.append(word)
    groups.append(current)
    found = []
    for group in groups:
        while group and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", group[0]):
            group = group[1:]  # VAR=value prefixes
        if not group:
            continue
        head, rest = group[0], group[1:]
        if head in SHELL_WORDS:
            return None
        if head in PYTHONS and rest[:1] == ["-m"] and len(rest) > 1:
            found.append(_module_invocation(where, rest[1], rest[2:]))
        elif head in PYTHONS and rest and rest[0].endswith(".py"):
            flags, paths = _flags_and_paths(rest[1:])
            found.append(Invocation(where, "script", rest[0], flags, paths))
        elif head in ACCELERATES and rest[:1] == ["launch"]:
            scripts = [i for i, w in enumerate(rest) if w.endswith(".py")]
            if not scripts:
                found.append(Invocation(where, "script", "(no script after accelerate launch)", [], []))
                continue
            i = scripts[0]
            launcher_flags, launcher_paths = _flags_and_paths(rest[1:i])
            flags, paths = _flags_and_paths(rest[i + 1:])
            found.append(Invocation(where, "script", rest[i], flags, launcher_paths + paths,
                                    launcher_flags=launcher_flags))
        elif head.removeprefix(".venv/bin/").startswith("steprl-"):  # as installed, or in the set-up's .venv
            head = head.removeprefix(".venv/bin/")
            module = console_scripts().get(head)
            flags, paths = _flags_and_paths(rest)
            found.append(Invocation(where, "module", module or f"(unknown console script {head})", flags, paths))
        elif head == "bash" and rest and rest[0].startswith(("scripts/", "experiments/")):
            flags, paths = _flags_and_paths(rest[1:])
            found.append(Invocation(where, "shell", rest[0], flags, paths))
    return found


def invocations_of(text: str, name: str) -> tuple[list[Invocation], list[str]]:
    """Every toolkit invocation quoted in a page, and the places of the lines that could not be read."""
    found, skipped = [], []
    candidates = _fenced_lines(text) + [
        (n, s) for n, s in _prose_spans(text)
        if re.match(r"(\S+=\S+\s+)*(python3? |\.venv/bin/python |(\.venv/bin/)?accelerate launch .*\.py|"
                    r"(\.venv/bin/)?steprl-[a-z]|bash (scripts|experiments)/)", s)]
    for number, command in candidates:
        where = f"{name}:{number}: {command[:90]}"
        parsed = parse_invocations(command, where)
        if parsed is None:
            if re.search(r"python|accelerate|steprl-|scripts/|experiments/", command):
                skipped.append(where)
            continue
        found.extend(parsed)
    return found, skipped


# ---- what each entry point accepts --------------------------------------------------------------

_HELPER = r"""
import contextlib, io, json, os, runpy, sys
os.environ.setdefault("OMP_NUM_THREADS", "1")
root, entries = sys.argv[1], json.loads(sys.argv[2])
sys.path.insert(0, root)
out = {}
for key, kind, target, extra in entries:
    buffer = io.StringIO()
    saved_argv, saved_path = sys.argv, list(sys.path)
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            try:
                if kind == "accelerate":
                    from accelerate.commands.launch import launch_command_parser
                    # its --help shows only the option groups that sys.argv selects: read them all
                    print(" ".join(s for a in launch_command_parser()._actions for s in a.option_strings))
                elif kind == "module":
                    sys.argv = [target] + extra + ["--help"]
                    runpy.run_module(target, run_name="__main__", alter_sys=True)
                else:
                    path = os.path.join(root, target)
                    sys.argv = [path] + extra + ["--help"]
                    sys.path.insert(0, os.path.dirname(path))
                    runpy.run_path(path, run_name="__main__")
            except SystemExit:
                pass
        out[key] = {"ok": True, "text": buffer.getvalue()}
    except BaseException as err:  # reported by the test, with what the entry point printed
        out[key] = {"ok": False, "text": buffer.getvalue() + f"\n{type(err).__name__}: {err}"}
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
print("\x00HELP" + json.dumps(out))
"""


def collect_help(invocations: list[Invocation]) -> dict[str, dict]:
    """`--help` of every module and script the invocations name, in one process."""
    entries, seen = [], set()
    for inv in invocations:
        if inv.kind == "module" and inv.help_key not in seen and _module_file(inv.target):
            entries.append([inv.help_key, "module", inv.target, ["--method", inv.method] if inv.method else []])
        elif inv.kind == "script" and inv.help_key not in seen and (ROOT / inv.target).is_file():
            entries.append([inv.help_key, "script", inv.target, []])
        seen.add(inv.help_key)
    if any(inv.launcher_flags for inv in invocations):
        entries.append(["accelerate-launch", "accelerate", "", []])
    env = {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-c", _HELPER, str(ROOT), json.dumps(entries)], capture_output=True,
                          text=True, timeout=240, env=env, cwd=ROOT)
    marker = done.stdout.rfind("\x00HELP")
    assert marker >= 0, f"the help collector failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return json.loads(done.stdout[marker + len("\x00HELP"):])


def _module_file(module: str) -> Path | None:
    base = ROOT / Path(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__main__.py"):
        if candidate.is_file():
            return candidate
    return None


def _reads_recipes(inv: Invocation) -> bool:
    """Whether the entry point parses with TRL's parser, which takes `--config RECIPE.yaml` without
    listing it in --help."""
    path = _module_file(inv.target) if inv.kind == "module" else ROOT / inv.target
    return bool(re.search(r"\bTrlParser\b|\bparse_config\(", path.read_text()))


def problems_of(invocations: list[Invocation], helps: dict[str, dict]) -> list[str]:
    """One line per fault: a module or script that does not exist, a flag its parser does not offer,
    a configs/ or tests/ path that is not there."""
    problems = []
    for inv in invocations:
        if inv.kind == "module" and not _module_file(inv.target):
            problems.append(f"{inv.where}\n    no module {inv.target} in the repository")
            continue
        if inv.kind in ("script", "shell") and not (ROOT / inv.target).is_file():
            problems.append(f"{inv.where}\n    no script {inv.target}")
            continue
        for path in inv.paths:
            if not (ROOT / path).exists():
                problems.append(f"{inv.where}\n    {path} does not exist")
        if inv.kind == "external":
            continue
        if inv.kind == "shell":
            known = set(FLAG.findall((ROOT / inv.target).read_text()))
            known |= {"--help"} if "--help" in known else set()
        else:
            help_ = helps.get(inv.help_key)
            if help_ is None or not help_["ok"] or not FLAG.search(help_["text"]):
                text = help_["text"][-500:] if help_ else "(not collected)"
                problems.append(f"{inv.where}\n    `{inv.target} --help` printed no flags: {text}")
                continue
            known = set(FLAG.findall(help_["text"]))
            if _reads_recipes(inv):
                known.add("--config")
        for flag in inv.flags:
            if flag not in known:
                problems.append(f"{inv.where}\n    {inv.target} has no flag {flag}")
        if inv.launcher_flags:
            launcher = set(FLAG.findall(helps["accelerate-launch"]["text"]))
            for flag in inv.launcher_flags:
                if flag not in launcher:
                    problems.append(f"{inv.where}\n    accelerate launch has no flag {flag}")
    return problems


# ---- the tests ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def quoted():
    invocations, skipped, per_page = [], [], {}
    for path in doc_files():
        name = str(path.relative_to(ROOT))
        found, skips = invocations_of(path.read_text(), name)
        invocations += found
        skipped += skips
        per_page[name] = len(found)
    bad = [invocations_of(text, "selftest")[0] for text in BAD_DOCS.values()]
    helps = collect_help(invocations + [inv for group in bad for inv in group])
    return invocations, skipped, per_page, helps


def test_every_quoted_command_parses(quoted):
    invocations, _, _, helps = quoted
    assert len(invocations) > 100, "the checker found too few commands: its extraction is broken"
    problems = problems_of(invocations, helps)
    assert not problems, f"{len(problems)} quoted commands do not parse:\n" + "\n".join(problems)


def test_few_lines_skipped_and_every_results_page_checked(quoted):
    invocations, skipped, per_page, _ = quoted
    assert len(skipped) <= max(3, len(invocations) // 50), "too many unreadable command lines:\n" + "\n".join(skipped)
    unchecked = [name for name, n in per_page.items()
                 if name.startswith("docs/results/") and not name.endswith("README.md") and n == 0]
    assert not unchecked, f"results pages with no command the checker could read: {unchecked}"
    for key in ("module:rl.sft", "script:rl/ppo_step.py", "script:scripts/compare.py",
                "module:inference.evaluate::stepco", "shell:scripts/test.sh"):
        assert any(inv.help_key == key for inv in invocations), f"no quoted command reaches {key}"


BAD_DOCS = {
    "unknown flag": "```bash\npython -m rl.sft --output_dir x --no_such_flag 3\n```\n",
    "unknown script": "Run `python scripts/no_such_script.py --n 3` first.\n",
    "unknown module": "```bash\npython -m reasoning.no_such_module --n 3\n```\n",
    "unknown PPO flag after accelerate": "```bash\nACCELERATE_USE_CPU=1 accelerate launch --num_processes 2 \\\n"
                                         "  rl/ppo_step.py --reward gold --rewrad_shaping min\n```\n",
    "unknown launcher flag": "```bash\naccelerate launch --no_such_launcher_flag 1 rl/ppo_step.py\n```\n",
    "unknown method option": "```bash\npython -m inference.evaluate --method stepco --max_roundz 5 --out x\n```\n",
    "unknown shell flag": "```bash\nbash scripts/gpu_smoke.sh --no-such-option\n```\n",
    "missing recipe": "```bash\npython -m rl.sft --config configs/sft/no_such_recipe.yaml\n```\n",
    "unknown console script": "```bash\nsteprl-no-such-tool --n 3\n```\n",
}


@pytest.mark.parametrize("case", sorted(BAD_DOCS))
def test_the_checker_refuses_a_made_up_bad_command(quoted, case):
    helps = quoted[3]
    invocations, skipped = invocations_of(BAD_DOCS[case], "selftest")
    assert invocations and not skipped, f"the checker did not read the {case} example"
    assert problems_of(invocations, helps), f"the checker let the {case} example through"


def test_the_checker_accepts_the_same_commands_spelled_right(quoted):
    helps = quoted[3]
    good = ("```bash\npython -m rl.sft --output_dir x --n_train 3\nACCELERATE_USE_CPU=1 accelerate launch "
            "--num_processes 2 \\\n  rl/ppo_step.py --reward gold --reward_shaping min\n"
            "python -m inference.evaluate --method stepco --max_rounds 5 --out x\n"
            "bash scripts/gpu_smoke.sh --dry-run\n```\n")
    invocations, skipped = invocations_of(good, "selftest")
    assert len(invocations) == 4 and not skipped
    assert not problems_of(invocations, helps)


def test_shell_lines_the_checker_cannot_read_are_counted_not_dropped():
    text = "```bash\nfor s in 0 1 2; do python rl/ppo_step.py --seed $s; done\npython -m rl.sft --n_train 3\n```\n"
    invocations, skipped = invocations_of(text, "selftest")
    assert [inv.target for inv in invocations] == ["rl.sft"]
    assert len(skipped) == 1 and "for s in" in skipped[0]


def test_usage_lines_brackets_alternatives_and_variables():
    line = ("python -m reward_models.verifier_metrics --verifier V --data processbench_gsm8k "
            "[--threshold 0.5 | --calibrate-on DEV] [--rule threshold|drop] > out.json")
    (inv,) = parse_invocations(line, "x")
    assert inv.flags == ["--verifier", "--data", "--threshold", "--calibrate-on", "--rule"]
    (inv,) = parse_invocations("M=x LINEUP=noisy bash scripts/world_methods.sh", "x")
    assert (inv.kind, inv.target) == ("shell", "scripts/world_methods.sh")
    first, second = parse_invocations("bash scripts/setup_env.sh && .venv/bin/accelerate launch rl/ppo_step.py", "x")
    assert (first.target, second.target) == ("scripts/setup_env.sh", "rl/ppo_step.py")
    _, installed = parse_invocations("bash scripts/setup_env.sh && .venv/bin/steprl-ppo --max_steps 2", "x")
    assert (installed.kind, installed.target, installed.flags) == ("module", "rl.ppo_step", ["--max_steps"])
