"""Strict integers for every study-file section: YAML's ``true``, ``"8192"`` or ``8192.0`` is not a size.

Pydantic's lax mode would read ``seq_length: true`` as 1; :class:`StrictIntModel` refuses a bool, a string or
a float for a field declared ``int`` (or ``int | None``), and a bool for a field whose union has ``int`` but
no ``bool``, naming what was given.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationInfo, field_validator


def _int_kind(annotation: Any) -> str | None:
    """``"int"`` for ``int``/``int | None``, ``"union"`` for a union with ``int`` but no ``bool``, else None."""
    if annotation is int:
        return "int"
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if int not in args or bool in args:
            return None
        return "int" if all(a in (int, type(None)) for a in args) else "union"
    return None


class StrictIntModel(BaseModel):
    """Base of the study-file models: integer fields take integers only."""

    @field_validator("*", mode="before")
    @classmethod
    def _strict_ints(cls, v: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        kind = _int_kind(field.annotation) if field is not None else None
        if kind is None or v is None:
            return v
        if isinstance(v, bool) or (kind == "int" and not isinstance(v, int)):
            raise ValueError(f"must be an integer, got {v!r} ({type(v).__name__}); write a whole number")
        return v
