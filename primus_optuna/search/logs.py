"""The library's loggers, under Optuna's: ``get_logger(__name__)`` is ``optuna.primus_optuna.<module>``, so
``optuna.logging.set_verbosity`` sets its level and Optuna's one handler prints each message once
(optuna/logging.py: the library root logger ``optuna`` holds the handler and does not propagate)."""

from __future__ import annotations

import logging

import optuna

__all__ = ["get_logger"]


def get_logger(name: str) -> logging.Logger:
    """The logger of module ``name``, a child of Optuna's library root logger."""
    return optuna.logging.get_logger(f"optuna.{name}")
