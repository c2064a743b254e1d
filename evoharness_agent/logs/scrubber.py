"""Personal data and secrets out of logs: :class:`PIIScrubber` replaces them with ``[LABEL]`` placeholders.

Every pattern runs on RE2 (``google-re2``), whose matching time is linear in the text: no input
can make the scrubber backtrack. Matches are then confirmed by the libraries that know each
format: ``phonenumbers`` for phone numbers, ``python-stdnum`` for IBANs, US social security
numbers and the Luhn checksum of card numbers.

What each label covers, and the rules that keep ordinary text untouched:

* ``SECRET``: PEM private keys, passwords in URLs, JWTs, prefixed API keys and tokens (OpenAI
  ``sk-``/``sk-proj-``, AWS access key ids, GitHub ``ghp_``/``github_pat_``, GitLab ``glpat-``,
  Slack ``xox*`` and webhooks, Google ``AIza``, Stripe ``sk_live_``/``rk_live_``, Hugging Face
  ``hf_``, npm, SendGrid), ``Bearer``/``Basic`` credentials, and the value given to a secret-named
  key (``api_key=…``, ``"password": "…"``, ``aws_secret_access_key = …``). Secrets without a
  prefix or a key name (a bare AWS secret key) look like any other random string and stay.
* ``EMAIL``: addresses, internationalised ones included (``josé@exämple.de``).
* ``IBAN``: account numbers whose country format and check digits ``stdnum`` accepts.
* ``CARD``: 13 to 19 digits, grouped by spaces, double spaces, dots or dashes, starting with 2–6
  (the card networks' ranges) and passing the Luhn checksum.
* ``SSN``: ``123-45-6789``-shaped numbers (or with spaces) that ``stdnum`` accepts as US social security numbers.
* ``IP``: IPv4 (octets 0–255, not part of a longer dotted number, and not a version: not after
  ``v``/``ver``/``version``/``release``/``build``/``rev``) and IPv6 addresses.
* ``PHONE``: a number with a country code (``+49 30 12345678``, ``0049 …``) that ``phonenumbers``
  deems possible, or a national number that is valid in one of ``regions``, or, for the North
  American plan, ten digits not starting with 0 or 1 (``5551234567``, ``(555) 123-4567``). Bare
  numbers of other lengths (ids, timestamps, dates) stay.

A match must stand alone: no letter, digit or underscore touches it, nor a ``.``/``-``/``,`` that
joins it to more digits (``1.2.3.4.5`` is no address); a phone number is not joined by ``:`` or
``/`` either (``2025-01-31 12:30`` is a time), nor to letters (``ORD-2025-000123`` is an id).
"""

from __future__ import annotations

import base64
import binascii
import bisect
import dataclasses
import functools
import itertools
import logging
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import phonenumbers
import re2  # type: ignore[import-untyped]
from stdnum import iban, luhn
from stdnum.us import ssn

__all__ = ["DEFAULT_RULES", "PIIRule", "PIIScrubber", "scrub_value"]

logger = logging.getLogger(__name__)

REDACTED = "[REDACTED]"
"""What replaces a value the scrubber failed on: dropping it would lose the record, keeping it would leak."""


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a bad pattern is reported by the ValueError below, not on stderr


def _compile(pattern: Any, label: str) -> Any:
    """Compile ``pattern`` (a string or a compiled ``re`` pattern) with RE2, or say why it cannot be."""
    source = pattern
    if isinstance(pattern, re.Pattern):
        flags = "".join(letter for flag, letter in ((re.IGNORECASE, "i"), (re.DOTALL, "s"), (re.MULTILINE, "m"))
                        if pattern.flags & flag)
        source = f"(?{flags}){pattern.pattern}" if flags else pattern.pattern
    if not isinstance(source, str):
        raise TypeError(f"PII rule {label!r}: the pattern must be a string or a compiled regex, not {source!r}")
    try:
        return re2.compile(source, _RE2_OPTIONS)
    except re2.error as exc:
        raise ValueError(f"PII rule {label!r}: {exc}; patterns run on RE2 (linear time), which has no "
                         "look-around and no back-references") from exc


