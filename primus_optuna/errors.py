"""Error types shared by every layer.

A :class:`SpecError` is a user mistake (a bad study file, an unknown axis value, a malformed ``--config``):
the CLI prints its message alone and exits with code 2, writing nothing.
"""

from __future__ import annotations


class PrimusError(Exception):
    """Base class of every error primus-optuna raises on purpose."""


class SpecError(PrimusError, ValueError):
    """Invalid user input; the message names the field and the fix."""
