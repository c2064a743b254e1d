"""PIIScrubber: the leaks, the false positives, structured values, surrogates and linear time."""

from __future__ import annotations

import dataclasses
import random
import re
import time

import pytest

from evoharness_agent import PIIScrubber
from evoharness_agent.logs.scrubber import REDACTED, PIIRule, scrub_value

GHP = "ghp_" + "a1B2c3D4e5F6" * 3


@pytest.mark.parametrize(("text", "expected"), [
    ("IBAN DE89 3704 0044 0532 0130 00 AND more", "IBAN [IBAN] AND more"),
    ("pay GB82WEST12345698765432.", "pay [IBAN]."),
    ("key sk-proj-abc123DEF456ghi789JKL012mno", "key [SECRET]"),
    ("id AKIAIOSFODNN7EXAMPLE", "id [SECRET]"),
    ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "aws_secret_access_key = [SECRET]"),
    (f"token {GHP}", "token [SECRET]"),
    ("Authorization: Bearer abc.def-123456789", "Authorization: Bearer [SECRET]"),
    ('{"api_key": "9f8e7d6c5b4a3f2e1d0c"}', '{"api_key": "[SECRET]"}'),
    ("call +49 30 12345678 or +91 98765 43210", "call [PHONE] or [PHONE]"),
    ("call 5551234567 or (555) 123-4567", "call [PHONE] or [PHONE]"),
    ("both 555-123-4567 555-987-6543", "both [PHONE] [PHONE]"),
    ("card 4111.1111.1111.1111 or 4111  1111  1111  1111", "card [CARD] or [CARD]"),
    ("mail josé@exämple.de", "mail [EMAIL]"),
    ("ssn 536-22-8726", "ssn [SSN]"),
    ("host 10.0.0.1:8080 and http://192.168.1.20/x", "host [IP]:8080 and http://[IP]/x"),
])
def test_scrubs_what_leaked(text: str, expected: str) -> None:
    assert PIIScrubber()(text) == expected


@pytest.mark.parametrize("text", [
    "version 1.2.3.4", "v1.2.3.4 and release 10.0.0.1", "1.2.3.4.5", "at 2025-01-31 12:30:45",
    "sk-learn-is-a-great-library", "max_tokens=1024", "password: Required.", "ISBN 978-3-16-148410-0",
    "uuid 123e4567-e89b-12d3-a456-426614174000", "epoch 1735689600 and order 1234567890",
])
def test_keeps_what_is_not_personal(text: str) -> None:
    assert PIIScrubber()(text) == text


def test_ipv4_rule_is_address_unless_a_version() -> None:
    # The rule chosen: a dotted quad of octets 0-255 is an address, unless a version word comes before it.
    assert PIIScrubber()("ping 1.2.3.4, build 1.2.3.4, 256.1.1.1") == "ping [IP], build 1.2.3.4, 256.1.1.1"


@dataclasses.dataclass
class _Contact:
    email: str


def test_scrubs_keys_numbers_and_any_value() -> None:
    scrubber = PIIScrubber()
    value = {"jane@example.com": 4111111111111111, "bob@example.org": 5551234567, "count": 42, "ok": True,
             "password": "hunter2", "nested": [("192.168.0.1", b"mail a@b.io"), {_Contact("c@d.io").email}],
             "contact": _Contact("e@f.io"), "when": 1.5, 7: None}
    assert scrub_value(value, scrubber) == {
        "[EMAIL]": "[CARD]", "[EMAIL] (2)": "[PHONE]", "count": 42, "ok": True, "password": "[SECRET]",
        "nested": [["[IP]", "mail [EMAIL]"], ["[EMAIL]"]], "contact": {"email": "[EMAIL]"}, "when": 1.5, 7: None}
    assert scrubber.scrub({"token": 12}) == {"token": 12}  # a secret-named key's number is a count, not a secret


def test_replaces_what_it_cannot_encode_or_scrub() -> None:
    assert PIIScrubber()("bad \ud800 byte, mail a@b.io") == "bad \ufffd byte, mail [EMAIL]"
    assert scrub_value({"k": "\udc80"}, lambda text: text) == {"k": "\ufffd"}

    def broken(text: str) -> str:
        raise RuntimeError("boom")

    assert scrub_value({"k": ["secret", 4111111111111111]}, broken) == {REDACTED: [REDACTED, REDACTED]}


def test_rules_run_on_re2() -> None:
    with pytest.raises(ValueError, match="EMPLOYEE.*RE2"):
        PIIScrubber(extra={"EMPLOYEE": r"(?<!x)EMP-\d{4}"})
    assert PIIScrubber(rules=[PIIRule("X", r"key=(?P<pii>\w+)")])("key=abc key=") == "key=[X] key="
    assert PIIScrubber(rules=[PIIRule("EMP", re.compile(r"emp-\d+", re.IGNORECASE))])("EMP-12") == "[EMP]"
    assert PIIScrubber(regions=["GB"])("ring 07911 123456 or 020 7123 4567") == "ring [PHONE] or [PHONE]"
    with pytest.raises(ValueError, match="not a region"):
        PIIScrubber(regions=["Atlantis"])


def _mixed_text(size: int) -> str:
    pieces = ["lorem ipsum dolor sit amet,", "mail jane.doe@example.com", "call +49 30 12345678", "(555) 123-4567",
              "card 4111 1111 1111 1111", "from 10.0.0.1", "version 1.2.3.4", "on 2025-01-31 12:30", "order #48213",
              "IBAN DE89 3704 0044 0532 0130 00", "token sk-proj-abc123DEF456ghi789JKL012", "price $12.99",
              '{"id": 123, "ok": true}', "a" * 300, "1 2 3 4 5 6 7 8 9", "x." * 50, "@" * 20]
    rng = random.Random(0)
    text = ""
    while len(text) < size:
        text += " ".join(rng.choice(pieces) for _ in range(1000)) + "\n"
    return text[:size]


def test_scrubs_a_megabyte_in_linear_time() -> None:
    scrubber = PIIScrubber()
    figures = []
    for size in (250_000, 1_000_000):
        text = _mixed_text(size)
        start = time.perf_counter()
        clean = scrubber(text)
        figures.append((size, time.perf_counter() - start))
        assert "jane.doe@example.com" not in clean and "4111 1111" not in clean
    for text in ("a" * 200_000, "a." * 100_000, "1 " * 100_000):  # the shapes that made the old patterns quadratic
        start = time.perf_counter()
        scrubber(text)
        figures.append((len(text), time.perf_counter() - start))
    print("scrubber timing:", ", ".join(f"{size / 1e6:.2f} MB in {seconds:.2f} s" for size, seconds in figures))
