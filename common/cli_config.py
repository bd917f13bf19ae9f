"""Command-line parsers built from config dataclasses, with a variable per flag.

Each flag field (common.flag_fields) becomes an argparse argument. The value taken is
the flag's when given, else its environment variable's when set, else the field's
default. `build` makes the dataclass from the parsed flags, so that its __post_init__
is the one place a value is checked; a ValueError from it becomes a FlagError naming
the flag and its variable.

Variables are read when the parser is built. A set one becomes the argument's default
as a string, which argparse converts with the argument's own type function only when
the flag is absent: a flag on the command line wins, and a bad variable that a flag
overrides is never read.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from common.flag_fields import Flag, flags_of

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class FlagError(ValueError):
    """A config value the dataclass refused, with the flag and variable that set it."""


def add_flags(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    only: Iterable[str] | None = None,
    forward_to: str | None = None,
    group: str | None = None,
) -> list[Flag]:
    """Adds cls's flags to parser, into the argument group named by `group`, else by
    their FlagSpec's.

    forward_to names the process a launcher passes these flags on to (`cbserve serve`
    gives the worker's --dtype to its workers): such a flag is None unless the command
    line or its variable sets it, so that `to_argv` passes on only what was asked for.
    """
    added = flags_of(cls, only)
    exclusive: dict[str, Any] = {}
    for each in added:
        title = group or each.spec.group
        target = _group(parser, title) if title else parser
        if each.spec.excludes:
            partners = [exclusive[name] for name in each.spec.excludes if name in exclusive]
            target = partners[0] if partners else target.add_mutually_exclusive_group()
            exclusive[each.field.name] = target
        default = _env_text(each)
        if default is None and forward_to is None:
            default = each.default()
        kwargs: dict[str, Any] = {
            "dest": each.dest,
            "default": default,
            "type": _converter(each),
            "help": _help(each, forward_to),
        }
        if each.kind is bool and not each.is_list:
            kwargs["action"] = _Switch if each.spec.switch else _Toggle
        else:
            kwargs["metavar"] = _metavar(each)
            if each.is_list:
                kwargs.update(action=_Extend, nargs="+" if each.spec.several else None)
            elif each.spec.excludes:
                dests = {other.field.name: other.dest for other in flags_of(cls)}
                clears = [dests[name] for name in each.spec.excludes]
                kwargs.update(action=_StoreClearing, clears=clears)
        target.add_argument(each.option, **kwargs)
    return added


def build(
    cls: type, args: argparse.Namespace, *, only: Iterable[str] | None = None, **overrides: Any
):
    """cls made from the parsed flags (only those named, when `only`; a flag left at None
    leaves the field's default) and overrides; raises FlagError, naming the flag and its
    variable, when cls refuses a value."""
    flags = flags_of(cls)
    named = flags_of(cls, only)
    values = {each.field.name: getattr(args, each.dest, None) for each in named}
    values = {name: value for name, value in values.items() if value is not None}
    values.update(overrides)
    try:
        return cls(**values)
    except ValueError as error:
        raise FlagError(_name_the_flag(flags, str(error))) from error


def to_argv(args: argparse.Namespace, cls: type, only: Iterable[str] | None = None) -> list[str]:
    """The command-line flags that give another process the values set in args (None: left
    out); secret flags are left to to_env."""
    argv: list[str] = []
    for each in flags_of(cls, only):
        value = getattr(args, each.dest, None)
        if value is None or each.spec.secret:
            continue
        if isinstance(value, bool):
            if value or not each.spec.switch:
                argv.append(each.option if value else f"--no-{each.name}")
        else:
            for item in value if each.is_list else [value]:
                argv += [each.option, str(item)]
    return argv


def to_env(
    args: argparse.Namespace, cls: type, only: Iterable[str] | None = None
) -> dict[str, str]:
    """The variables that give another process the secret flags set in args; a list is
    comma-separated, as the variable takes several (a key holds no comma)."""
    env: dict[str, str] = {}
    for each in flags_of(cls, only):
        value = getattr(args, each.dest, None)
        if value is None or not each.spec.secret or value == []:
            continue
        env[each.env] = ",".join(map(str, value)) if each.is_list else str(value)
    return env


class _EnvText(str):
    """A variable's text standing in as an argument's default; remembers the variable."""

    variable = ""


def _env_text(each: Flag) -> _EnvText | None:
    for name in each.env_names:
        value = os.environ.get(name)
        # An empty variable counts as unset: `VAR=` is how a shell or a manifest clears one.
        if value:
            text = _EnvText(value)
            text.variable = name
            return text
    return None


def _parse_bool(text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError(f"expected one of {'/'.join(_TRUE + _FALSE)}, got {text!r}")


_BUILTIN_PARSERS: dict[type, Callable[[str], Any]] = {
    bool: _parse_bool,
    int: int,
    float: float,
    str: str,
    Path: Path,
}


def _converter(each: Flag) -> Callable[[str], Any]:
    parse = each.spec.parse or _BUILTIN_PARSERS[each.kind]
    choices = each.spec.choices

    def convert(text: str) -> Any:
        source = f" (from {text.variable})" if isinstance(text, _EnvText) else ""
        # A list flag takes comma-separated values too: how a variable holds several.
        split = each.spec.split or (lambda whole: whole.split(","))
        pieces = [piece.strip() for piece in split(text)] if each.is_list else [text]
        values = []
        for piece in filter(None, pieces) if each.is_list else pieces:
            try:
                value = parse(piece)
            except (ValueError, TypeError, argparse.ArgumentTypeError) as error:
                reason = str(error)
                if parse in _BUILTIN_PARSERS.values() and each.kind is not bool:
                    reason = f"invalid {each.kind.__name__} value: {piece!r}"
                raise argparse.ArgumentTypeError(reason + source) from None
            if choices is not None and value not in choices:
                allowed = ", ".join(map(str, choices))
                raise argparse.ArgumentTypeError(
                    f"invalid choice: {piece!r} (choose from {allowed}){source}"
                )
            values.append(value)
        return values if each.is_list else values[0]

    return convert


class _Toggle(argparse.BooleanOptionalAction):
    """--flag / --no-flag; `type` converts a variable's text (argparse's own takes none)."""

    def __init__(self, option_strings, dest, type=None, help=None, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        # Set after: argparse's own adds a "(default: ...)" of its own to the help.
        self.type, self.help = type, help


class _Switch(argparse.Action):
    """A bare --flag that sets True (store_true), whose variable may set it too."""

    def __init__(self, option_strings, dest, default=False, type=None, help=None):
        super().__init__(option_strings, dest, nargs=0, default=default, type=type, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, True)


class _StoreClearing(argparse.Action):
    """Stores its value and clears the fields it excludes (set by their variables)."""

    def __init__(self, option_strings, dest, clears=(), **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.clears = clears

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        for name in self.clears:
            setattr(namespace, name, None)


class _Extend(argparse.Action):
    """A list flag: every occurrence adds its values; the first replaces the default
    (a variable's values or the field's), since the command line wins."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        current = getattr(namespace, self.dest, None)
        collected = [] if current is self.default or current is None else list(current)
        for converted in values if self.nargs == "+" else [values]:
            collected.extend(converted)
        setattr(namespace, self.dest, collected)


def _group(parser: argparse.ArgumentParser, title: str):
    # argparse has no lookup by title; reusing the group keeps one heading per title
    # when several dataclasses add flags to it.
    for group in parser._action_groups:
        if group.title == title:
            return group
    return parser.add_argument_group(title)


def _metavar(each: Flag) -> str | None:
    if each.spec.metavar or not each.spec.choices:
        return each.spec.metavar or ("N" if each.kind is int else None)
    return "{" + ",".join(map(str, each.spec.choices)) + "}"


def _help(each: Flag, forward_to: str | None) -> str:
    default = each.default()
    if isinstance(default, bool):
        shown = "on" if default else "off"
    elif isinstance(default, float):
        shown = f"{default:g}"
    elif default is None or default == [] or default == "":
        shown = each.spec.default_help or "none"
    else:
        shown = str(default)
    if forward_to is not None:
        shown = f"the {forward_to}'s, {shown}"
    env = " or ".join(each.env_names)
    # argparse %-formats help strings.
    return f"{each.spec.help} (default: {shown}; env {env})".replace("%", "%%")


def _name_the_flag(flags: Sequence[Flag], message: str) -> str:
    """`max_num_seqs must be ...` -> `--max-num-seqs (env ...): max_num_seqs must be ...`."""
    found = []
    for each in flags:
        match = re.search(rf"(?<![\w-]){re.escape(each.field.name)}(?!\w)", message)
        if match:
            found.append((match.start(), each))
    if not found:
        return message
    _, first = min(found, key=lambda pair: pair[0])
    return f"{first.option} (env {first.env}): {message}"
