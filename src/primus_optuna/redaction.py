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
