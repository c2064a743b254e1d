"""A PII corpus: many formats of each kind must be caught (recall per kind), ordinary text kept as is."""

from __future__ import annotations

import pytest

from evoharness_agent import PIIScrubber

# Each item appears in a sentence; it is caught when it is gone and its kind's placeholder is there.
CORPUS: dict[str, list[str]] = {
    "EMAIL": [
        "jane@example.com", "jane.doe+tag@example.co.uk", "JOHN_SMITH@Example.ORG", "first-last@sub.mail.example.io",
        "user123@my-company.de", "a@b.io", "josé@exämple.de", "ünïcode.name@domain.fr", "用户@例子.广告",
        "user@xn--bcher-kva.example", "o'hara@example.com".replace("'", ""), "x%y@example.net",
    ],
    "PHONE": [
        "+49 30 12345678", "+49 (0)30 12345678", "0049 30 12345678", "+91 98765 43210", "+91-9876543210",
        "5551234567", "(555) 123-4567", "555-123-4567", "555.123.4567", "+1 415 555 2671", "+1-415-555-2671",
        "1-800-555-0199", "+1 (555) 123-4567", "+44 20 7946 0958", "+44 7911 123456", "+33 6 12 34 56 78",
        "+33612345678", "+81 3-1234-5678", "+86 138 0013 8000", "+61 2 9876 5432", "+55 11 91234-5678",
        "+7 495 123-45-67", "+34 612 34 56 78", "+39 06 1234 5678", "+52 55 1234 5678",
    ],
    "CARD": [
        "4111111111111111", "4111 1111 1111 1111", "4111-1111-1111-1111", "4111.1111.1111.1111",
        "4111  1111  1111  1111", "5555555555554444", "5105 1051 0510 5100", "378282246310005", "3782 822463 10005",
        "371449635398431", "6011111111111117", "6011-0009-9013-9424", "3530111333300000", "30569309025904",
        "6200000000000005", "4222222222222", "2223003122003222",
    ],
    "IBAN": [
        "DE89 3704 0044 0532 0130 00", "DE89370400440532013000", "GB82 WEST 1234 5698 7654 32",
        "GB82WEST12345698765432", "FR14 2004 1010 0505 0001 3M02 606", "ES91 2100 0418 4502 0005 1332",
        "IT60 X054 2811 1010 0000 0123 456", "NL91 ABNA 0417 1643 00", "CH93 0076 2011 6238 5295 7",
        "AT61 1904 3002 3457 3201", "PL61 1090 1014 0000 0712 1981 2874", "SE45 5000 0000 0583 9825 7466",
        "NO93 8601 1117 947",
    ],
    "SECRET": [
        "sk-" + "A1b2C3d4E5f6G7h8I9j0" * 2 + "KLMN", "sk-proj-" + "Ab1_Cd2-Ef3" * 8,
        "sk-ant-api03-" + "Zx8Qm2Lp9Wk4Rt7Yb1Nc6Vd3Hf5Gj0Ks" * 3,
        "AKIAIOSFODNN7EXAMPLE", "ASIAY34FZKBOKMUTVV7A", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "ghp_" + "a1B2c3D4e5F6" * 3, "gho_" + "Z9y8X7w6V5u4" * 3, "github_pat_11ABCDEFG0" + "a1b2C3d4E5" * 6,
        "glpat-" + "x1Y2z3W4v5U6t7S8r9Q0", "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
        "xoxp-1111-2222-3333-abcdef", "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
        "AIza" + "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",
        "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc", "rk_live_" + "51H8abcDEF123ghiJKL456",
        "sk_test_" + "26PHem9AhJZvU623DfE1x4sd",
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz123456", "npm_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
        "SG." + "abcdefghij1234567890AB" + "." + "abcdefghij1234567890ABCDEFGHIJabcdefghij123",
        "9f8e7d6c5b4a3f2e1d0c", "hunter22", "correcthorsebatterystaple", "dXNlcjpwYXNzd29yZA==",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7\n-----END RSA PRIVATE KEY-----", "s3cr3t-pa55",
    ],
    "IP": [
        "192.168.0.1", "10.0.0.138", "8.8.8.8", "172.16.254.1", "203.0.113.195", "255.255.255.255",
        "2001:0db8:85a3:0000:0000:8a2e:0370:7334", "2001:db8::ff00:42:8329", "fe80::1ff:fe23:4567:890a", "2001:db8::1",
    ],
    "SSN": ["536-22-8726", "123-45-6789", "001-01-0001", "536 22 8726"],
}

