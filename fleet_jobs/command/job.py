"""The `command` job: an existing program, unchanged, run once per item.

Each item's input is fetched from the store to a local file (``{input}``; or streamed
on the program's stdin with ``stdin=true``), the program runs through ``/bin/sh -c``
with an empty folder as ``{output}``, and after it exits 0 every file it left there
becomes an output of the item: ``{output}/NAME`` is committed as ``part-<item>-NAME``
(a subfolder's file as ``part-<item>-SUB/NAME``), with the digests and lease of any
job's outputs. A non-zero exit, a signal or the timeout fails the attempt with the exit
code and the end of stderr (fleet.job.ItemFailed), and the fleet retries it. However the
item ends, every process the program started has ended with it (process.py).
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
from dataclasses import dataclass
from typing import Any, Mapping

from fleet.job import (
    ConfigError,
    Converter,
    ItemContext,
    ItemFailed,
    ItemInput,
    Job,
    KeyedSink,
    Opener,
    Piece,
    Sink,
    Source,
    cut_at_newlines,
)

from . import packages, process

log = logging.getLogger("fleet_jobs.command")

PLACEHOLDERS = ("input", "output", "item", "seed")
SPLITS = ("files", "lines")
COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".lz4", ".zip", ".7z", ".br")
SHELL = "/bin/sh"
# Words a shell runs itself: nothing to look for on PATH.
SHELL_WORDS = {
    "!",
    "{",
    "(",
    "[",
    "[[",
    ".",
    ":",
    "case",
    "cd",
    "command",
    "eval",
    "exec",
    "export",
    "for",
    "if",
    "set",
    "source",
    "test",
    "time",
    "true",
    "false",
    "ulimit",
    "umask",
    "until",
    "while",
    "echo",
    "printf",
    "read",
    "exit",
    "trap",
    "wait",
}
# Interpreters whose first argument that is not an option is a script to find.
INTERPRETER = re.compile(r"^(python[0-9.]*|pypy[0-9.]*|bash|sh|dash|zsh|perl|ruby|node|Rscript)$")
NO_SCRIPT = {"-c", "-m", "-e", "-E", "--eval", "-"}  # code or a module follows, not a script file
TAKES_VALUE = {"-W", "-X", "-I"}  # an option whose value is the next word


@dataclass
class CommandConfig:
    command: str = ""  # the program per item, run by /bin/sh; {input} {output} {item} {seed} are replaced (quoted)
    split: str = "files"  # files: one item per input file; lines: byte ranges of about --item-mb cut at newlines
    stdin: bool = False  # stream the item's bytes to the command's stdin instead of a file at {input}
    timeout: float = 0.0  # seconds an attempt may run before it is stopped, and all it started, and fails (0: none)
    grace: float = 5.0  # seconds between SIGTERM and SIGKILL when the command is stopped (give-back, timeout)
    requirements_file: str = ""  # pip requirements with --hash lines: installed once per machine for the command
    seed: int = 0  # the run's seed: {seed} of each item is derived from it and the item id


def substitute(command: str, values: Mapping[str, str]) -> str:
    """The command with each ``{name}`` of PLACEHOLDERS replaced by its value, quoted for the
    shell; any other brace (awk '{print $1}', ${HOME}) is left as it is."""
    return re.sub(r"\{(" + "|".join(PLACEHOLDERS) + r")\}", lambda m: shlex.quote(values[m.group(1)]), command)


def _words(command: str) -> list[str]:
    try:
        return shlex.split(substitute(command, {name: f"{{{name}}}" for name in PLACEHOLDERS}), comments=True)
    except ValueError as e:
        raise ConfigError(f"option command: the shell cannot parse it ({e}): {command}") from None


def validate(config: CommandConfig) -> None:
    """What can be checked anywhere: the options and the command's placeholders."""
    command = config.command.strip()
    if not command:
        raise ConfigError(
            "option command: give the program to run per item, e.g. --set command='python3 conv.py {input} {output}'"
        )
    used = set(re.findall(r"\{(" + "|".join(PLACEHOLDERS) + r")\}", command))
    if "output" not in used:
        raise ConfigError(
            "option command: {output} is missing: the command must write its files into the folder "
            "{output} names (only those become the item's outputs)"
        )
    if not config.stdin and "input" not in used:
        raise ConfigError(
            "option command: {input} is missing: name the item's input file with {input}, or set "
            "stdin=true to read it on standard input"
        )
    if config.stdin and "input" in used:
        raise ConfigError(
            "option command: {input} with stdin=true: the input comes on standard input then; drop one of the two"
        )
    if config.split not in SPLITS:
        raise ConfigError(
            f"option split: {config.split!r} is not known (files: one item per input file; "
            "lines: byte ranges cut at newlines)"
        )
    if not config.timeout >= 0:
        raise ConfigError(f"option timeout: {config.timeout:g} s; give 0 (no limit) or more")
    if not 0 <= config.grace <= 3600:
        raise ConfigError(f"option grace: {config.grace:g} s; give 0 to 3600")
    _words(command)


