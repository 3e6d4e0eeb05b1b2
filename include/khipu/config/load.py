"""Loading sections from the environment and the settings file; what ``khipu settings`` shows.

Sources, strongest first: the environment, then the settings file named by ``KHIPU_SETTINGS_FILE`` (a
dotenv file: ``KHIPU_X=value`` lines, ``#`` comments), then the defaults declared in
:mod:`khipu.config.model`. An empty variable counts as unset. A bad value raises the caller's
:class:`~khipu.errors.InvalidSetting` subclass naming the variable, the value (a secret's never) and what is
expected. Loading reads text and computes paths; it never connects to anything.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import DotEnvSettingsSource, EnvSettingsSource
from pydantic_settings.sources import PydanticBaseSettingsSource

from khipu.config.model import SECTIONS, Expect, Masked, Section, SettingConflict
from khipu.errors import InvalidSetting

SETTINGS_FILE_VARIABLE = "KHIPU_SETTINGS_FILE"

S = TypeVar("S", bound=Section)


class SettingsError(InvalidSetting):
    """An environment setting is invalid; names the variable, the value and what is allowed."""

    kind = "environment setting"


class Source(StrEnum):
    DEFAULT = "default"
    ENVIRONMENT = "environment"
    FILE = "file"


class _Given(EnvSettingsSource):
    """The environment source over a given mapping (``os.environ`` unless a caller passes its own)."""

    def __init__(self, section: type[Section], environ: Mapping[str, str]) -> None:
        self._given = environ
        super().__init__(section)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {name: value for name, value in self._given.items() if value != ""}


def settings_file(environ: Mapping[str, str] | None = None) -> Path | None:
    """The settings file ``KHIPU_SETTINGS_FILE`` names (unset or empty: none); it must exist."""
    env = os.environ if environ is None else environ
    raw = env.get(SETTINGS_FILE_VARIABLE, "")
    if not raw:
        return None
    path = Path(raw).expanduser()
    if not path.is_file():
        raise SettingsError(SETTINGS_FILE_VARIABLE, raw, "an existing file of KHIPU_X=value lines")
    return path


@dataclass(frozen=True, slots=True)
class Loaded:
    """A section as loaded, and where each of its variables came from."""

    section: Section
    sources: Mapping[str, Source]  # variable -> where its value came from


def _sources(section: type[Section], environ: Mapping[str, str]) -> tuple[PydanticBaseSettingsSource, ...]:
    path = settings_file(environ)
    given = _Given(section, environ)
    if path is None:
        return (given,)
    return given, DotEnvSettingsSource(section, env_file=path, dotenv_filtering="only_existing")


def load_with_sources(
    section: type[S], environ: Mapping[str, str] | None = None, error: type[InvalidSetting] = SettingsError
) -> tuple[S, dict[str, Source]]:
    """The section from the environment (``os.environ`` unless given) and the settings file, with each
    variable's source; a bad value raises ``error`` naming its variable."""
    env = os.environ if environ is None else environ
    try:
        given, *from_file = _sources(section, env)
    except InvalidSetting as exc:
        raise error(exc.setting, exc.value, exc.expected) from None
    values: dict[str, Any] = {}
    sources: dict[str, Source] = {variable: Source.DEFAULT for variable in variables(section)}
    for source, kind in [*((file, Source.FILE) for file in from_file), (given, Source.ENVIRONMENT)]:
        found = source()  # the environment last: it overrides the file
        values.update(found)
        sources.update({variable: kind for variable in found})
    try:
        return section.model_validate(values), sources
    except ValidationError as exc:
        raise _named(section, exc, error) from None


def load(section: type[S], environ: Mapping[str, str] | None = None, error: type[InvalidSetting] = SettingsError) -> S:
    """The section from the environment and the settings file; see :func:`load_with_sources`."""
    return load_with_sources(section, environ, error)[0]


def variables(section: type[Section]) -> dict[str, str]:
    """variable -> field name, in declaration order."""
    return {str(field.validation_alias): name for name, field in section.model_fields.items()}


def _field_by_variable(section: type[Section], variable: str) -> FieldInfo:
    return section.model_fields[variables(section)[variable]]


def expected(field: FieldInfo) -> str:
    """What a field's value must be, in words."""
    for marker in field.metadata:
        if isinstance(marker, Expect):
            return marker.text
    annotation = getattr(field.annotation, "__name__", str(field.annotation))
    return f"a value of type {annotation}"


