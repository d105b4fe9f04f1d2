"""Model dicts shared by the validation tests."""

from __future__ import annotations

from typing import Any


def gpt_model(hidden: int, layers: int, heads: int) -> dict[str, Any]:
    """GPT-3-style model of Korthikanti et al. 2022 and Narayanan et al. 2021: GeLU MLP (4h), LayerNorm,
    learned positions, vocab 51200, tied embeddings."""
    return {
        "name": f"gpt-{hidden}",
        "num_layers": layers,
        "hidden_size": hidden,
        "ffn_hidden_size": 4 * hidden,
        "num_attention_heads": heads,
        "vocab_size": 51200,
        "swiglu": False,
        "untie_embeddings_and_output_weights": False,
        "normalization": "LayerNorm",
        "position_embedding_type": "learned_absolute",
    }
