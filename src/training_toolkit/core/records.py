"""Frozen records for the agent's events, actions and state: dataclass-like, without dataclasses' cost.

Every ``train`` runs in the agent, the single host's included, so what the
agent's modules define is on the launch path: ``dataclasses`` imports
``inspect`` and compiles three methods per class with ``exec``, about 30 ms for
the agent's forty-odd classes on a loaded machine.  ``record`` builds the same
behaviour (keyword or positional construction with defaults, frozen, equality
by type and fields, hash, repr) from closures, in microseconds.

    @record
    class LocalExit:
        name: str
        at: float | None = None

``uncompared`` names fields that equality and hash ignore (a time stamp that
is not part of an event's identity).  ``replace(obj, **changes)`` is
``dataclasses.replace``.
"""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")
_MISSING = object()


def record(cls: type[T] | None = None, *, uncompared: tuple[str, ...] = ()):
    def build(cls: type[T]) -> type[T]:
        names: list[str] = []
        for klass in reversed(cls.__mro__):  # a subclass's fields come after its bases'
            for name in klass.__dict__.get("__annotations__", {}):
                if name not in names and not name.startswith("_"):
                    names.append(name)
        defaults = {name: cls.__dict__[name] for name in names if name in cls.__dict__}
        fields = tuple(names)
        compared = tuple(name for name in fields if name not in uncompared)

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if len(args) > len(fields):
                raise TypeError(f"{cls.__name__} takes at most {len(fields)} arguments, got {len(args)}")
            values = dict(zip(fields, args))
            for name, value in kwargs.items():
                if name not in fields:
                    raise TypeError(f"{cls.__name__} has no field {name!r}")
                if name in values:
                    raise TypeError(f"{cls.__name__} got {name!r} twice")
                values[name] = value
            for name in fields:
                value = values.get(name, defaults.get(name, _MISSING))
                if value is _MISSING:
                    raise TypeError(f"{cls.__name__} needs {name!r}")
                object.__setattr__(self, name, value)

        def __setattr__(self, name: str, value: Any) -> None:
            raise AttributeError(f"{cls.__name__} is frozen: cannot set {name!r}")

        def key(self) -> tuple:
            return tuple(getattr(self, name) for name in compared)

        def __eq__(self, other: object) -> bool:
            return type(other) is type(self) and key(self) == key(other)

        def __hash__(self) -> int:
            return hash((type(self).__name__, key(self)))

        def __repr__(self) -> str:
            return f"{cls.__name__}({', '.join(f'{name}={getattr(self, name)!r}' for name in fields)})"

        for name, method in (("__init__", __init__), ("__setattr__", __setattr__), ("__eq__", __eq__),
                             ("__hash__", __hash__), ("__repr__", __repr__)):
            method.__qualname__ = f"{cls.__qualname__}.{name}"
            setattr(cls, name, method)
        def __delattr__(self, name: str) -> None:
            raise AttributeError(f"{cls.__name__} is frozen: cannot delete {name!r}")

        cls.__delattr__ = __delattr__  # type: ignore[assignment]
        cls._fields = fields  # type: ignore[attr-defined]
        return cls

    return build if cls is None else build(cls)


def replace(obj: T, **changes: Any) -> T:
    """A copy of a record with some fields changed."""
    fields = type(obj)._fields  # type: ignore[attr-defined]
    unknown = set(changes) - set(fields)
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no field {', '.join(sorted(unknown))}")
    return type(obj)(**{name: changes.get(name, getattr(obj, name)) for name in fields})