def _isolated(text: str, start: int, end: int, joiners: str = ".-,", words: bool = False) -> bool:
    """Whether ``text[start:end]`` stands alone: not glued to a word or, through one of ``joiners``, to digits.

    With ``words``, a joiner glues to letters too (``ORD-2025-000123`` holds no phone number).
    """
    before = text[start - 1] if start > 0 else " "
    after = text[end] if end < len(text) else " "
    if before.isalnum() or before == "_" or after.isalnum() or after == "_":
        return False
    glued = str.isalnum if words else str.isdigit
    if before in joiners and start >= 2 and glued(text[start - 2]):
        return False
    return not (after in joiners and end + 1 < len(text) and glued(text[end + 1]))


@dataclass(frozen=True)
class PIIRule:
    """One kind of personal data: an RE2 pattern, an optional check on each match, a placeholder label.

    Args:
        label: the placeholder is ``[label]``.
        pattern: a regex (string or compiled; it is compiled with RE2). When it has a group
            named ``pii``, only that group is replaced: the rest is context (``api_key=``).
            A match in which a group named ``veto`` took part is kept: context saying that
            it is not personal data (``version 1.2.3.4``).
        check: given the text to replace, whether it really is this kind of data.
        isolated: whether the match must stand alone (see the module's notes): what a
            look-around would say, which RE2 does not have.

    """

    label: str
    pattern: Any
    check: Callable[[str], bool] | None = None
    isolated: bool = False
    _regex: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Compile the pattern with RE2."""
        object.__setattr__(self, "_regex", _compile(self.pattern, self.label))

    def spans(self, text: str) -> Iterator[tuple[int, int]]:
        """Yield the ``(start, end)`` of every part of ``text`` to replace, left to right."""
        group = self._regex.groupindex.get("pii", 0)
        veto = self._regex.groupindex.get("veto")
        for match in self._regex.finditer(text):
            start, end = match.span()
            if start == end or (self.isolated and not _isolated(text, start, end)):
                continue
            if veto is not None and match.start(veto) >= 0:
                continue
            pii_start, pii_end = match.span(group)
            if pii_start < pii_end and (self.check is None or self.check(text[pii_start:pii_end])):
                yield pii_start, pii_end


class PhoneRule(PIIRule):
    """Phone numbers, found as runs of digit groups and confirmed by ``phonenumbers``.

    Args:
        regions: the regions (ISO 3166 codes) whose national numbers count without a country code.

    """

    _MAX_GROUPS = 8  # "+33 6 12 34 56 78" has 6 groups, "+1 (555) 123-45-67" 5
    regions: tuple[str, ...]
    _lengths: frozenset[int]  # the digit counts of the regions' national numbers
    _span_of_lengths: tuple[int, int]
    _is_phone: Callable[[str], bool]

    def __init__(self, regions: Sequence[str] = ("US",)) -> None:
        # A run starts at "+", "(" or a word boundary: digits inside a word (base64, ids) start none.
        super().__init__("PHONE", r"(?:\+ ?(?:\([0-9]{1,5}\) ?)?|\([0-9]{1,5}\) ?|\b)[0-9]+"
                                  r"(?:(?: ?\([0-9]{1,5}\) ?|[ .\-])[0-9]+)*")
        lengths: set[int] = set()
        for region in regions:
            metadata = phonenumbers.PhoneMetadata.metadata_for_region(region)
            if metadata is None or metadata.general_desc is None:
                raise ValueError(f"PhoneRule: {region!r} is not a region phonenumbers knows (an ISO 3166 code)")
            prefix = len(metadata.national_prefix or "")
            lengths.update(n + extra for n in metadata.general_desc.possible_length for extra in (0, prefix))
        object.__setattr__(self, "regions", tuple(regions))
        object.__setattr__(self, "_lengths", frozenset(lengths))
        object.__setattr__(self, "_span_of_lengths", (min(lengths), max(lengths)))
        # Logs repeat the same numbers; parsing one costs about a millisecond.
        object.__setattr__(self, "_is_phone", functools.lru_cache(maxsize=4096)(self._phone))

    def spans(self, text: str) -> Iterator[tuple[int, int]]:
        """Yield the span of every phone number, splitting runs such as ``555-123-4567 555-987-6543``."""
        reach = self._MAX_GROUPS
        least = min(9, self._span_of_lengths[0])  # a "00" prefix needs 9 digits; only the first group may be "+"
        for match in self._regex.finditer(text):
            offset, run = match.start(), match.group(0)
            if len(run) < 7:
                continue  # no phone number is this short: most numbers in a text end here
            parts = _NON_DIGITS.split(run)  # digits, separator, digits, …: no match object per group
            base = 2 if parts[0] == "" else 0  # a leading "+" or "("
            bounds = list(itertools.accumulate(map(len, parts), initial=offset))
            counts = list(itertools.accumulate(map(len, parts[base::2]), initial=0))
            n = len(counts) - 1
            intl = run.startswith("+")
            resume = 0
            # Only groups that can begin a long enough window are looked at: "1 2 3 …" has none.
            for i in [i for i in range(n) if i == 0 or counts[min(i + reach, n)] - counts[i] >= least]:
                if i < resume:
                    continue
                group_start = bounds[base + 2 * i]
                if intl and i == 0:
                    low, high = 7, 17
                elif text.startswith("00", group_start):
                    low, high = 9, 17
                else:
                    low, high = self._span_of_lengths
                # The windows of groups from i whose digit count lies in [low, high], longest first.
                last = min(bisect.bisect_right(counts, counts[i] + high) - 2, i + reach - 1)
                first = max(bisect.bisect_left(counts, counts[i] + low) - 1, i)
                for j in range(last, first - 1, -1):
                    if (low, high) == self._span_of_lengths and counts[j + 1] - counts[i] not in self._lengths:
                        continue
                    start, end = self._widen(text, group_start, bounds[base + 2 * j + 1])
                    if _isolated(text, start, end, ".-,:/", words=True) and self._is_phone(text[start:end]):
                        yield start, end
                        resume = j + 1
                        break

    @staticmethod
    def _widen(text: str, start: int, end: int) -> tuple[int, int]:
        """Take in the ``+``/``(`` before a run of groups and the ``)`` after it."""
        if start > 0 and text[start - 1] == "(":
            start -= 1
        if start > 1 and text[start - 1] == " " and text[start - 2] == "+":
            start -= 2
        elif start > 0 and text[start - 1] == "+":
            start -= 1
        if end < len(text) and text[end] == ")" and "(" in text[start:end]:
            end += 1
        return start, end

    def _phone(self, candidate: str) -> bool:
        """Whether ``candidate`` is a phone number by the rules in the module's notes."""
        if candidate.startswith("00"):
            candidate = "+" + candidate[2:]
        if candidate.startswith("+"):
            number = _parse_phone(candidate, None)
            return number is not None and phonenumbers.is_possible_number(number)
        plain = "".join(c for c in candidate if c.isdigit())
        for region in self.regions:
            if phonenumbers.country_code_for_region(region) == 1:
                # The North American plan's shape; its fictional 555 numbers are not "valid" ones.
                national = plain[1:] if len(plain) == 11 and plain[0] == "1" else plain
                if len(national) == 10 and national[0] not in "01":
                    return True
                continue
            number = _parse_phone(candidate, region)
            if number is not None and phonenumbers.is_valid_number(number):
                return True
        return False


