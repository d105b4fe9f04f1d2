"""The package re-exports its public names; heavy ones load lazily."""

import subprocess
import sys

import primus_optuna


def test_every_public_name_resolves():
    for name in primus_optuna.__all__:
        assert getattr(primus_optuna, name) is not None, name


def test_import_is_light():
    code = (
        "import sys, primus_optuna; "
        "print(','.join(m for m in ('optuna', 'dspy', 'litellm', 'torch') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == ""


def test_unknown_name_is_an_attribute_error():
    try:
        primus_optuna.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")
