"""Keep secrets out of everything primus-optuna writes (storage, notes, artifacts, reports, logs).

API keys only ever come from the environment. :func:`redact` replaces, in any text:

- the value of every secret-looking environment variable (a name with a ``KEY``, ``TOKEN``, ``SECRET``,
  ``PASSWORD``/``PASSWD`` or ``CREDENTIAL`` part, e.g. ``WANDB_API_KEY``, ``HF_TOKEN``; not
  ``TOKENIZERS_PARALLELISM``), of the variables named in ``names`` and any literal in ``values``, when the
  value has at least 6 characters and is not a plain number;
- the password of every URL (``postgresql://u:pw@host/db`` -> ``postgresql://u:***@host/db``).

Example::

    redact("key=sk-123456", values=["sk-123456"])  # 'key=[redacted]'
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

SECRET_ENV = re.compile(r"(^|_)(API_?KEY|KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)(_|$)", re.IGNORECASE)
MIN_SECRET_CHARS = 6
MASK = "[redacted]"
# SQLAlchemy's reading of a URL: the user part runs to the first ':' (it may hold '@'), the password to the
# next '@' (it may hold '/')
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/\s'\"]*):(?P<pw>[^@\s'\"]+)@")


def looks_secret(name: str) -> bool:
    """Whether a variable name (``WANDB_API_KEY``, ``HF_TOKEN``, ...) looks like it holds a credential."""
    return bool(SECRET_ENV.search(name))


def _is_secret_value(value: str | None) -> bool:
    return bool(value) and len(value) >= MIN_SECRET_CHARS and not value.strip().isdigit()  # type: ignore[arg-type]


def secret_values(names: Iterable[str] = ()) -> list[str]:
    """The values of secret-looking environment variables and of ``names``, longest first."""
    wanted = set(names)
    vals = {v for k, v in os.environ.items() if _is_secret_value(v) and (looks_secret(k) or k in wanted)}
    return sorted(vals, key=len, reverse=True)


def redact_url(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``."""
    return _URL_PASSWORD.sub(lambda m: f"{m.group('head')}:***@", text)


def redact(text: str, *, names: Iterable[str] = (), values: Iterable[str | None] = ()) -> str:
    """``text`` with every secret value replaced by ``[redacted]`` and every URL password by ``***``."""
    literal = {v for v in values if _is_secret_value(v)}
    for secret in sorted({*secret_values(names), *literal}, key=len, reverse=True):  # type: ignore[arg-type]
        text = text.replace(secret, MASK)
    return redact_url(text)


def redact_data(data: Any, **kwargs: Any) -> Any:
    """:func:`redact` applied to every string inside nested dicts/lists (numbers and keys untouched)."""
    if isinstance(data, str):
        return redact(data, **kwargs)
    if isinstance(data, dict):
        return {k: redact_data(v, **kwargs) for k, v in data.items()}
    if isinstance(data, list):
        return [redact_data(v, **kwargs) for v in data]
    return data
