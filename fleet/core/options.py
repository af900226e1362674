"""A job's options: its config dataclass read from ``--set k=v`` strings or a run.json dict
(``parse_dataclass``: each value coerced to its field's type and checked against its declared
range, one line naming the option on error), and described for ``fleet jobs``
(``describe_options``).

The planner and the worker parse a run's config, the CLI describes it; a job declares its
options as dataclass fields and gets ``SEED_RANGE`` and friends from ``fleet.job``.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Mapping

from fleet.core.errors import ConfigError


def _coerce(name: str, tp: Any, value: Any) -> Any:
    if isinstance(tp, str):
        tp = {"int": int, "float": float, "bool": bool, "str": str}.get(tp.split("|")[0].strip(), str)
    origin = typing.get_origin(tp)
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or value == "":
            return None
        tp = args[0]
    if tp is bool:
        if isinstance(value, bool):
            return value
        s = str(value).strip().lower()
        if s in ("1", "true", "yes", "on"):
            return True
        if s in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"option {name}: expected true or false, got {value!r}")
    if tp in (int, float):
        try:
            return tp(value)
        except (TypeError, ValueError):
            raise ConfigError(f"option {name}: expected a number, got {value!r}") from None
    return str(value) if value is not None else None


# The run's seed goes to every item's seed and RNG: a signed 64-bit integer that is not negative is
# what numpy (no negative seeds), TensorFlow (int64) and a JSON reader of run.json all take as it is.
SEED_RANGE = (0, (1 << 63) - 1)


def option_range(f: dataclasses.Field) -> tuple[float, float] | None:
    """The (low, high) an option declares with ``field(metadata={"range": (low, high)})``, both
    included; the option ``seed`` has SEED_RANGE unless it declares its own (Job.seed reads it)."""
    declared = f.metadata.get("range")
    if declared is not None:
        return declared
    return SEED_RANGE if f.name == "seed" else None


def _in_range(name: str, value: Any, bounds: tuple[float, float] | None) -> Any:
    if bounds is None or value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    low, high = bounds
    if not low <= value <= high:  # NaN too
        raise ConfigError(f"option {name}: {value!r} is out of range: give {low} to {high}")
    return value


def parse_dataclass(cls: type, values: Mapping[str, Any]) -> Any:
    """The config from option values, each coerced to its field's type and checked against the
    range it declares (``option_range``): one line naming the option, never a traceback."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(fields))}")
    kwargs = {k: _in_range(k, _coerce(k, hints.get(k, str), v), option_range(fields[k])) for k, v in values.items()}
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ConfigError(str(e)) from None


@dataclass(frozen=True)
class OptionHelp:
    name: str
    type: str
    default: Any
    help: str


def describe_options(config_type: type) -> list[OptionHelp]:
    """A job's options from its config dataclass: name, type, default and one line of help, the
    comment at the end of the field's line (in the class that declares it: a config may build on
    a shared one), then the range the option takes (``option_range``), if any. One way to write
    help: a comment where the field is, read back here."""
    comments: dict[str, str] = {}
    for cls in reversed(config_type.__mro__):
        if dataclasses.is_dataclass(cls):
            comments.update(_field_comments(cls))
    hints = typing.get_type_hints(config_type)
    out = []
    for f in dataclasses.fields(config_type):
        default = (
            f.default
            if f.default is not dataclasses.MISSING
            else (f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        )
        kind = hints.get(f.name, str)
        name = getattr(kind, "__name__", None) or str(kind).replace("typing.", "")
        text = comments.get(f.name, "")
        bounds = option_range(f)
        if bounds is not None:  # what parse_dataclass takes, where `fleet jobs` shows it
            text = f"{text} ({bounds[0]} to {bounds[1]})".strip()
        out.append(OptionHelp(f.name, name, default, text))
    return out


def _field_comments(cls: type) -> dict[str, str]:
    """{field: its help} in ``cls``'s own source ({} where there is none). The help is the comment
    that ends the field's first line or, where the formatter wrapped the field over lines, the one
    after its closing bracket on the last line."""
    import inspect
    import io
    import textwrap
    import tokenize

    comments: dict[str, str] = {}
    try:
        source = textwrap.dedent(inspect.getsource(cls))
        field: tuple[str, int] | None = None  # (name, first line) of the statement being read
        ends: dict[int, str] = {}  # line -> the comment ending it, within that statement
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.NAME and tok.start[1] == 4 and field is None:
                field, ends = (tok.string, tok.start[0]), {}
            elif tok.type == tokenize.COMMENT and field:
                ends[tok.start[0]] = tok.string[1:].strip()
            elif tok.type == tokenize.NEWLINE:
                if field:
                    text = ends.get(field[1]) or ends.get(tok.start[0])
                    if text:
                        comments[field[0]] = text
                field = None
    except (OSError, TypeError, tokenize.TokenError, IndentationError):
        pass
    return comments