class IbanRule(PIIRule):
    """IBANs, written compact or in groups of four, confirmed by ``stdnum`` (country format, check digits)."""

    def __init__(self) -> None:
        super().__init__("IBAN", r"[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]{1,4}){3,8}")

    def spans(self, text: str) -> Iterator[tuple[int, int]]:
        """Yield the span of every IBAN; a run that takes in a word after one (``… 00 AND``) is cut back."""
        for match in self._regex.finditer(text):
            start = match.start()
            tokens = match.group(0).split(" ")
            for k in range(len(tokens), 0, -1):
                candidate = " ".join(tokens[:k])
                if _isolated(text, start, start + len(candidate)) and iban.is_valid(candidate):
                    yield start, start + len(candidate)
                    break


def _parse_phone(text: str, region: str | None) -> phonenumbers.PhoneNumber | None:
    """Parse ``text`` as a phone number, or return ``None``."""
    try:
        return phonenumbers.parse(text, region)
    except phonenumbers.NumberParseException:
        return None


_NON_DIGITS = re.compile(r"([^0-9]+)")  # splits one RE2 match into digit groups: no backtracking possible


def _entropy(text: str) -> float:
    """Shannon entropy of ``text`` in bits per character."""
    counts = Counter(text)
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


def _random_looking(token: str) -> bool:
    """Whether a prefixed token looks generated (letters and digits mixed), not a word (``sk-learn-…``)."""
    body = token.split("-", 1)[-1] if token.startswith("sk-") else token
    return any(c.isdigit() for c in body) and any(c.isalpha() for c in body) and _entropy(body) >= 3.0