def check_program(config: CommandConfig, path: str | None = None, cwd: str | None = None) -> None:
    """The program the command starts exists here (on ``path``, or as a path from ``cwd``) and can
    run, and so does the script an interpreter is given (``python3 conv.py``)."""
    cwd = cwd or os.getcwd()
    words = _words(config.command)
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):  # VAR=value before the program
        words = words[1:]
    if not words or words[0] in SHELL_WORDS or any(c in words[0] for c in "{}$`*?"):
        return  # a shell construct, or a name known only when it runs
    program, args = words[0], words[1:]
    if "/" in program:
        where = os.path.join(cwd, program)
        if not os.path.isfile(where):
            raise ConfigError(f"option command: {program}: no such program (looked in {cwd})")
        if not os.access(where, os.X_OK):
            raise ConfigError(
                f"option command: {program} is not executable (chmod +x it, or run it through "
                f"its interpreter: python3 {program} ...)"
            )
    elif shutil.which(program, path=path) is None:
        raise ConfigError(f"option command: {program}: no such program on PATH")
    if not INTERPRETER.match(os.path.basename(program)):
        return
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in NO_SCRIPT:
            return
        if arg in TAKES_VALUE:
            skip = True
            continue
        if arg.startswith("-"):
            continue
        if "{" in arg or "$" in arg:
            return
        if not os.path.isfile(os.path.join(cwd, arg)):
            raise ConfigError(
                f"option command: {arg}: no such file (looked in {cwd}), the script "
                f"{os.path.basename(program)} would run"
            )
        return


def input_name(name: str) -> str:
    """A safe local file name for an input object: its base name, with any character other
    than letters, digits, '.', '_' and '-' replaced by '_' (so {input} never needs quoting)."""
    base = re.sub(r"[^A-Za-z0-9._-]", "_", name.rsplit("/", 1)[-1])
    return base if base and not base.startswith(".") else f"input{base}"


def _name_problem(rel: str) -> str | None:
    """Why an output's relative path cannot be an object name, or None."""
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return "is not UTF-8"
    if any(ord(c) < 32 or c == "\x7f" or c == "\\" for c in rel):
        return "holds a control character or a backslash"
    if len(rel.encode("utf-8")) > 900:
        return "is longer than 900 bytes"
    return None


