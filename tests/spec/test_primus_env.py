"""Primus's ``${NAME:default}`` values resolved as its loader resolves them
(primus/core/config/yaml_loader.py@fd1eeabb:12-128)."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus_optuna.errors import SpecError
from primus_optuna.spec.primus_env import has_template, resolve_primus_env
from primus_optuna.spec.primus_import import import_primus_yaml


@pytest.mark.parametrize(
    ("text", "env", "value"),
    [
        ("${PRIMUS_MAX_POSITION_EMBEDDINGS:4096}", {}, 4096),  # the default, typed int (loader :117-118)
        ("${PRIMUS_MAX_POSITION_EMBEDDINGS:4096}", {"PRIMUS_MAX_POSITION_EMBEDDINGS": "8192"}, 8192),
        ("${PRIMUS_LR:8.0e-4}", {}, 8.0e-4),  # float (:121-125)
        ("${X:1e5}", {}, 1e5),  # a float to Primus, a string to PyYAML
        ("${X:-3}", {}, -3),
        ("${USE_TURBO_RMS_NORM:true}", {}, True),  # bool, any case (:112-114)
        ("${X:False}", {}, False),
        ("${PRIMUS_TOKENIZED_DATA_PATH:null}", {}, "null"),  # stays the string: no null rule
        ("${X:yes}", {}, "yes"),  # not a bool to Primus
        ("${PRIMUS_MODEL:deepseek_v3}.yaml", {}, "deepseek_v3.yaml"),  # inside a string
        ("${A:1}${B:2}", {}, 12),  # several, then typed as a whole
        ("${X:}", {}, ""),
        ("${X}", {"X": "7"}, 7),
        ("42", {}, "42"),  # nothing substituted: unchanged, even if numeric (:102-103)
        ("$X and {Y}", {}, "$X and {Y}"),
    ],
)
def test_values_resolve_as_primus_resolves_them(text: str, env: dict, value: object) -> None:
    out = resolve_primus_env(text, env)
    assert out == value and type(out) is type(value)


def test_only_values_are_resolved_in_mappings_and_lists() -> None:
    doc = {"${K:k}": ["${A:1}", {"b": "${B:x}"}], "n": 3}
    assert resolve_primus_env(doc, {}) == {"${K:k}": [1, {"b": "x"}], "n": 3}
    assert has_template(doc) and has_template(["a", "${B:x}"]) and not has_template({"a": "$B", "n": 1})


def test_a_variable_without_default_must_be_set() -> None:
    with pytest.raises(
        SpecError, match=r"exp: a\.b: \$\{DATA\} needs the environment variable DATA.*\$\{DATA:default\}"
    ):
        resolve_primus_env({"a": {"b": "${DATA}/x"}}, {}, where="exp: ")


def test_the_importer_reads_templates_as_primus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PRIMUS_DATA", raising=False)
    (tmp_path / "base.yaml").write_text("num_layers: ${PRIMUS_LAYERS:32}\nhidden_size: 4096\n")
    (tmp_path / "m.yaml").write_text(
        "extends: ${BASE:base}.yaml\ntrain_data_path: ${PRIMUS_TOKENIZED_DATA_PATH:null}\nlr: ${LR:1e-4}\n"
        "micro_batch_size: ${PRIMUS_MBS:2}\n"
    )
    info = import_primus_yaml(tmp_path / "m.yaml")
    assert info.model["num_layers"] == 32 and info.baseline["mbs"] == 2
    assert info.overrides["train_data_path"] == "null" and info.overrides["lr"] == 1e-4
    (tmp_path / "d.yaml").write_text("num_layers: 2\ndata_path: ${PRIMUS_DATA}\n")
    with pytest.raises(SpecError, match=r"model.primus_yaml: .*d.yaml: data_path: \$\{PRIMUS_DATA\} needs"):
        import_primus_yaml(tmp_path / "d.yaml")
