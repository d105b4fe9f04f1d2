"""The nearest legal (and fitting) configuration to a reference: :class:`Nearest`, over the study's legal
configurations as code arrays (built once per space). Used to centre and repair the sweep, to complete a
partial ``enqueue_trial`` and to map a plain sampler's illegal suggestion.

Distance, in order: fewest parallelism (non memory-lever) axes moved, fewest axes moved, smallest steps in the
candidate lists; ties go to the higher ``score``, then the configuration key (deterministic).

Example::

    Nearest(space).nearest(config, fits=lambda c: True, score=None, fixed=("tp",))
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..space import Space, TrainingConfig
from ..spec.study import AXES

Score = Callable[[TrainingConfig], "float | None"]
"""Expected tokens/s/GPU of a configuration, or ``None`` when it does not fit in memory."""
MEMORY_LEVERS = ("recompute", "mbs")
"""axes that trade speed for memory without changing the parallel layout: moved first to make a point fit"""


class Nearest:
    """Legal configurations as code arrays, for "nearest fitting configuration" searches."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self.configs = space.configs()
        self.codes = np.array(
            [[space.candidates[a].index(getattr(c, a)) for a in AXES] for c in self.configs], dtype=np.int16
        )
        self.lever = np.array([a in MEMORY_LEVERS for a in AXES])

    def code(self, config: TrainingConfig) -> np.ndarray:
        cands = self.space.candidates
        return np.array(
            [cands[a].index(getattr(config, a)) if getattr(config, a) in cands[a] else -99 for a in AXES]
        )

    def nearest(
        self,
        ref: TrainingConfig,
        fits: Callable[[TrainingConfig], bool],
        score: Score | None,
        *,
        fixed: str | tuple[str, ...] | None = None,
        max_moves: int | None = None,
    ) -> TrainingConfig | None:
        """The fitting legal configuration nearest to ``ref`` (keeping the ``fixed`` axes at ``ref``'s values)."""
        r = self.code(ref)
        diff = self.codes != r
        mask = np.ones(len(self.configs), dtype=bool)
        for axis in (fixed,) if isinstance(fixed, str) else (fixed or ()):
            j = AXES.index(axis)
            mask &= self.codes[:, j] == r[j]
            diff[:, j] = False
        moves = diff.sum(axis=1)
        if max_moves is not None:
            mask &= moves <= max_moves
        steps = np.where(r >= 0, np.abs(self.codes - r), 3).sum(axis=1)
        parallel = (diff & ~self.lever).sum(axis=1)
        idx = np.flatnonzero(mask)
        order = idx[np.lexsort((steps[idx], moves[idx], parallel[idx]))]
        best: tuple[tuple[int, int, int], float, str, TrainingConfig] | None = None
        for i in order:
            rank = (int(parallel[i]), int(moves[i]), int(steps[i]))
            if best is not None and rank != best[0]:
                break  # ties broken by the estimate; nothing nearer remains
            c = self.configs[i]
            if not fits(c):
                continue
            s = (score(c) or 0.0) if score is not None else 0.0
            if best is None or (-s, c.key()) < (-best[1], best[2]):
                best = (rank, s, c.key(), c)
        return best[3] if best is not None else None
