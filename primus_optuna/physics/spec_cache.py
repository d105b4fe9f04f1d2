"""A per-study cache of precomputed quantities (the physics estimates whole spaces in bulk).

Example::

    _context = per_spec(_Context)   # _Context(spec) built once per StudySpec object
    ctx = _context(spec)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ..spec.study import StudySpec

MAX_SPECS = 64
"""contexts kept at once (a process rarely estimates more studies; the cache is cleared beyond)"""


class _HasSpec(Protocol):
    spec: Any


C = TypeVar("C", bound=_HasSpec)


def per_spec(factory: Callable[[StudySpec], C]) -> Callable[[StudySpec], C]:
    """Wrap ``factory`` so each :class:`StudySpec` object gets one instance (keyed by identity)."""
    contexts: dict[int, C] = {}

    def get(spec: StudySpec) -> C:
        ctx = contexts.get(id(spec))
        if ctx is None or ctx.spec is not spec:
            if len(contexts) > MAX_SPECS:
                contexts.clear()
            ctx = contexts[id(spec)] = factory(spec)
        return ctx

    return get
