"""Personal data out of logs: :class:`PIIScrubber` replaces it with ``[LABEL]`` placeholders."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_RULES", "PIIRule", "PIIScrubber", "scrub_value"]


def _luhn(text: str) -> bool:
    """Whether the digits of ``text`` pass the Luhn checksum of payment card numbers."""
    digits = [int(c) for c in text if c.isdigit()]
    total = sum(d if i % 2 == 0 else (d * 2 - 9 if d > 4 else d * 2) for i, d in enumerate(reversed(digits)))
    return total % 10 == 0


def _phone_like(text: str) -> bool:
    """Whether a match has a phone number's digit count (dates and versions have fewer)."""
    digits = sum(c.isdigit() for c in text)
    return 9 <= digits <= 15 or (text.lstrip().startswith(("+", "(")) and 7 <= digits <= 15)


def _ipv6_like(text: str) -> bool:
    """Whether a compressed match looks like an address rather than a scope (``a::b``)."""
    return any(len(group) >= 3 for group in text.split(":"))


@dataclass(frozen=True)
class PIIRule:
    """One kind of personal data: a pattern, an optional check on each match, a placeholder label."""

    label: str
    pattern: re.Pattern[str]
    check: Callable[[str], bool] | None = None

    def replacement(self, match: re.Match[str]) -> str:
        """Return the placeholder for ``match``, or the match itself when the check rejects it."""
        return match.group(0) if self.check and not self.check(match.group(0)) else f"[{self.label}]"


_HEX = "[0-9A-Fa-f]{1,4}"
DEFAULT_RULES: tuple[PIIRule, ...] = (
    PIIRule("EMAIL", re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")),
    PIIRule("CARD", re.compile(r"(?<![\d-])(?:\d[ -]?){12,18}\d(?![\d-])"), _luhn),
    PIIRule("IP", re.compile(r"(?<![\d.])(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}"
                             r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?![\d.])")),
    PIIRule("IP", re.compile(rf"(?<![\w:])(?:(?:{_HEX}:){{7}}{_HEX}|(?:{_HEX}:){{1,7}}:(?:{_HEX}(?::{_HEX}){{0,6}})?"
                             rf"|::(?:{_HEX}(?::{_HEX}){{0,6}})?)(?![\w:])"), _ipv6_like),
    PIIRule("PHONE", re.compile(r"(?<![\w+])(?:\+\d{1,3}[\s.-]?)?(?:\(\d{1,4}\)[\s.-]?)?\d{1,4}(?:[\s.-]\d{2,4}){1,5}"
                                r"(?![\w:-])|\+\d{7,15}(?!\d)"), _phone_like),
)
"""E-mail addresses, card numbers (Luhn-checked), IPv4/IPv6 addresses and phone numbers, in order."""


class PIIScrubber:
    """Replace personal data in text with ``[LABEL]`` placeholders.

    Args:
        rules: the rules to apply, in order (cards before phones: a card number has a
            phone-like shape).
        extra: more patterns, ``{label: regex}``, applied after ``rules`` (names, IDs, …).

    """

    def __init__(self, rules: Iterable[PIIRule] = DEFAULT_RULES, *, extra: Mapping[str, str] | None = None) -> None:
        self.rules = [*rules, *(PIIRule(label, re.compile(regex)) for label, regex in (extra or {}).items())]

    def __call__(self, text: str) -> str:
        """Return ``text`` with every match of every rule replaced by its placeholder."""
        for rule in self.rules:
            text = rule.pattern.sub(rule.replacement, text)
        return text

    def scrub(self, value: Any) -> Any:
        """Scrub every string inside ``value`` (dicts, lists and tuples are walked)."""
        return scrub_value(value, self)


def scrub_value(value: Any, scrubber: Callable[[str], str]) -> Any:
    """Apply ``scrubber`` to every string inside ``value``."""
    if isinstance(value, str):
        return scrubber(value)
    if isinstance(value, Mapping):
        return {key: scrub_value(item, scrubber) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub_value(item, scrubber) for item in value]
    return value


