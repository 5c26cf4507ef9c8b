"""roles/fleet_cache refuses bad input (tasks/validate.yml, run first by the role) before any change.

Runs the role's validate entry point with ansible-playbook once, on an inventory of local hosts, one
host per case (each with its own variables), and reads each host's result from the json callback.
Also renders libwrap's line for apt-cacher-ng and checks it with tcpdmatch (tcpd) when installed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness import ansible_vars

ROOT = Path(__file__).resolve().parents[2]

PLAYBOOK = """
- hosts: fleet_cache
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: fleet_cache
        tasks_from: validate
        public: true
    - name: probe
      ansible.builtin.debug:
        msg:
          clients: "{{ __fleet_cache_clients }}"
          pins: "{{ __fleet_cache_pins }}"
      when: inventory_hostname == 'good'
- hosts: purge_cases
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: fleet_cache
        tasks_from: purge
"""

# make cache-purge MODEL=...: a name that is not OWNER/NAME is refused before anything runs.
PURGE_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "purge-shell": ({"fleet_cache_purge_model": "a/b; rm -rf /"}, "fleet_cache_purge_model must be OWNER/NAME"),
    "purge-path": ({"fleet_cache_purge_model": "a/../b"}, "fleet_cache_purge_model must be OWNER/NAME"),
    "purge-owner-only": ({"fleet_cache_purge_model": "Qwen"}, "fleet_cache_purge_model must be OWNER/NAME"),
}

CASES: dict[str, tuple[dict[str, Any], str | None]] = {
    "good": ({}, None),
    "good-narrow": ({"fleet_cache_allowed_networks": ["10.231.94.0/24", "2001:db8::/48"]}, None),
    "host-bits": (
        {"fleet_cache_allowed_networks": ["10.1.2.3/8"]},
        "fleet_cache_allowed_networks[0] is '10.1.2.3/8', which has host bits set: write 10.0.0.0/8",
    ),
    "not-cidr": ({"fleet_cache_allowed_networks": ["lan"]}, "fleet_cache_allowed_networks[0] is 'lan', not a network"),
    # The default: the boxes of gpu_boxes only (b1 and b2 below), no other network.
    "empty": ({"fleet_cache_allowed_networks": []}, None),
    "slash-zero": (
        {"fleet_cache_allowed_networks": ["10.231.94.0/24", "0.0.0.0/0"]},
        "fleet_cache_allowed_networks[1] is 0.0.0.0/0, which admits every address: the cache would be an open proxy",
    ),
    "v6-zero": (
        {"fleet_cache_allowed_networks": ["::/0"]},
        "fleet_cache_allowed_networks[0] is ::/0, which admits every",
    ),
    "public-half": (
        {"fleet_cache_allowed_networks": ["0.0.0.0/1"]},
        "fleet_cache_allowed_networks[0] is 0.0.0.0/1, which admits public addresses too",
    ),
    "not-a-list": ({"fleet_cache_allowed_networks": "10.0.0.0/8"}, "fleet_cache_allowed_networks must be a list"),
    "redirect-url": (
        {"fleet_cache_model_redirect_hosts": ["http://storage.example.com"]},
        "fleet_cache_model_redirect_hosts must list host names",
    ),
    "redirect-ip": ({"fleet_cache_model_redirect_hosts": ["127.0.0.1"]}, "refused: ['127.0.0.1']"),
    "redirect-localhost": ({"fleet_cache_model_redirect_hosts": ["localhost"]}, "refused: ['localhost']"),
    "tls-half": (
        {"fleet_cache_tls_certificate": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"},
        "fleet_cache_tls_certificate and fleet_cache_tls_private_key must be given together",
    ),
    "tls-port": ({"fleet_cache_tls_port": 3142}, "fleet_cache_tls_port 3142 must be a free TCP port"),
    "redirect-port": ({"fleet_cache_model_redirect_hosts": ["s.example.com:8443"]}, "refused: ['s.example.com:8443']"),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("fleet-cache-inputs")
    hosts = {name: {"ansible_connection": "local", **hostvars} for name, (hostvars, _) in CASES.items()}
    purge = {name: {"ansible_connection": "local", **hostvars} for name, (hostvars, _) in PURGE_CASES.items()}
    # The boxes: b1's inventory gives its address; b2 is reached on loopback (as molecule's boxes are), so its
    # facts' default IPv4 counts, gathered by the role (b2 is this machine); b2 uses a lock file of its own.
    (tmp / "b2.lock.json").write_text(json.dumps(B2_LOCK))
    boxes = {
        "b1": {"ansible_host": "10.0.0.11"},
        "b2": {"ansible_host": "127.0.0.1", "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
               "gpubox_model_lock_file": str(tmp / "b2.lock.json")},
    }  # fmt: skip
    groups = {"fleet_cache": {"hosts": hosts}, "purge_cases": {"hosts": purge}, "gpu_boxes": {"hosts": boxes}}
    runs = ansible_vars.run_playbook({"all": {"children": groups}}, PLAYBOOK, tmp, timeout=300)
    # Per host: its failure, else its first result; and the probe's (the one host that runs it).
    out: dict[str, dict[str, Any]] = {}
    for host, run in runs.items():
        results = run["results"]
        for result in results:
            if result["task"] == "probe" and not result.get("skipped"):
                out["probe"] = result
        if results:
            out[host] = next((r for r in results if r.get("failed")), results[0])
    return out


B2_COMMIT = "0123456789abcdef" * 2 + "01234567"
B2_LOCK = {
    "schema": 1,
    "models": {
        "gpubox-test/tiny@master": {"commit": B2_COMMIT, "endpoint": "https://hub.example", "content_sha256": "b" * 64,
                                    "files": 4, "total_bytes": 5000},
    },
}  # fmt: skip


def test_the_default_admits_the_boxes_as_the_inventory_and_their_facts_know_them(
    results: dict[str, dict[str, Any]],
) -> None:
    """b1 by its ansible_host; b2, reached on loopback, by the default IPv4 the role read from its facts."""
    clients = results["probe"]["msg"]["clients"]
    assert clients["errors"] == []
    assert clients["boxes"]["b1"] == ["10.0.0.11/32"]
    b2 = clients["boxes"]["b2"]  # its default IPv4, and its default IPv6 where it has one
    assert 1 <= len(b2) <= 2 and b2[0].endswith("/32") and not b2[0].startswith("127."), b2
    assert all(not net.startswith(("127.", "::1/")) for net in b2), "loopback is the connection, not the box"
    assert clients["networks"] == ["10.0.0.11/32", *b2]


def test_the_lock_a_box_uses_pins_its_commit_at_the_cache(results: dict[str, dict[str, Any]]) -> None:
    pins = results["probe"]["msg"]["pins"]
    assert pins["errors"] == [] and pins["unsized"] == []
    (zone,) = pins["zones"]
    assert (zone["model"], zone["commit"], zone["files"], zone["bytes"]) == ("gpubox-test/tiny", B2_COMMIT, 4, 5000)
    assert zone["max_size"] == 5000 + 5 * 1024 * 1024


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_input_is_accepted_or_refused_naming_the_variable(results: dict[str, dict[str, Any]], case: str) -> None:
    _, expected = CASES[case]
    result = results[case]
    if expected is None:
        assert not result.get("failed"), result.get("msg")
    else:
        assert result.get("failed"), f"{case} was accepted"
        assert expected in result["msg"], result["msg"]
        assert "Nothing was changed." in result["msg"]


@pytest.mark.parametrize("case", sorted(PURGE_CASES))
def test_a_purge_of_a_name_that_is_not_owner_name_is_refused(results: dict[str, dict[str, Any]], case: str) -> None:
    result = results[case]
    assert result.get("failed") and PURGE_CASES[case][1] in result["msg"], result
    assert "Nothing was changed." in result["msg"]


def _wrap_line(networks: list[str], boxes: tuple[str, ...] = ()) -> str:
    """libwrap's line as vars/main.yml renders it, for boxes (their ansible_host) and the operator's networks."""
    from ansible_collections.gpubox.gpubox.plugins.module_utils import fleet_cache_access as access

    clients = access.clients([access.BoxSeen(f"b{i}", ansible_host=a) for i, a in enumerate(boxes)], networks)
    assert clients["errors"] == []
    return ansible_vars.render(
        "unit-fleet-cache", "__fleet_cache_wrap_allow", roles=("fleet_cache",),
        extra_vars={"__fleet_cache_clients": clients},
    )  # fmt: skip


def test_apt_cacher_ngs_libwrap_line_lists_loopback_and_the_networks() -> None:
    line = _wrap_line(["10.231.94.0/24", "2001:db8::/48"], boxes=("192.168.7.7",))
    assert line == "apt-cacher-ng: 127.0.0.1 [::1] 192.168.7.7/32 10.231.94.0/24 [2001:db8::]/48"
    # The default: the boxes alone.
    assert (
        _wrap_line([], boxes=("10.231.94.11", "10.231.94.12"))
        == "apt-cacher-ng: 127.0.0.1 [::1] 10.231.94.11/32 10.231.94.12/32"
    )


@pytest.mark.skipif(shutil.which("tcpdmatch") is None, reason="tcpdmatch (package tcpd) is not installed")
@pytest.mark.parametrize(
    ("client", "verdict"),
    [
        ("10.231.94.11", "granted"),
        ("10.231.95.11", "denied"),
        ("127.0.0.1", "granted"),
        ("192.168.7.7", "granted"),
        ("192.168.7.8", "denied"),
        ("2001:db8::5", "granted"),
        ("2001:db9::5", "denied"),
    ],
)
def test_libwrap_grants_exactly_the_allowed_networks(tmp_path: Path, client: str, verdict: str) -> None:
    """The real libwrap matcher (tcpdmatch -d reads hosts.allow/hosts.deny from the current directory)."""
    line = _wrap_line(["10.231.94.0/24", "2001:db8::/48"], boxes=("192.168.7.7",))
    (tmp_path / "hosts.allow").write_text(line + "\n")
    (tmp_path / "hosts.deny").write_text("apt-cacher-ng: ALL\n")
    done = subprocess.run(
        ["tcpdmatch", "-d", "apt-cacher-ng", client], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert f"access:   {verdict}" in done.stdout, done.stdout + done.stderr


@pytest.mark.skipif(shutil.which("tcpdmatch") is None, reason="tcpdmatch (package tcpd) is not installed")
@pytest.mark.parametrize(
    ("client", "verdict"),
    [("10.231.94.11", "granted"), ("10.231.94.12", "granted"), ("10.231.94.99", "denied"), ("192.168.1.5", "denied")],
)
def test_by_default_libwrap_grants_the_boxes_only(tmp_path: Path, client: str, verdict: str) -> None:
    """The default (no fleet_cache_allowed_networks): apt-cacher-ng serves the boxes, no other LAN host."""
    (tmp_path / "hosts.allow").write_text(_wrap_line([], boxes=("10.231.94.11", "10.231.94.12")) + "\n")
    (tmp_path / "hosts.deny").write_text("apt-cacher-ng: ALL\n")
    done = subprocess.run(
        ["tcpdmatch", "-d", "apt-cacher-ng", client], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert f"access:   {verdict}" in done.stdout, done.stdout + done.stderr
