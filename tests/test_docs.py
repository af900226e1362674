"""The docs keep their promises: the site builds strictly, every command line in them parses, the
reference pages are what the code says, and the README stays an entrance.

The site is mkdocs.yml + docs/; `mkdocs build --strict` fails on a broken link or anchor (the
validation settings in mkdocs.yml), which a test here checks by breaking one. Command lines are
read from the fenced code blocks of README.md and every page: each `fleet ...` and
`python -m fleet_jobs.text ...` is parsed by the command line itself (its click command),
so a renamed command or option fails here, not in a user's terminal.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
TEXTS = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *PAGES]
SHELL_OPERATORS = {"&&", "||", "|", ";", "&", ">", ">>", "<", "2>", "2>&1"}


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_site_builds_strictly(tmp_path):
    done = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr
    for page in PAGES:
        rel = page.relative_to(DOCS).with_suffix("")
        built = tmp_path / "site" / ("index.html" if rel == Path("index") else rel / "index.html")
        assert built.is_file(), f"docs/{page.relative_to(DOCS)} was not built"
    jobs = (tmp_path / "site" / "reference" / "jobs" / "index.html").read_text()
    assert all(f">{name}<" in jobs for name in _generator().in_tree_jobs())


@pytest.mark.parametrize("link", ["[gone](no-such-page.md)", "[gone](gcp.md#no-such-section)"])
def test_a_broken_link_fails_the_build(tmp_path, link):
    """What makes the build strict: a link to a missing page or anchor fails it, not a warning."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(DOCS, tmp_path / "docs")  # symbolic links copied as the files they name
    with open(tmp_path / "docs" / "local.md", "a") as f:
        f.write(f"\nSee {link}.\n")
    done = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0 and link.split("(")[1].rstrip(")").split("#")[-1] in done.stderr


def test_the_reference_pages_are_what_the_code_says():
    """docs/reference/ is generated (docs/gen_reference.py); a job option or a command changed
    without regenerating it fails here."""
    for path, text in _generator().pages().items():
        committed = (DOCS / path).read_text(encoding="utf-8")
        assert committed == text, f"docs/{path} is stale: run .venv/bin/python docs/gen_reference.py"


def test_every_page_is_reachable_from_the_home_page_and_the_readme():
    index = (DOCS / "index.md").read_text()
    readme = (ROOT / "README.md").read_text()
    for page in PAGES:
        rel = page.relative_to(DOCS).as_posix()
        if rel == "index.md":
            continue
        assert f"({rel})" in index or f"({rel}#" in index, f"docs/index.md links no docs/{rel}"
        target = "ARCHITECTURE.md" if rel == "architecture.md" else f"docs/{rel}"
        assert f"({target})" in readme, f"README.md links no {target}"


def test_the_readme_is_an_entrance():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 100, "README.md: two screens at most; the rest goes to docs/"
    for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if "://" not in link:
            assert (ROOT / link).exists(), f"README.md links {link}, which does not exist"
    blocks = code_blocks(readme)
    assert "&& .venv/bin/fleet local corpus/ out/ --workers 2 --set vocab_file=vocab.txt" in blocks[0]
    assert blocks[1].strip() == (
        "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' "
        "&& .venv/bin/pip install --no-deps mosaicml-streaming==0.13.0 && .venv/bin/ruff check "
        "&& .venv/bin/ruff format --check && .venv/bin/mypy && .venv/bin/python -m pytest"
    )
    # CI runs the README's test command (pip made quiet).
    assert blocks[1].strip().replace("pip install -e", "pip install -q -e") in (ROOT / ".ci" / "run").read_text()
    # The home page opens with the same two commands.
    assert code_blocks((DOCS / "index.md").read_text())[:2] == blocks[:2]


def code_blocks(text: str, shell: bool = False) -> list[str]:
    """The fenced code blocks of a page; with `shell`, only those of commands (no language, or a
    shell's: a ```text or ```python block is not run)."""
    blocks = re.findall(r"^```([^\n]*)\n(.*?)^```", text, re.S | re.M)
    return [body for lang, body in blocks if not shell or lang.strip() in ("", "bash", "sh", "shell", "console")]


def command_lines(block: str) -> list[list[str]]:
    """Each simple command of a shell block as its words: continuation lines joined, comments and
    redirections dropped, `a && b | c` cut into three, leading VAR=value words left out."""
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        try:
            words = list(lexer)
        except ValueError:  # not shell (a Python line in a shell block): nothing to run
            continue
        current: list[str] = []
        skip = False
        for word in words + [";"]:
            if word in SHELL_OPERATORS or set(word) <= set("&|;<>"):
                if current:
                    commands.append(current)
                current, skip = [], word in {">", ">>", "<", "2>"}
            elif skip:
                skip = False  # a redirection's target
            elif current or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*\+?=", word):
                current.append(word)
    return commands


def _apps():
    from fleet.cli.commands import app as fleet_app
    from fleet_jobs.text.tools.cli import app as tools_app

    return {"fleet": typer.main.get_command(fleet_app), "fleet_jobs.text": typer.main.get_command(tools_app)}


def program_of(words: list[str]) -> tuple[str, list[str]] | None:
    """(`fleet` or `fleet_jobs.text`, the rest) for a command line of ours, else None."""
    if words[0] == "fleet" or words[0].endswith("/bin/fleet"):
        return "fleet", words[1:]
    if re.fullmatch(r"(\S*/)?python3?", words[0]) and words[1:2] == ["-m"] and len(words) > 2:
        if words[2] == "fleet.cli":
            return "fleet", words[3:]
        if words[2] == "fleet_jobs.text":
            return "fleet_jobs.text", words[3:]
    return None


