"""By-hand check (not CI: it needs the Primus and TorchTitan source trees) of ``--format primus-torchtitan``.

Every legal configuration (every k-th) of the shipped studies whose model Primus's TorchTitan backend has, run
as TorchTitan studies, is exported as a Primus TorchTitan experiment and checked against the sources Primus
fd1eeabb runs: its model YAML exists (``primus/configs/models/torchtitan/``), and the overrides, merged into
the pinned TorchTitan's ``JobConfig().to_dict()`` as Primus's argument builder does
(``primus/backends/torchtitan/argument_builder.py@fd1eeabb:35-44, 81-103``), name only fields that JobConfig has
and rebuild its section dataclasses (``torchtitan/config/job_config.py@73a0e697``), Literal fields within their
values.

    python scripts/check_primus_torchtitan.py [--primus DIR] [--torchtitan DIR] [--every K]

Needs ``torch`` and ``torchtitan`` importable (its ``tools.logging`` is the pinned file's one import besides torch).
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import types
import typing
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from primus_optuna.errors import SpecError  # noqa: E402
from primus_optuna.space import Space  # noqa: E402
from primus_optuna.space.torchtitan_args import (  # noqa: E402
    PRIMUS_TITAN_COMMIT,
    PRIMUS_TITAN_MODELS,
    primus_titan_overlay,
)
from primus_optuna.spec import StudySpec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _git_show(repo: str, rev: str, path: str) -> str:
    return subprocess.run(
        ["git", "-C", repo, "show", f"{rev}:{path}"], check=True, capture_output=True, text=True
    ).stdout


def _job_config(torchtitan: str) -> types.ModuleType:
    mod = types.ModuleType("pinned_job_config")
    sys.modules[mod.__name__] = mod  # dataclasses look their module up
    source = _git_show(torchtitan, PRIMUS_TITAN_COMMIT, "torchtitan/config/job_config.py")
    exec(compile(source, "job_config.py@73a0e697", "exec"), mod.__dict__)
    return mod


def _check(jc: types.ModuleType, overrides: dict) -> list[str]:
    """Unknown keys and out-of-Literal values of ``overrides`` against the pinned JobConfig's sections."""
    problems = []
    job = jc.JobConfig()
    for section, values in overrides.items():
        current = getattr(job, section, None)
        if current is None:
            problems.append(f"no section {section}")
            continue
        for key, value in values.items():
            if isinstance(value, dict):  # quantize.linear.float8
                sub = getattr(current, key)
                for k2, v2 in value.items():
                    problems += _check_fields(getattr(sub, k2), v2, f"{section}.{key}.{k2}")
                continue
            problems += _check_fields(current, {key: value}, section)
        merged = {
            **dataclasses.asdict(current),
            **{k: v for k, v in values.items() if not isinstance(v, dict)},
        }
        try:
            type(current)(**merged)
        except TypeError as exc:
            problems.append(f"{section}: {exc}")
    return problems


def _check_fields(obj: object, values: dict, where: str) -> list[str]:
    fields = {f.name: f for f in dataclasses.fields(obj)}
    out = []
    for key, value in values.items():
        if key not in fields:
            out.append(f"{where}.{key}: not a field")
            continue
        hint = typing.get_type_hints(type(obj)).get(key)
        options = [hint, *typing.get_args(hint)]  # Literal[...] | None too
        allowed = [v for h in options if typing.get_origin(h) is typing.Literal for v in typing.get_args(h)]
        if allowed and value not in allowed and not (value is None and type(None) in options):
            out.append(f"{where}.{key}: {value!r} not in {allowed}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--primus", default="/work/.mirror/AMD-AGI+Primus/repo")
    ap.add_argument("--torchtitan", default="/work/.mirror/pytorch+torchtitan/repo")
    ap.add_argument("--every", type=int, default=7)
    a = ap.parse_args()
    jc = _job_config(a.torchtitan)
    checked, refused, failures = 0, {}, []
    studies = []
    for path in sorted((ROOT / "studies").glob("*.yaml")):
        data = StudySpec.from_yaml(path).to_dict()
        data["runner"] = {"kind": "torchtitan"}
        studies.append(data)
        bf16 = data["workload"].get("precision", "bf16") == "bf16"
        if (
            bf16 and data["model"]["name"] in PRIMUS_TITAN_MODELS
        ):  # and its FP8 (tensorwise) form: the -fp8 YAML
            fp8 = {**data, "name": data["name"] + "-fp8-tensorwise"}
            studies.append(
                {**fp8, "workload": {**data["workload"], "precision": "fp8", "fp8_recipe": "tensorwise"}}
            )
    for data in studies:
        spec = StudySpec.from_dict(data)
        if spec.model.name not in PRIMUS_TITAN_MODELS:
            refused[spec.name] = f"model {spec.model.name} has no Primus TorchTitan YAML"
            continue
        for c in Space(spec).configs()[:: a.every]:
            try:
                doc = primus_titan_overlay(spec, c)
            except SpecError as exc:
                refused[spec.name] = str(exc)
                break
            trainer = doc["modules"]["pre_trainer"]
            model = f"primus/configs/models/torchtitan/{trainer['model']}"
            try:
                _git_show(a.primus, "fd1eeabb", model)
            except subprocess.CalledProcessError:
                failures.append(f"{spec.name}: no {model}")
            failures += [f"{spec.name} {c.key()}: {p}" for p in _check(jc, trainer["overrides"])]
            checked += 1
    print(f"checked {checked} Primus TorchTitan experiments against job_config.py@{PRIMUS_TITAN_COMMIT}")
    for name, why in refused.items():
        print(f"refused {name}: {why[:120]}")
    for f in failures[:20]:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