def masked(field: FieldInfo) -> Masked | None:
    return next((marker for marker in field.metadata if isinstance(marker, Masked)), None)


def _named(section: type[Section], exc: ValidationError, error: type[InvalidSetting]) -> InvalidSetting:
    """The first problem of a failed validation, as ``error`` naming the variable."""
    problem = exc.errors()[0]
    cause = (problem.get("ctx") or {}).get("error")
    if isinstance(cause, SettingConflict):
        return error(cause.variable, cause.value, cause.expected)
    by_name = {name: variable for variable, name in variables(section).items()}
    where = str(problem["loc"][0]) if problem["loc"] else "<section>"
    variable = by_name.get(where, where)  # a default is validated under its field's name
    field = _field_by_variable(section, variable) if variable in variables(section) else None
    value = problem.get("input")
    if field is not None and masked(field) is not None and isinstance(value, str):
        value = f"<{len(value)} characters, not shown>"  # a secret is never echoed
    return error(variable, value, expected(field) if field is not None else problem["msg"])


# -- what ``khipu settings`` shows ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Shown:
    """One variable as ``khipu settings`` shows it: its effective value (secrets masked) and its source."""

    section: str
    variable: str
    value: str  # "" when unset and without a default
    source: Source
    secret: bool
    description: str


def shown_value(field: FieldInfo, value: object) -> str:
    if value is None:
        return ""
    text = str(value)
    mask = masked(field)
    return mask.show(text) if mask is not None else text


def effective_settings(environ: Mapping[str, str] | None = None) -> list[Shown]:
    """Every variable of every section with its effective value and where it came from. A bad value raises
    :class:`SettingsError` naming it."""
    shown: list[Shown] = []
    for section in SECTIONS:
        loaded, sources = load_with_sources(section, environ)
        for variable, name in variables(section).items():
            field = section.model_fields[name]
            shown.append(
                Shown(
                    section.title,
                    variable,
                    shown_value(field, getattr(loaded, name)),
                    sources[variable],
                    masked(field) is not None,
                    field.description or "",
                )
            )
    return shown


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """``KHIPU_*`` names set in the environment or the settings file that no section declares (a typo?)."""
    env = os.environ if environ is None else environ
    known = {variable for section in SECTIONS for variable in variables(section)} | {SETTINGS_FILE_VARIABLE}
    names: set[str] = {name for name in env if name.startswith("KHIPU_")}
    path = settings_file(env)
    if path is not None:
        from dotenv import dotenv_values

        names |= {name for name in dotenv_values(path) if name.startswith("KHIPU_")}
    return sorted(names - known)


# -- the documentation's lists --------------------------------------------------------------------------------


def _declared_default(field: FieldInfo) -> str:
    if field.default_factory is not None or field.get_default() is None:
        return ""  # computed at load, or unset: the description says what stands in
    return str(field.get_default())


def markdown_table(sections: Iterable[type[Section]] = SECTIONS) -> str:
    """docs/settings.md's table: every variable with its default and meaning, by section."""
    lines = ["| Variable | Default | Meaning |", "| --- | --- | --- |"]
    for section in sections:
        where = f" ([{section.doc.split('#')[0]}]({_link(section.doc)}))" if section.doc else ""
        lines.append(f"| **{section.title}**{where} | | |")
        for variable, name in variables(section).items():
            field = section.model_fields[name]
            value = _declared_default(field)
            mask = masked(field)
            secret = f" {mask.note}" if mask is not None else ""
            shown = f"`{value}`" if value else ""
            meaning = (field.description or "").replace("|", r"\|").replace("<", "&lt;")
            lines.append(f"| `{variable}` | {shown} | {meaning}{secret} |")
    return "\n".join(lines) + "\n"


def _link(doc: str) -> str:
    return doc.removeprefix("docs/")


def readme_list(sections: Iterable[type[Section]] = SECTIONS) -> str:
    """The README's list of every variable by section (the table in docs/settings.md says more)."""
    lines = []
    for section in sections:
        names = ", ".join(f"`{variable}`" for variable in variables(section))
        lines.append(f"- {section.title}: {names}" + (f" ([{section.doc}]({section.doc}))" if section.doc else ""))
    return "\n".join(lines) + "\n"


def variable_names(sections: Iterable[type[Section]] = SECTIONS) -> list[str]:
    return [variable for section in sections for variable in variables(section)]
