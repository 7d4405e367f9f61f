"""Option parsing shared by the EPs and the session config (onnxruntime passes options as strings)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .api.errors import InvalidProviderOptions

__all__ = ["as_bool", "as_choice", "as_int", "as_seconds", "as_str_list", "reject_unknown"]


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def as_bool(name: str, value: Any, what: str = "option") -> bool:
    """A flag: a bool, 0/1, or the strings onnxruntime's configs use ('1', 'true', '0', 'false', ...)."""
    text = str(value).strip().lower()
    if isinstance(value, bool) or text in _TRUE + _FALSE:
        return bool(value) if isinstance(value, bool) else text in _TRUE
    raise InvalidProviderOptions(f"{what} {name!r} must be '0' or '1' (or true/false), got {value!r}")


def as_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """One of `choices`, else an error that lists them."""
    choices = tuple(choices)
    if value not in choices:
        raise InvalidProviderOptions(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def as_int(name: str, value: Any, minimum: int = 0) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise InvalidProviderOptions(f"option {name!r} must be an integer, got {value!r}") from None
    if number < minimum:
        raise InvalidProviderOptions(f"option {name!r} must be >= {minimum}, got {number}")
    return number


def as_seconds(name: str, value: Any) -> float:
    """A positive duration in seconds (a number, or its string)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise InvalidProviderOptions(f"option {name!r} must be a number of seconds, got {value!r}") from None
    if not seconds > 0:
        raise InvalidProviderOptions(f"option {name!r} must be > 0 seconds, got {value!r}")
    return seconds


def as_str_list(name: str, value: Any) -> tuple[str, ...]:
    """A list of names, or one comma-separated string as onnxruntime's string options spell it."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    if isinstance(value, Iterable) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise InvalidProviderOptions(f"option {name!r} must be a list of strings or a comma-separated string")


def reject_unknown(ep: str, given: Iterable[str], known: Iterable[str]) -> None:
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise InvalidProviderOptions(f"{ep} does not know option(s) {unknown}; it accepts {sorted(known)}")
