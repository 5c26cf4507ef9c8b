"""tools/secrets_scan.py (detect-secrets, run by `make lint`) catches a planted secret, lets the test-only keys
through by name only, and its baseline records nothing but audited non-secrets."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

import secrets_scan

# Built at run time so that this file itself holds no key for the repository scan to find.
AWS_KEY = "AKIA" + "Q3EGRIVX" + "7KHB2PDM"
PRIVATE_KEY = "-----BEGIN " + "RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END " + "RSA PRIVATE KEY-----\n"


def scan(tmp_path: Path, text: str, name: str = "planted.yml") -> list[tuple[str, int, str]]:
    path = tmp_path / name
    path.write_text(text)
    return secrets_scan.new_findings([str(path)])


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        (f"aws_access_key_id: {AWS_KEY}\n", "AWS Access Key"),
        (PRIVATE_KEY, "Private Key"),
        # a letter first: a key that starts with "-" reads as another YAML token to the keyword detector
        ("vault_gpubox_api_key: k" + secrets.token_urlsafe(24) + "\n", "Secret Keyword"),
    ],
    ids=["AWS Access Key", "Private Key", "Secret Keyword"],  # the key is random: the same ids on every worker
)
def test_a_planted_secret_fails_the_scan(tmp_path: Path, text: str, kind: str) -> None:
    findings = scan(tmp_path, "# planted by a test\n" + text)
    assert kind in {found_kind for _name, _line, found_kind in findings}, findings
    assert all(line >= 2 for _name, line, _kind in findings)


@pytest.mark.parametrize("key", sorted(secrets_scan.TEST_ONLY_KEYS))
def test_test_only_keys_pass_by_name(tmp_path: Path, key: str) -> None:
    assert scan(tmp_path, f"vault_gpubox_api_key: {key}\n") == []
    # the allow-list is the exact key, not anything that contains it
    assert scan(tmp_path, f"vault_gpubox_api_key: {key}X{secrets.token_hex(8)}\n") != []


def test_the_cli_exits_1_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "leak.env"
    path.write_text(f"AWS_ACCESS_KEY_ID={AWS_KEY}\n")
    assert secrets_scan.main([str(path)]) == 1
    assert f"{path}:1: AWS Access Key" in capsys.readouterr().out


def test_baseline_records_only_audited_non_secrets() -> None:
    data = json.loads(secrets_scan.BASELINE.read_text())
    results = [r for rs in data["results"].values() for r in rs]
    assert results and all(r["is_secret"] is False for r in results)
    # what it records: checksums and fingerprints (hex), and code that names the key without holding it
    assert {r["type"] for r in results} <= {"Hex High Entropy String", "Secret Keyword"}
    filters = {f["path"]: f for f in data["filters_used"]}
    assert filters["detect_secrets.filters.regex.should_exclude_secret"]["pattern"] == [secrets_scan.EXCLUDE_SECRETS]
