"""Keep secrets out of everything primus-optuna writes (storage, notes, artifacts, reports, logs).

API keys only ever come from the environment; :func:`redact` replaces the value of every secret-looking
environment variable (name containing KEY, TOKEN, SECRET or PASSWORD, value of at least 6 characters), of the
variables named in ``names`` and any literal in ``values`` with ``[redacted]``.

Example::

    redact("key=sk-123456", values=["sk-123456"])  # 'key=[redacted]'
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

SECRET_ENV = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD)", re.IGNORECASE)
MIN_SECRET_CHARS = 6
MASK = "[redacted]"


def secret_values(names: Iterable[str] = ()) -> list[str]:
    """The values of secret-looking environment variables and of ``names``, longest first."""
    wanted = set(names)
    vals = {
        v
        for k, v in os.environ.items()
        if v and len(v) >= MIN_SECRET_CHARS and (SECRET_ENV.search(k) or k in wanted)
    }
    return sorted(vals, key=len, reverse=True)


def redact(text: str, *, names: Iterable[str] = (), values: Iterable[str | None] = ()) -> str:
    """``text`` with every secret value replaced by ``[redacted]``."""
    for secret in sorted({*secret_values(names), *(v for v in values if v)}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^/:@\s]+):(?P<pw>[^@/\s]+)@")


def redact_url(url: str) -> str:
    """A URL with its password replaced by ``***`` (``postgresql://u:pw@host/db`` -> ``postgresql://u:***@host/db``)."""
    return _URL_PASSWORD.sub(lambda m: f"{m.group('head')}:***@", url)


def looks_secret(name: str) -> bool:
    """Whether a variable name (``WANDB_API_KEY``, ``HF_TOKEN``, ...) looks like it holds a credential."""
    return bool(SECRET_ENV.search(name))
