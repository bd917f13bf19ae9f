"""Flags declared on config dataclasses: `flag(...)` fields and what they say.

A field declared with `flag(...)` becomes `--field-name` (or the name its FlagSpec
gives), typed by its annotation (str, int, float, Path, bool, `X | None`, or
`list[X]` for a flag that may repeat), with the environment variable
`<ENV_PREFIX><FLAG_NAME>`, ENV_PREFIX being a ClassVar of the dataclass: the
scheduler's `--max-num-seqs` is CBSERVE_SCHEDULER_MAX_NUM_SEQS. common.cli_config
turns them into argparse arguments and parsed arguments back into the dataclass. A
field marked `forwarded_by=(SERVE, ...)` is taken by that launcher too and passed on
to the process (`forwarded_flags`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any

_METADATA_KEY = "cbserve_flag"
# The commands that start processes and pass flags on to them: `cbserve serve` (the
# whole stack) and `cbserve bench` (a stack to measure).
SERVE, BENCH = "serve", "bench"
LAUNCHERS = (SERVE, BENCH)


@dataclasses.dataclass(frozen=True)
class FlagSpec:
    help: str
    # The flag's name without dashes when it is not the field's (grace_period_s: grace-period).
    name: str | None = None
    choices: tuple[Any, ...] | None = None
    # str -> value, where the annotated type's constructor is not the parser.
    parse: Callable[[str], Any] | None = None
    metavar: str | None = None
    # Older variable names still read, after the main one.
    env_aliases: tuple[str, ...] = ()
    # How --help names a default that is worked out at run time (None, a factory).
    default_help: str | None = None
    # bool: a bare `--flag` that sets True, without a `--no-flag` (the default stays False).
    switch: bool = False
    # list: one occurrence takes several values (`--request-rate 1 2 4`).
    several: bool = False
    # list: how one text (an argument or the variable) becomes its values; None: at
    # commas. A value that may hold commas itself (JSON) needs its own.
    split: Callable[[str], list[str]] | None = None
    group: str | None = None
    # Fields this one cannot be given with: both on the command line is an error, and
    # this one on the command line clears theirs from a variable (the command line wins).
    excludes: tuple[str, ...] = ()
    # The launchers (LAUNCHERS) that take this flag too and pass it on to the process
    # whose config declares it, when given: `cbserve serve --dtype int8` starts its
    # workers with --dtype int8. Declared here, so no launcher keeps a list of names.
    forwarded_by: tuple[str, ...] = ()
    # Passed on through its variable, never on a command line, which any user of the
    # host can read (ps, /proc/PID/cmdline): API keys.
    secret: bool = False

    def __post_init__(self) -> None:
        unknown = set(self.forwarded_by) - set(LAUNCHERS)
        if unknown:
            raise ValueError(f"forwarded_by names unknown launchers {sorted(unknown)}")


def flag(default: Any = dataclasses.MISSING, *, help: str, default_factory=None, **spec) -> Any:
    """A dataclass field that is also a command-line flag; `spec` is FlagSpec's fields."""
    metadata = {_METADATA_KEY: FlagSpec(help=help, **spec)}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class Flag:
    """One flag field of a config dataclass, with everything argparse needs."""

    field: dataclasses.Field
    spec: FlagSpec
    kind: type  # the scalar type (the element type of a list)
    is_list: bool
    env_prefix: str

    @property
    def name(self) -> str:
        return self.spec.name or self.field.name.replace("_", "-")

    @property
    def option(self) -> str:
        return "--" + self.name

    @property
    def dest(self) -> str:
        # What argparse would call it, so that parsed namespaces read as before.
        return self.name.replace("-", "_")

    @property
    def env(self) -> str:
        return self.env_prefix + self.name.upper().replace("-", "_")

    @property
    def env_names(self) -> tuple[str, ...]:
        return (self.env, *self.spec.env_aliases)

    def default(self) -> Any:
        if self.field.default is not dataclasses.MISSING:
            return self.field.default
        if self.is_list:
            return self.field.default_factory()
        # Any other default_factory runs in the dataclass, when no flag gave a value.
        return None


def flags_of(cls: type, only: Iterable[str] | None = None) -> list[Flag]:
    """The flag fields of cls in declaration order (only those named, when `only`)."""
    hints = typing.get_type_hints(cls)
    wanted = None if only is None else set(only)
    found = []
    for field in dataclasses.fields(cls):
        spec = field.metadata.get(_METADATA_KEY)
        if spec is None or (wanted is not None and field.name not in wanted):
            continue
        kind, is_list = _scalar_type(hints[field.name])
        found.append(Flag(field, spec, kind, is_list, cls.ENV_PREFIX))
    missing = (wanted or set()) - {each.field.name for each in found}
    if missing:
        raise TypeError(f"{cls.__name__} has no flag fields {sorted(missing)}")
    return found


def forwarded_flags(cls: type, launcher: str) -> tuple[str, ...]:
    """The names of cls's flag fields that `launcher` takes and passes on."""
    return tuple(each.field.name for each in flags_of(cls) if launcher in each.spec.forwarded_by)


def _scalar_type(hint: Any) -> tuple[type, bool]:
    args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return _scalar_type(args[0])
    if typing.get_origin(hint) is list:
        return args[0], True
    return hint, False