def _secret_value(value: str) -> bool:
    """Whether the value given to a secret-named key looks like a secret rather than a word (``Required``)."""
    return any(not c.isalpha() for c in value) or len(value) >= 16


def _basic_credentials(value: str) -> bool:
    """Whether a ``Basic`` value decodes to ``user:password``."""
    try:
        return b":" in base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return False


def _card(match: str) -> bool:
    """Whether a match is a card number: 13–19 digits from the networks' ranges, Luhn-valid."""
    digits = "".join(c for c in match if c.isdigit())
    return 13 <= len(digits) <= 19 and digits[0] in "23456" and luhn.is_valid(digits)


def _ssn(match: str) -> bool:
    """Whether a match is a US social security number (no 000/666/9xx area, no known-invalid numbers)."""
    return bool(ssn.is_valid(match.replace(" ", "-")))


def _ipv6(match: str) -> bool:
    """Whether a compressed match looks like an address rather than a scope (``a::b``)."""
    return any(len(group) >= 3 for group in match.split(":"))


_SECRET_KEYS = (r"api[_\-]?key|apikey|access[_\-]?key(?:[_\-]?id)?|secret[_\-]?(?:access[_\-]?)?key|client[_\-]?secret"
                r"|(?:access|auth|refresh|session|bearer)[_\-]?token|private[_\-]?key|password|passwd|pwd|secret|token"
                r"|credentials?")