# Where a secret needs its context (a key name, an auth scheme), the sentence gives it.
CONTEXT = {
    "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY": "aws_secret_access_key = {}",
    "9f8e7d6c5b4a3f2e1d0c": '{{"api_key": "{}"}}', "hunter22": "password={}",
    "correcthorsebatterystaple": "PASSWORD: '{}'", "dXNlcjpwYXNzd29yZA==": "Authorization: Basic {}",
    "s3cr3t-pa55": "db://admin:{}@db.internal:5432",
}
TEMPLATES = ["Please use {} for this.", "value={};", "({})", "{}", "Contact: {}, thanks", "\"{}\""]

FALSE_POSITIVES = [
    # versions and builds
    "version 1.2.3.4", "v1.2.3.4", "ver. 10.0.0.1", "release 4.1.2.1", "build 1.0.0.0", "Python 3.11.4",
    "pydantic 2.14.4", "1.2.3.4.5", "256.1.1.1",
    # dates and times
    "2025-01-31", "31/01/2025", "01.31.2025", "2025-01-31T12:30:45Z", "at 2025-01-31 12:30:45", "12:30:45",
    "2025-01-31 12:30", "epoch 1735689600", "ts 1735689600000",
    # order ids, tracking and reference numbers
    "ORD-2025-000123", "order #48213", "invoice INV-00042", "order 1234567890", "ticket 98-7654", "1Z999AA10123456784",
    "order 1234 5678 9012 3456", "ISBN 978-3-16-148410-0", "ISO 9001:2015", "HTTP 404", "port 8080",
    # prices, quantities and numbers
    "$1,299.99", "€ 49,90", "1 299,00 kr", "population 13960000", "ratio 0.5", "3+4=7", "10 / 20 / 30",
    "48.8566, 2.3522", "1024 MB", "1 2 3 4 5 6 7 8 9 10",
    # identifiers that are not personal data
    "123e4567-e89b-12d3-a456-426614174000", "550e8400-e29b-41d4-a716-446655440000",
    "commit 3f2a9c1e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a39", "#ff0000", "std::vector and a::b", "localhost ::1",
    # words near secret names
    "max_tokens=1024", "tokens: 1000", "password: Required.", "the api_key parameter", "sk-learn-is-a-great-library",
    "Bearer tokens expire", "token=<redacted>", "user@localhost",
]


@pytest.fixture(scope="module")
def scrubber() -> PIIScrubber:
    return PIIScrubber()


def test_recall_per_kind_is_one(scrubber: PIIScrubber) -> None:
    missed: list[str] = []
    rows = []
    for kind, items in CORPUS.items():
        caught = total = 0
        for i, item in enumerate(items):
            for template in (CONTEXT.get(item, TEMPLATES[i % len(TEMPLATES)]), CONTEXT.get(item, "{}")):
                text = template.format(item)
                clean = scrubber(text)
                total += 1
                if item not in clean and f"[{kind}]" in clean:
                    caught += 1
                else:
                    missed.append(f"{kind}: {text!r} -> {clean!r}")
        rows.append((kind, len(items), caught / total))
    print("\nkind    formats  recall")
    for kind, n, recall in rows:
        print(f"{kind:<7} {n:>7}  {recall:.3f}")
    assert not missed, "\n".join(missed)


def test_no_false_positives(scrubber: PIIScrubber) -> None:
    changed = [f"{text!r} -> {scrubber(text)!r}" for text in FALSE_POSITIVES if scrubber(text) != text]
    print(f"\nfalse positives: {len(changed)} of {len(FALSE_POSITIVES)}")
    assert not changed, "\n".join(changed)