def usage_words(args: list[str]) -> list[str]:
    """A usage line's words as a user would fill them: `[--set k=v]...` is `--set k=v`, `INPUT...`
    is `INPUT`, and `[OPTIONS]` is nothing."""
    out = []
    for word in args:
        if word == "[OPTIONS]" or (word == "..." and not (out and out[-1].startswith("--"))):
            continue
        if word == "...":  # `--set ...`: the option's value
            out.append(word)
            continue
        word = re.sub(r"\]?(\.\.\.)?$", "", word.lstrip("["))
        if word:
            out.append(word)
    return out


def inline_commands(text: str) -> list[str]:
    """Inline code in the prose that is a command line of ours (`fleet status --verify`)."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    spans = re.findall(r"(?<!`)`([^`\n]+)`(?!`)", prose)
    return [s for s in spans if re.match(r"(\S*/)?(fleet|python3? -m (fleet_jobs\.electra_zh_en|fleet\.cli)) ", s)]


def documented_commands() -> list[tuple[str, str, str, list[str]]]:
    """(file, line, program, its words) of every command line of ours in the docs and the README."""
    found = []
    for path in TEXTS:
        text = path.read_text()
        for block in code_blocks(text, shell=True) + inline_commands(text):
            for words in command_lines(block):
                program = program_of(words)
                if program:
                    found.append((path.relative_to(ROOT).as_posix(), shlex.join(words), *program))
    return found


COMMANDS = documented_commands()


def test_the_docs_show_command_lines():
    """The collection works: the tour's and the guides' lines are found, so the test below has teeth."""
    shown = {" ".join(args[:1]) for _, _, program, args in COMMANDS if program == "fleet"}
    assert {"local", "plan", "launch", "status", "iam", "sync", "init", "down", "follow", "jobs"} <= shown
    assert any(program == "fleet_jobs.text" for _, _, program, _ in COMMANDS)


def parse(program: str, args: list[str]) -> list[str]:
    """Parse a command line as the program's own parser does, up to the values' types and checks
    (a usage line says `--workers N`): an unknown command or option, or an option without its
    value, raises click's error; what is left over is returned."""
    group = _apps()[program]
    root = group.context_class(group, info_name=program)  # neither program has options of its own
    name, *rest = args
    command = group.get_command(root, name)
    if command is None:
        raise LookupError(f"no command {name!r} in {program}")
    ctx = command.context_class(command, info_name=name, parent=root)
    _, left, _ = command.make_parser(ctx).parse_args(args=list(rest))
    return left


@pytest.mark.parametrize("where,line,program,args", COMMANDS, ids=[f"{w}: {line[:70]}" for w, line, _, _ in COMMANDS])
def test_every_command_line_in_the_docs_parses(where, line, program, args):
    args = usage_words(args)
    assert args, f"{where}: `{line}` names no command"
    try:
        left = parse(program, args)
    except Exception as e:
        pytest.fail(f"{where}: `{line}`: {e}")
    assert not left, f"{where}: `{line}`: unexpected arguments {left}"


def test_a_wrong_command_line_is_caught():
    """The parse refuses what a user's terminal would."""
    assert parse("fleet", ["launch", "--run", "r", "--workers", "N"]) == []
    with pytest.raises(Exception, match="wrokers"):
        parse("fleet", ["launch", "--run", "r", "--wrokers", "5"])
    with pytest.raises(Exception, match="--run"):
        parse("fleet", ["status", "--run"])
    with pytest.raises(LookupError, match="lunch"):
        parse("fleet", ["lunch", "--run", "r"])
    with pytest.raises(Exception, match="--spot"):
        parse("fleet", ["local", "in/", "out/", "--spot"])
    assert parse("fleet_jobs.text", ["check", "in/", "--vocab", "v.txt"]) == []
    assert parse("fleet", ["iam", "extra"]) == ["extra"]


def test_bench_scripts_in_the_docs_exist_with_their_options():
    """`.venv/bin/python bench/x.py --opt` lines: the script is there and knows the option."""
    seen = 0
    for path in TEXTS:
        for block in code_blocks(path.read_text(), shell=True):
            for words in command_lines(block):
                scripts = [w for w in words[1:2] if w.startswith("bench/") and w.endswith(".py")]
                for script in scripts:
                    seen += 1
                    source = (ROOT / script).read_text() if (ROOT / script).is_file() else None
                    assert source is not None, f"{path.name}: {script} does not exist"
                    for option in (w.split("=")[0] for w in words[2:] if w.startswith("--")):
                        assert f'"{option}"' in source, f"{path.name}: {script} has no option {option}"
    assert seen >= 5


def test_the_option_tables_name_real_options():
    """Hand-written option tables (`| option (`--set`) |`) name only options some job has."""
    from fleet.job import describe_options, load_job

    known = {opt.name for name in _generator().in_tree_jobs() for opt in describe_options(load_job(name).config_type)}
    tables = 0
    for page in PAGES:
        for table in re.findall(r"^\| option \(`--set`\).*?(?=^\s*$)", page.read_text(), re.S | re.M):
            tables += 1
            for row in table.splitlines()[2:]:
                first = row.split(" | ")[0]
                for option in re.findall(r"`([a-z_0-9]+)`", first):
                    assert option in known, f"docs/{page.name}: the option table names {option}, which no job has"
    assert tables >= 2


def test_every_option_of_every_job_says_what_it_does():
    """Each option's help is the comment at the end of its field's line: a field the formatter
    wrapped (``output: str = (`` over three lines) lost causal_lm's ``output`` help once."""
    from fleet.job import describe_options, load_job

    for name in _generator().in_tree_jobs():
        for option in describe_options(load_job(name).config_type):
            assert option.help.strip(), (
                f"job {name}: option {option.name} has no help (a comment at the end of its line)"
            )