_SECRET_KEY = re.compile(rf"(?i)(?:.*[^a-z0-9])?(?:{_SECRET_KEYS})")  # a dict key naming a secret (fullmatch)
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_HEX = "[0-9A-Fa-f]{1,4}"
_SEP = r"(?:[ .\-]|  )?"
DEFAULT_RULES: tuple[PIIRule, ...] = (
    PIIRule("SECRET", r"(?s)-----BEGIN[A-Z ]*PRIVATE KEY-----.*?-----END[A-Z ]*PRIVATE KEY-----"),
    PIIRule("SECRET", r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]+:(?P<pii>[^\s:/@]+)@"),
    PIIRule("SECRET", r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}", isolated=True),
    PIIRule("SECRET", r"https://hooks\.slack\.com/services/[A-Za-z0-9_/]+"),
    PIIRule("SECRET", r"sk-(?:proj-|svcacct-|admin-|ant-[a-z0-9]+-)?[A-Za-z0-9_\-]{20,}", _random_looking,
            isolated=True),
    PIIRule("SECRET", r"(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z0-9]{16}", isolated=True),
    PIIRule("SECRET", r"(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255}|glpat-[A-Za-z0-9_\-]{20,})",
            isolated=True),
    PIIRule("SECRET", r"xox[abposr]-[A-Za-z0-9\-]{10,}", isolated=True),
    PIIRule("SECRET", r"AIza[0-9A-Za-z_\-]{35}", isolated=True),
    PIIRule("SECRET", r"(?:sk|rk)_(?:live|test)_[0-9A-Za-z]{10,99}", isolated=True),
    PIIRule("SECRET", r"(?:hf_[A-Za-z0-9]{30,}|npm_[A-Za-z0-9]{36}|SG\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9_\-]{43})",
            isolated=True),
    PIIRule("SECRET", r"(?i)\bbearer\s+(?P<pii>[A-Za-z0-9\-._~+/]{8,}=*)", _secret_value),
    PIIRule("SECRET", r"(?i)\bbasic\s+(?P<pii>[A-Za-z0-9+/]{8,}={0,2})", _basic_credentials),
    PIIRule("SECRET", rf"(?i)(?:^|[^A-Za-z0-9])(?:{_SECRET_KEYS})[\"']?\s*(?:=>|=|:)\s*[\"']?"
                      r"(?P<pii>[A-Za-z0-9+/=_\-.~!@#$%^&*]*[A-Za-z0-9+/=_\-~!@#$%^&*])", _secret_value),
    PIIRule("EMAIL", r"[\p{L}\p{N}._%+\-]+@[\p{L}\p{N}](?:[\p{L}\p{N}\-]*[\p{L}\p{N}])?"
                     r"(?:\.[\p{L}\p{N}](?:[\p{L}\p{N}\-]*[\p{L}\p{N}])?)*\.\p{L}{2,}"),
    IbanRule(),
    PIIRule("CARD", rf"[0-9]{{13,19}}|[0-9]{{4}}(?:{_SEP}[0-9]{{4}}){{2}}{_SEP}[0-9]{{1,7}}"
                    rf"|[0-9]{{4}}{_SEP}[0-9]{{6}}{_SEP}[0-9]{{4,5}}", _card, isolated=True),
    PIIRule("SSN", r"[0-9]{3}[ \-][0-9]{2}[ \-][0-9]{4}", _ssn, isolated=True),
    PIIRule("IP", rf"(?i)(?P<veto>\b(?:v|ver|version|release|build|rev)\.?\s*[:=]?\s*)?(?:{_OCTET}\.){{3}}{_OCTET}",
            isolated=True),
    PIIRule("IP", rf"(?:{_HEX}:){{7}}{_HEX}|(?:{_HEX}:){{1,7}}:(?:{_HEX}(?::{_HEX}){{0,6}})?"
                  rf"|::(?:{_HEX}(?::{_HEX}){{0,6}})?", _ipv6, isolated=True),
    PhoneRule(),
)
"""Secrets, e-mail addresses, IBANs, card numbers, SSNs, IP addresses and phone numbers, in order."""