class CommandConverter(Converter):
    def __init__(self, config: CommandConfig, venv: str | None):
        self.config = config
        self.env = dict(os.environ)
        self.env[process.MARK] = str(os.getpid())  # how the next worker here finds it if this one is SIGKILLed
        if venv:  # the run's packages: its python3 and scripts come first
            self.env["PATH"] = os.path.join(venv, "bin") + os.pathsep + self.env.get("PATH", os.defpath)
            self.env["VIRTUAL_ENV"] = venv
            self.env.pop("PYTHONHOME", None)

    def convert(self, item: ItemInput, ctx: ItemContext, sink: Sink | KeyedSink) -> dict[str, float]:
        if not isinstance(sink, Sink):  # (a program's files feed no stage: the job has none)
            raise TypeError(f"item {ctx.item_id}: the command job feeds no stage, but was given a KeyedSink")
        cfg = self.config
        work = ctx.workdir
        out_dir = os.path.join(work, "output")
        os.makedirs(out_dir)
        values = {"output": out_dir, "item": ctx.item_id, "seed": str(ctx.seed)}
        if not cfg.stdin:
            in_dir = os.path.join(work, "input")
            os.makedirs(in_dir)
            values["input"] = item.fetch(os.path.join(in_dir, input_name(item.name)))
        ctx.checkpoint()
        try:
            done = process.run(
                [SHELL, "-c", substitute(cfg.command, values)],
                cwd=None,
                env=self.env,
                checkpoint=ctx.checkpoint,
                timeout=cfg.timeout,
                grace=cfg.grace,
                stdin_from=item if cfg.stdin else None,
            )
        except process.TimedOut as e:
            raise ItemFailed(
                f"the command ran longer than timeout={cfg.timeout:g} s; it was stopped with every process it started",
                {"timeout_seconds": cfg.timeout, "stderr_tail": e.stderr_tail},
            ) from None
        except BaseException:  # a give-back or a lost lease: nothing it wrote may be committed
            shutil.rmtree(out_dir, ignore_errors=True)
            raise
        if done.returncode != 0:
            tail = done.stderr_tail
            how = (
                f"exit code {done.returncode}"
                if done.returncode > 0
                else f"killed by {process.signal_name(done.returncode)}"
            )
            raise ItemFailed(
                f"the command failed ({how}): {tail[-1] if tail else 'nothing on stderr'}",
                {"exit_code": done.returncode, "stderr_tail": tail},
            )
        return self._commit(out_dir, sink, done.seconds)

    def _commit(self, out_dir: str, sink: Sink, seconds: float) -> dict[str, float]:
        """Every regular file under {output} becomes an output; hidden ones (a name starting
        with '.', as editors and tools leave) are left out and counted."""
        count = size = hidden = 0
        for rel, path in process.walk_files(out_dir):
            if any(part.startswith(".") for part in rel.split("/")):
                hidden += 1
                continue
            if os.path.islink(path) or not os.path.isfile(path):
                raise ItemFailed(
                    f"the command left {{output}}/{rel}, which is not a regular file (a link, a pipe): "
                    "only files are committed"
                )
            problem = _name_problem(rel)
            if problem:
                raise ItemFailed(
                    f"the command left an output whose name {problem}: "
                    f"{rel.encode('utf-8', 'backslashreplace').decode()!r}"
                )
            size += os.path.getsize(path)
            sink.add(f"-{rel}", path)
            count += 1
        stats: dict[str, float] = {
            "output_files": count,
            "output_bytes": size,
            "items_without_outputs": int(count == 0),
            "command_seconds": round(seconds, 3),
        }
        if hidden:
            stats["hidden_files_left_out"] = hidden
        return stats


class CommandJob(Job):
    """Runs an existing program once per item: input file in, files of a folder out."""

    name = "command"
    config_type = CommandConfig
    # One program run per input file, as the docs promise: {input} is one file, {item} and {seed} name
    # it, and its files are part-<item>-NAME. Grouped, two files' outputs of one NAME would meet in one
    # item, and a retry would rerun every program of the group (docs/command-job.md, "Items").
    group_small_files = False

    def check(self, config: CommandConfig, opener: Opener) -> None:
        validate(config)

    def check_here(self, config: CommandConfig) -> None:
        validate(config)
        try:
            check_program(config)
        except ConfigError:
            if not config.requirements_file:
                raise
            # The program may be a script of the run's packages, installed by the first worker:
            # it looks again then, with them on its PATH.

    def cut(self, source: Source, item_bytes: int, config: CommandConfig, read: Mapping[str, Any]) -> list[Piece]:
        if config.split != "lines":
            return [Piece(0, source.size)]
        if source.name.lower().endswith(COMPRESSED):
            raise ConfigError(
                f"{source.display}: a compressed file cannot be cut at newlines (split=lines cuts its "
                "raw bytes); use split=files, or decompress it first"
            )
        return cut_at_newlines(source, item_bytes)

    def converter(self, config: CommandConfig, opener: Opener) -> CommandConverter:
        validate(config)
        left = process.sweep_orphans()
        if left:
            log.warning("stopped %d program(s) left running by workers of this machine that were killed", left)
        venv = None
        if config.requirements_file:  # read through the opener: refused if not what the run pinned
            venv = packages.environment(
                opener(config.requirements_file), f"requirements_file {config.requirements_file}"
            )
        converter = CommandConverter(config, venv)
        check_program(config, path=converter.env.get("PATH"))  # where it runs: a VM's PATH and code snapshot
        return converter
