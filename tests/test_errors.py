"""The error tree: each class has its own status, code and number, and one body shape."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import sandbank
from sandbank.errors import SandbankError, error_classes


def test_codes_and_numbers_are_unique_and_every_class_has_a_status() -> None:
    classes = error_classes()
    codes = [c.code for c in classes]
    numbers = [c.number for c in classes]
    assert len(set(codes)) == len(codes), codes
    assert len(set(numbers)) == len(numbers), numbers
    for cls in classes:
        assert 400 <= cls.status < 600, cls
        assert "code" in vars(cls) and "number" in vars(cls), f"{cls.__name__} inherits its code"


def test_every_public_class_of_the_package_has_a_docstring() -> None:
    missing = []
    for info in pkgutil.walk_packages(sandbank.__path__, "sandbank."):
        if ".inside." in info.name or info.name.endswith("migrations.env"):
            continue  # in-sandbox code imports as another package; alembic's entry point
        if "versions" in info.name:
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and obj.__module__ == module.__name__
                and not name.startswith("_")
                and not (obj.__doc__ or "").strip()
            ):
                missing.append(f"{module.__name__}.{name}")
    assert missing == [], missing


def test_the_root_error_is_internal() -> None:
    assert (SandbankError.status, SandbankError.code, SandbankError.number) == (
        500,
        "internal",
        1000,
    )