class PIIScrubber:
    """Replace personal data and secrets in text with ``[LABEL]`` placeholders, in linear time.

    Args:
        rules: the rules to apply, in order (a later rule sees the placeholders of earlier
            ones: cards go before phones, whose shape a card number has).
        extra: more patterns, ``{label: regex}`` (RE2 syntax), applied after ``rules``.
        regions: the regions whose national phone numbers count without a country code;
            given, it replaces the default rules' phone rule (``("US",)``).

    """

    def __init__(self, rules: Iterable[PIIRule] = DEFAULT_RULES, *, extra: Mapping[str, str] | None = None,
                 regions: Sequence[str] | None = None) -> None:
        rules = list(rules)
        if regions is not None:
            rules = [PhoneRule(regions) if isinstance(rule, PhoneRule) else rule for rule in rules]
        self.rules = [*rules, *(PIIRule(label, regex) for label, regex in (extra or {}).items())]

    def __call__(self, text: str) -> str:
        """Return ``text`` with every match of every rule replaced by its placeholder."""
        text = _encodable(text)
        for rule in self.rules:
            parts: list[str] = []
            last = 0
            for start, end in rule.spans(text):
                if start < last:
                    continue
                parts += [text[last:start], f"[{rule.label}]"]
                last = end
            if parts:
                text = "".join(parts) + text[last:]
        return text

    def scrub_field(self, key: Any, text: str) -> str:
        """Scrub the value of ``key`` in a mapping: a secret-named key's value is a secret as a whole."""
        if isinstance(key, str) and _SECRET_KEY.fullmatch(key) and text:
            return "[SECRET]"
        return self(text)

    def scrub(self, value: Any) -> Any:
        """Scrub every string, key and number inside ``value`` (see :func:`scrub_value`)."""
        return scrub_value(value, self)


def _encodable(text: str) -> str:
    """Return ``text`` with what UTF-8 cannot encode (lone surrogates) replaced by U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def _scrub_text(text: str, scrubber: Callable[[str], str], key: Any = None) -> str:
    """Scrub one string; a scrubber that fails makes it :data:`REDACTED`, never a lost record."""
    text = _encodable(text)
    try:
        if key is not None and isinstance(scrubber, PIIScrubber):
            return scrubber.scrub_field(key, text)
        return _encodable(scrubber(text))
    except Exception as exc:  # any failure of a user's scrubber must neither leak the value nor lose the record
        logger.warning("the PII scrubber failed (%s: %s); the value is replaced by %s", type(exc).__name__, exc,
                       REDACTED)
        return REDACTED


def scrub_value(value: Any, scrubber: Callable[[str], str]) -> Any:
    """Apply ``scrubber`` to every string inside ``value``: values, dict keys and the digits of integers.

    Dicts, lists, tuples and sets are walked (tuples and sets become lists); bytes are read as
    UTF-8; an integer whose digits hold personal data (a card number) becomes its placeholder
    text; pydantic models and dataclasses are walked as dicts; any other object is scrubbed as
    its ``str``. Two keys that scrub to the same text stay apart (``[EMAIL]``, ``[EMAIL] (2)``).
    With a :class:`PIIScrubber`, the value of a secret-named key (``password``, ``api_key``) is
    replaced whole.
    """
    return _scrub(value, scrubber, None)


def _scrub(value: Any, scrubber: Callable[[str], str], owner: Any) -> Any:
    """Scrub ``value``, found under the mapping key ``owner`` (``None``: not in a mapping)."""
    if isinstance(value, str):
        return _scrub_text(value, scrubber, owner)
    if value is None or isinstance(value, (bool, float)):
        return value
    if isinstance(value, int):
        digits = str(value)
        clean = _scrub_text(digits, scrubber)  # under a secret-named key, a number is a count (max_tokens)
        return value if clean == digits else clean
    if isinstance(value, (bytes, bytearray)):
        return _scrub_text(bytes(value).decode("utf-8", "replace"), scrubber, owner)
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            clean_key = _scrub(key, scrubber, None) if isinstance(key, (str, int)) else _scrub_text(str(key), scrubber)
            unique, n = clean_key, 1
            while unique in out:
                n += 1
                unique = f"{clean_key} ({n})"
            out[unique] = _scrub(item, scrubber, key)
        return out
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_scrub(item, scrubber, owner) for item in value]
    if hasattr(value, "model_dump") and callable(value.model_dump):
        return _scrub(value.model_dump(), scrubber, owner)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _scrub(dataclasses.asdict(value), scrubber, owner)
    return _scrub_text(str(value), scrubber, owner)
