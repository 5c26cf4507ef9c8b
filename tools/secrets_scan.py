#!/usr/bin/env python3
"""Scan the repository for secrets with detect-secrets (PyPI, pinned in pyproject.toml); part of `make lint`.

    python tools/secrets_scan.py                    # every file git tracks or would add
    python tools/secrets_scan.py PATH ...           # these files only
    python tools/secrets_scan.py --write-baseline   # re-record .secrets.baseline after an audit

Findings already recorded in .secrets.baseline (audited: public checksums and key fingerprints, marked
is_secret false) pass, wherever their line moved. Any other finding fails (exit 1) with its file, line
and detector. The test-only keys are allow-listed by name in TEST_ONLY_KEYS below (the scan never sees
them as secrets); a real key never belongs in the repository: it lives in Ansible Vault.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / ".secrets.baseline"
# The test-only API keys, by the variable that carries each; none of them guards anything.
TEST_ONLY_KEYS = {
    "test-key-not-a-secret": "vault_gpubox_api_key of the simulated boxes (molecule/shared/group_vars/gpubox_sim.yml)",
    "tooshort-key": "vault_gpubox_api_key that refusals must refuse (molecule/refusals/host_vars)",
    "unit-test-key-0123456789abcdef": "TEST_KEY of the unit tests (harness/ansible_vars.py)",
    "plan-must-never-show-this-key-0123456789": "SECRET that make plan must never print (tests/unit/test_plan.py)",
}
EXCLUDE_SECRETS = "^(" + "|".join(re.escape(key) for key in TEST_ONLY_KEYS) + ")$"


def tracked_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    # The baseline holds hashes of what it records, not secrets.
    return [
        name for name in out if name != BASELINE.name and (ROOT / name).is_file() and not (ROOT / name).is_symlink()
    ]


def write_baseline() -> None:
    from detect_secrets.core import baseline
    from detect_secrets.settings import default_settings

    with default_settings():
        from detect_secrets.settings import get_settings

        get_settings().filters["detect_secrets.filters.regex.should_exclude_secret"] = {"pattern": [EXCLUDE_SECRETS]}
        secrets = baseline.create(*tracked_files(), root=str(ROOT))
        data = baseline.format_for_output(secrets)
    for name, results in data["results"].items():
        for result in results:
            result["is_secret"] = False  # audited: only public checksums and fingerprints are recorded
            result["filename"] = name  # relative: the baseline holds for any checkout path (CI clones elsewhere)
    BASELINE.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def new_findings(paths: list[str], baseline_path: Path = BASELINE) -> list[tuple[str, int, str]]:
    """(file, line, detector) of every finding that .secrets.baseline does not record."""
    from detect_secrets import SecretsCollection
    from detect_secrets.core import baseline
    from detect_secrets.settings import transient_settings

    recorded = baseline.load_from_file(str(baseline_path))
    # The baseline names files relative to the repository; the scan names them under this checkout.
    for name, results in recorded["results"].items():
        for result in results:
            result["filename"] = str(ROOT / name)
    with transient_settings({"plugins_used": recorded["plugins_used"], "filters_used": recorded["filters_used"]}):
        known = baseline.load(recorded, str(baseline_path))
        found = SecretsCollection(root=str(ROOT))
        found.scan_files(*paths)
        fresh = found - known
    return sorted((name, secret.line_number, secret.type) for name, secret in fresh)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", help="files to scan (default: every file git tracks or would add)")
    ap.add_argument("--write-baseline", action="store_true", help="re-record .secrets.baseline (after an audit)")
    args = ap.parse_args(argv)
    if args.write_baseline:
        write_baseline()
        print(f"secrets_scan: wrote {BASELINE.name}")
        return 0
    paths = args.paths or tracked_files()
    findings = new_findings(paths)
    for name, line, kind in findings:
        print(f"secrets_scan: {name}:{line}: {kind} (not in {BASELINE.name}); move the secret to Ansible Vault")
    if findings:
        return 1
    print(f"secrets_scan: {len(paths)} files, no secret beyond the audited baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
