"""Primus's ``${NAME}`` / ``${NAME:default}`` values, resolved as Primus's own YAML loader resolves them.

AMD's example experiments write values as environment templates
(``max_position_embeddings: ${PRIMUS_MAX_POSITION_EMBEDDINGS:4096}``). Primus resolves every string of a
YAML document when it loads it (``primus/core/config/yaml_loader.py``@fd1eeabb, ``parse_yaml``:18-25, used
for experiments through ``primus/core/utils/yaml_utils.py``@fd1eeabb:12-16, 43-44):

- the pattern is ``\\${([^:{}]+)(?::([^}]*))?}`` (yaml_loader.py:12), anywhere in a string, any number of times;
- ``${NAME}`` takes the environment variable and fails when it is not set (yaml_loader.py:93-97);
  ``${NAME:default}`` takes the variable, else the default (yaml_loader.py:99-100);
- a string in which something was substituted becomes a bool (``true``/``false``, any case), an int
  (``-?\\d+``), a float (the FLOAT_PATTERN of yaml_loader.py:14) or stays a string (``_try_scalar``,
  yaml_loader.py:106-128): ``null`` stays the string ``"null"``; a string without a template is unchanged
  (yaml_loader.py:102-103);
- only values are resolved, never keys (yaml_loader.py:41-48), and each file before its ``extends`` are merged
  (yaml_loader.py:23-24).

primus-optuna resolves with these rules wherever it reads or compares an experiment's value, and writes the
templates back as they were where Primus resolves them itself (the overlay a Primus launch loads).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from ..errors import SpecError

ENV_PATTERN = re.compile(r"\${([^:{}]+)(?::([^}]*))?}")
"""Primus's template pattern (yaml_loader.py@fd1eeabb:12)."""
FLOAT_PATTERN = re.compile(r"^-?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)$")
"""What Primus turns into a float after a substitution (yaml_loader.py@fd1eeabb:14)."""
_INT = re.compile(r"-?\d+")
_BOOL = {"true": True, "false": False}


def has_template(value: Any) -> bool:
    """Whether ``value`` (or anything inside it) holds a ``${...}`` template that Primus would resolve."""
    if isinstance(value, str):
        return ENV_PATTERN.search(value) is not None
    if isinstance(value, Mapping):
        return any(has_template(v) for v in value.values())
    if isinstance(value, list):
        return any(has_template(v) for v in value)
    return False


def _scalar(text: str) -> Any:
    """A substituted string as Primus types it (``_try_scalar``, yaml_loader.py@fd1eeabb:106-128)."""
    if text.lower() in _BOOL:
        return _BOOL[text.lower()]
    if _INT.fullmatch(text):
        return int(text)
    if FLOAT_PATTERN.fullmatch(text):
        return float(text)
    return text


def _key(where: str, key: Any) -> str:
    return f"{where}{key}" if not where or where.endswith((" ", ":")) else f"{where}.{key}"


def resolve_primus_env(value: Any, environ: Mapping[str, str] | None = None, *, where: str = "") -> Any:
    """``value`` with every template resolved as Primus resolves it, in ``environ`` (default: this process's
    environment). ``where`` names the value in the error raised for a ``${NAME}`` whose variable is unset
    (Primus refuses the file then: yaml_loader.py@fd1eeabb:93-97)."""
    env = os.environ if environ is None else environ
    if isinstance(value, Mapping):
        return {k: resolve_primus_env(v, env, where=_key(where, k)) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_primus_env(v, env, where=f"{where}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if default is not None:
            return env.get(name, default)
        if name not in env:
            raise SpecError(
                f"{where or 'value'}: {m.group(0)} needs the environment variable {name}, which is not set "
                f"(Primus refuses the file then, primus/core/config/yaml_loader.py@fd1eeabb:93-97); set {name} "
                f"(runner.options.env for a launch) or write a default: ${{{name}:default}}"
            )
        return env[name]

    replaced = ENV_PATTERN.sub(sub, value)
    return _scalar(replaced) if replaced != value else replaced
