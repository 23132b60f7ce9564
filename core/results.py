"""Result dataclasses as JSON, and their provenance: one helper instead of a hand-written pair per class.

A frozen result dataclass inherits `JsonResult` and gets `to_json()` / `from_json()` from its own
field annotations:

    @dataclass(frozen=True)
    class ClusterMetrics(JsonResult):
        k: int
        ari: float
        composition: dict[int, dict[str, int]]

- numpy arrays become nested lists and come back as float64 arrays, or in the field's
  `metadata={"dtype": "int64"}`; numpy and torch scalars become Python numbers;
- tuples, lists, dicts (int keys written as strings and read back as ints), Optional, nested
  result dataclasses and `Path` are followed through the annotations;
- a field missing from older JSON takes its default, so adding a field with a default keeps old
  files readable.

A class whose JSON is not its fields (a renamed key, a derived value) overrides the two methods.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Mapping, Union

import numpy as np

import core

# Packages whose versions can change HeadLab's numbers or figures.
VERSIONED_PACKAGES = ("torch", "transformers", "transformer-lens", "numpy", "scipy", "scikit-learn", "plotly")


def package_versions() -> dict:
    """Versions that can change the numbers, read from package metadata (no heavy import)."""
    out = {"headlab": core.__version__}
    for package in VERSIONED_PACKAGES:
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "absent"
    return out


def provenance(**fields: Any) -> dict:
    """A provenance record: the caller's fields (None dropped) plus package versions."""
    out = {key: value for key, value in fields.items() if value is not None}
    out["versions"] = package_versions()
    return out


def jsonable(value: Any) -> Any:
    """`value` as plain JSON types: dataclasses by their to_json, arrays as lists, keys as strings."""
    if hasattr(value, "to_json") and not isinstance(value, type):
        return value.to_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value) if isinstance(value, (set, frozenset)) else value
        return [jsonable(item) for item in items]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist"):  # numpy arrays and scalars, torch tensors
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return value


def json_default(obj: Any) -> Any:
    """`default=` for json.dumps: whatever `jsonable` can turn into plain types."""
    converted = jsonable(obj)
    if converted is obj:
        raise TypeError(f"cannot write {type(obj).__name__} as JSON")
    return converted


def dumps(obj: Any, **kwargs: Any) -> str:
    """json.dumps that understands result dataclasses, numpy and torch values."""
    return json.dumps(obj, default=json_default, **kwargs)


def from_jsonable(hint: Any, value: Any, dtype: str | None = None) -> Any:
    """Read `value` back as the annotated type `hint` (the inverse of `jsonable`)."""
    if value is None:
        return None
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (Union, types.UnionType):
        options = [arg for arg in args if arg is not type(None)]
        return from_jsonable(options[0], value, dtype) if len(options) == 1 else value
    if hint is np.ndarray:
        return np.asarray(value, dtype=dtype or np.float64)
    if isinstance(hint, type) and hasattr(hint, "from_json"):
        return hint.from_json(value)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_jsonable(args[0], item) for item in value)
        if args:
            return tuple(from_jsonable(arg, item) for arg, item in zip(args, value))
        return tuple(value)
    if origin in (list, typing.Sequence) or hint is list:
        return [from_jsonable(args[0], item) if args else item for item in value]
    if origin in (dict, typing.Mapping) or hint is dict:
        key_type, item_type = args if args else (str, Any)
        return {from_jsonable(key_type, key): from_jsonable(item_type, item) for key, item in value.items()}
    if origin in (frozenset, set):
        return origin(from_jsonable(args[0], item) if args else item for item in value)
    if hint in (int, float, str, bool):
        return hint(value)
    if hint is Path:
        return Path(value)
    return value


class JsonResult:
    """Mixin for result dataclasses: `to_json()` / `from_json()` from the field annotations."""

    def to_json(self) -> dict:
        return {f.name: jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]):
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            if f.name in data:
                kwargs[f.name] = from_jsonable(hints.get(f.name, Any), data[f.name], f.metadata.get("dtype"))
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise KeyError(f"{cls.__name__} JSON lacks the field '{f.name}'")
        return cls(**kwargs)
