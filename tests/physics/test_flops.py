"""Layer FLOPs and attention pairs (physics/flops.py)."""

from __future__ import annotations

import pytest

from primus_optuna.physics.flops import attention_mix, causal_pairs, window_pairs
from primus_optuna.spec.model import MODEL_CATALOG


def test_window_pairs_counts_a_causal_band() -> None:
    assert window_pairs(4096) == 4096 * 4096 / 2
    assert window_pairs(4096, 128) == 4096 * 128 - 128 * 128 / 2
    assert window_pairs(100, 500) == window_pairs(100)  # a window wider than the sequence is full causal


def test_attention_mix_splits_full_and_windowed_layers() -> None:
    """GPT-OSS alternates 128-token windows and full layers (``window_attn_skip_freq`` 2): two kinds of
    attention, half the layers each; their share-weighted pairs are ``causal_pairs``. A model without windows
    has one kind."""
    oss = MODEL_CATALOG["gpt-oss-120b"]
    mix = dict((pairs, share) for share, pairs in attention_mix(oss, 4096))
    assert mix == {window_pairs(4096): pytest.approx(0.5), window_pairs(4096, 128): pytest.approx(0.5)}
    assert causal_pairs(oss, 4096) == pytest.approx(sum(p * s for p, s in mix.items()))
    llama = MODEL_CATALOG["llama3.1-8b"]
    assert attention_mix(llama, 4096) == ((1.0, window_pairs(4096)),)
    assert attention_mix(oss, 64) == ((1.0, window_pairs(64)),)  # window wider than the sequence
