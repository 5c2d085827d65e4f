"""A check for a package's public exports (the way httpx tests its `__all__`)."""

from __future__ import annotations

import inspect
from types import ModuleType


def assert_exports(package: ModuleType, expected: set[str]) -> None:
    """`__all__` is sorted and is exactly `expected`; every name is the package's own object;
    no class or function of the package sits in its namespace without being exported."""
    exported = list(package.__all__)
    assert exported == sorted(exported)
    assert set(exported) == expected
    prefix = package.__name__ + "."
    for name in exported:
        obj = getattr(package, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__module__.startswith(prefix), f"{name} is not defined in {prefix}*"
    unexported = {name for name, obj in vars(package).items()
                  if not name.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj))
                  and obj.__module__.startswith(prefix) and name not in expected}
    assert not unexported, f"imported into {package.__name__} but not in __all__: {unexported}"
