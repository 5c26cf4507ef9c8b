"""The driver's archive snapshot through real apt (issue 48, item 3; plugins/module_utils/driver_snapshot.py).

SIMULATED: Ubuntu's archive and its snapshot service (harness/aptrepo/dated.py): the archive as it is now, whose
jammy-updates carries the 535-server packages as transitional ones pulling 580-server, and dated snapshots of it
that still carry the pinned 535.274.02 build, each signed by a throwaway key that stands in for Ubuntu's archive key,
served on loopback: the archive on 127.0.0.1, the snapshots on 127.0.0.2 (a host of their own, as
snapshot.ubuntu.com is). REAL: apt (Debian 12's 2.6; the boxes' jammy runs 2.4, not run here), its signature check,
its pins and its downloads, and the role's own text: the look-up script, the sources file and the pin file the role
renders (decide() and roles/nvidia_driver/templates/nvidia-driver.pref.j2). Every apt but the look-up runs with its
state under a temporary directory; the look-up runs exactly as the role runs it. Nothing on this machine changes.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpubox.gpubox.plugins.module_utils import driver_snapshot as ds
from ansible_collections.gpubox.gpubox.plugins.module_utils import stacks
from ansible_collections.gpubox.gpubox.plugins.module_utils.kernel_modules import parse_policy
from harness.ansible_vars import render_template
from harness.aptrepo import build_repo as br
from harness.aptrepo import dated

ROOT = Path(__file__).resolve().parents[2]
PREF = ROOT / "roles" / "nvidia_driver" / "templates" / "nvidia-driver.pref.j2"
STACK = stacks.info("pinned-0.7.3")
PIN = STACK["driver_versions"]["Ubuntu-22"]  # 535.274.02-0ubuntu0.22.04.1
GOOD = STACK["apt_snapshot"]["Ubuntu-22"]  # 20260101T000000Z
OTHER_KEY, UNSIGNED, SECOND = "20260102T000000Z", "20260103T000000Z", "20251201T000000Z"
NOW = datetime.datetime(2026, 12, 6, tzinfo=datetime.timezone.utc)
NOW_535, NOW_580 = "535.309.01-0ubuntu0.22.04.1", "580.178.04-0ubuntu0.22.04.1"
OLD_580 = "580.95.05-0ubuntu0.22.04.2"
# The role's versioned packages on the DKMS path (roles/nvidia_driver/vars/Ubuntu-22.yml, Secure Boot off).
VERSIONED = [
    "nvidia-headless-no-dkms-535-server",
    "nvidia-utils-535-server",
    "libnvidia-compute-535-server",
    "nvidia-compute-utils-535-server",
    "nvidia-dkms-535-server",
]
GLOBS = "*nvidia* libcuda* libnv*"
# The role's: the snapshot's pockets (roles/nvidia_driver/vars/Ubuntu-22.yml).
SUITES = yaml.safe_load((ROOT / "roles/nvidia_driver/vars/Ubuntu-22.yml").read_text())[
    "__nvidia_driver_snapshot_suites"
]

pytestmark = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("dpkg-deb", "gpg", "gpgv", "apt-get")),
    reason="needs dpkg-deb, gpg, gpgv and apt-get (apt-get install dpkg-dev gnupg)",
)


def archive_now() -> list[dated.Package]:
    """jammy-updates today: each 535-server name a transitional package that pulls its 580-server one."""
    moved = [dated.Package(name, NOW_535, (f"{name.replace('535', '580')} (>= {NOW_580})",)) for name in VERSIONED]
    new = [dated.Package(name.replace("535", "580"), NOW_580) for name in VERSIONED]
    return [*moved, *new, dated.Package("tool", "2.0")]


def snapshot_then() -> list[dated.Package]:
    """jammy-updates on the snapshot's day: the real 535 build (nvidia-utils pulling its kernel-common at the same
    build, as Ubuntu's does), an older 580, a newer `tool` and a library the archive no longer has: the pin must
    let none of the last three through."""
    build = [dated.Package(name, PIN) for name in VERSIONED if name != "nvidia-utils-535-server"]
    utils = dated.Package("nvidia-utils-535-server", PIN, (f"nvidia-kernel-common-535-server (= {PIN})",))
    return [
        *build,
        utils,
        dated.Package("nvidia-kernel-common-535-server", PIN),
        dated.Package("nvidia-utils-580-server", OLD_580),
        dated.Package("tool", "3.0"),
        dated.Package("libfoo1", "1.0"),
    ]


@dataclass(frozen=True)
class World:
    archive: str  # the archive's base URL (127.0.0.1)
    service: str  # the snapshot service's base URL (127.0.0.2), as __nvidia_driver_snapshot_service
    keyring: Path  # the archive key's keyring (readable by apt's _apt sandbox user)
    snapshots: Path  # the served tree of the snapshots
    tmp: Path  # a directory _apt can reach, for the look-up's TMPDIR


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    base = tmp_path_factory.mktemp("snapshot")
    good, other = br.Signer(base / "gnupg-archive"), br.Signer(base / "gnupg-other")
    dated.build_suite(base / "archive" / "ubuntu", "jammy-updates", "restricted", archive_now(), good)
    tree = base / "snapshots"
    for snapshot, signer in ((GOOD, good), (SECOND, good), (OTHER_KEY, other), (UNSIGNED, None)):
        for suite in SUITES:
            dated.build_suite(tree / "ubuntu" / snapshot, suite, "restricted", snapshot_then(), signer)
    # apt drops to _apt for its downloads and signature checks: the keyring and the look-up's TMPDIR must be
    # reachable by that user (pytest's own base directory is not).
    reachable = Path(tempfile.mkdtemp(prefix="gpubox-snapshot-test-"))
    reachable.chmod(0o755)
    keyring = reachable / "archive-keyring.gpg"
    keyring.write_bytes(good.export(good.fingerprint()))
    keyring.chmod(0o644)
    (reachable / "tmp").mkdir(mode=0o755)
    try:
        with dated.serve(base / "archive", "127.0.0.1") as archive, dated.serve(tree, "127.0.0.2") as snaps:
            yield World(f"{archive}/ubuntu", f"{snaps}/ubuntu/", keyring, tree, reachable / "tmp")
    finally:
        good.stop_agent()
        other.stop_agent()
        shutil.rmtree(reachable)


def plan(world: World, knob: str = "") -> dict:
    """The role's decision for the pinned stack on Ubuntu 22.04, pointed at the loopback service and keyring."""
    keyring = str(world.keyring)
    result = ds.decide(knob, STACK, "Ubuntu-22", PIN, world.service, SUITES, ["restricted"], keyring, VERSIONED, NOW)
    assert result["problems"] == [], result["problems"]
    return result


def look_up(world: World, snapshot: str = "") -> subprocess.CompletedProcess[str]:
    """The role's look-up script, run as validate.yml runs it (bash -c, as root on a box)."""
    script = plan(world, snapshot)["lookup"]
    # the stand-ins are on loopback: no proxy of this machine's environment between (apt reads *_proxy)
    env = {key: value for key, value in os.environ.items() if not key.lower().endswith("_proxy")}
    env.update(TMPDIR=str(world.tmp), LC_ALL="C")
    return subprocess.run(
        ["/bin/bash", "-c", script], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def madison(stdout: str) -> dict[str, set[str]]:
    offered: dict[str, set[str]] = {}
    for line in stdout.splitlines():
        name, version, source = (part.strip() for part in line.split("|"))
        uri, suite = source.split()[:2]
        offered.setdefault(name, set()).add(f"{version} {uri} {suite.split('/')[0]}")
    return offered


class BoxApt:
    """apt with a box's /etc/apt (sources.list.d, preferences.d) and state under one temporary directory."""

    def __init__(self, base: Path, archive: str, keyring: Path, sources: str = "", pref: str = "") -> None:
        self.base = base
        for sub in ("etc/apt.conf.d", "etc/sources.list.d", "etc/preferences.d", "state/lists/partial"):
            (base / sub).mkdir(parents=True)
        (base / "cache/archives/partial").mkdir(parents=True)
        (base / "state/status").touch()
        (base / "etc/sources.list").write_text(f"deb [signed-by={keyring}] {archive} jammy-updates restricted\n")
        if sources:
            (base / "etc/sources.list.d/gpubox-driver-snapshot.list").write_text(sources)
        if pref:
            (base / "etc/preferences.d/60-gpubox-nvidia-driver.pref").write_text(pref)
        user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
        (base / "apt.conf").write_text(
            f'Dir::Etc "{base}/etc/";\nDir::State "{base}/state/";\nDir::State::status "{base}/state/status";\n'
            f'Dir::Cache "{base}/cache/";\nDebug::NoLocking "true";\nAPT::Sandbox::User "{user}";\n'
            'Acquire::http::Proxy "DIRECT";\n'
        )

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "APT_CONFIG": str(self.base / "apt.conf"), "LC_ALL": "C"}
        return subprocess.run(list(args), capture_output=True, text=True, env=env, check=False, timeout=120)

    def update(self) -> subprocess.CompletedProcess[str]:
        return self("apt-get", "update")

    def candidates(self, *names: str) -> dict[str, str]:
        proc = self("apt-cache", "policy", *names)
        assert proc.returncode == 0, proc.stderr
        return parse_policy(proc.stdout)  # the one reader of apt-cache policy (preflight's)


def pref(snapshot: dict) -> str:
    variables = {
        "ansible_managed": "Ansible managed",
        "_nvidia_driver_version": PIN,
        "__nvidia_driver_pin_globs": GLOBS,
        "_nvidia_driver_snapshot": snapshot,
    }
    return render_template(PREF, variables)


# --- preflight: the look-up -----------------------------------------------------------------------------------------


def test_the_look_up_reads_the_pinned_build_from_the_snapshot_alone_and_leaves_nothing(world: World) -> None:
    proc = look_up(world)
    assert proc.returncode == 0, proc.stderr
    assert "W:" not in proc.stderr and "E:" not in proc.stderr, proc.stderr
    snapshot_uri = f"{world.service}{GOOD}"
    assert madison(proc.stdout) == {name: {f"{PIN} {snapshot_uri} {suite}" for suite in SUITES} for name in VERSIONED}
    assert list(world.tmp.iterdir()) == []  # its private apt state is gone


def test_control_the_archive_alone_offers_only_the_transitional_build(world: World, tmp_path: Path) -> None:
    """Today's behaviour, which preflight refused: the box's own apt has no 535.274.02 to offer."""
    apt = BoxApt(tmp_path / "box", world.archive, world.keyring, pref=pref(plan(world, ds.NONE)))
    assert apt.update().returncode == 0
    offered = madison(apt("apt-cache", "madison", *VERSIONED).stdout)
    versions = {name: {entry.split()[0] for entry in entries} for name, entries in offered.items()}
    assert versions == {name: {NOW_535} for name in VERSIONED}
    assert apt.candidates(*VERSIONED) == dict.fromkeys(VERSIONED, NOW_535)  # the role's assertion would refuse


# --- the box: the role's sources file and pin file -----------------------------------------------------------------


def test_with_the_snapshot_apt_takes_the_pinned_build_from_it_and_nothing_else(world: World, tmp_path: Path) -> None:
    role = plan(world)
    apt = BoxApt(tmp_path / "box", world.archive, world.keyring, sources=role["sources"], pref=pref(role))
    update = apt.update()
    assert update.returncode == 0 and "W:" not in update.stderr, update.stdout + update.stderr
    got = apt.candidates(*VERSIONED, "nvidia-kernel-common-535-server", "nvidia-utils-580-server", "tool", "libfoo1")
    assert got == {
        **dict.fromkeys([*VERSIONED, "nvidia-kernel-common-535-server"], PIN),
        "nvidia-utils-580-server": NOW_580,  # the archive's: the snapshot's older 580 is at -1
        "tool": "2.0",  # the archive's, though the snapshot's 3.0 is newer
        "libfoo1": "(none)",  # only the snapshot has it: nothing else comes from there
    }
    # the real download: the bytes of every package come from the snapshot and match its signed index
    uris = apt("apt-get", "install", "-y", "--print-uris", "--no-install-recommends", *VERSIONED)
    fetched = [line.split()[0].strip("'") for line in uris.stdout.splitlines() if line.startswith("'")]
    assert sorted(uri.rsplit("/", 1)[1] for uri in fetched) == sorted(
        f"{name}_{PIN}_amd64.deb" for name in [*VERSIONED, "nvidia-kernel-common-535-server"]
    )
    assert all(uri.startswith(f"{world.service}{GOOD}/pool/") for uri in fetched), fetched
    download = apt("apt-get", "install", "-y", "--download-only", "--no-install-recommends", *VERSIONED)
    assert download.returncode == 0, download.stdout + download.stderr
    debs = sorted((apt.base / "cache/archives").glob("*.deb"))
    assert len(debs) == len(VERSIONED) + 1, debs
    for deb in debs:
        served = world.snapshots / "ubuntu" / GOOD / "pool" / "restricted" / deb.name.replace("%3a", ":")
        assert deb.read_bytes() == served.read_bytes(), deb.name


def test_control_without_the_origin_stanza_the_snapshot_leaks_other_packages(world: World, tmp_path: Path) -> None:
    role = plan(world)
    apt = BoxApt(tmp_path / "box", world.archive, world.keyring, sources=role["sources"], pref=pref({}))
    assert apt.update().returncode == 0
    got = apt.candidates("nvidia-utils-535-server", "tool", "libfoo1")
    assert got == {"nvidia-utils-535-server": PIN, "tool": "3.0", "libfoo1": "1.0"}


# --- signatures: checked as for any source ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("snapshot", "says"),
    [(OTHER_KEY, "NO_PUBKEY"), (UNSIGNED, "is not signed")],
    ids=["another-key", "unsigned"],
)
def test_a_snapshot_the_archive_key_did_not_sign_is_refused(world: World, tmp_path: Path, snapshot: str, says: str):
    proc = look_up(world, snapshot)
    assert proc.returncode == 100 and proc.stdout == "", proc.stdout + proc.stderr
    assert says in proc.stderr and "E: " in proc.stderr, proc.stderr
    assert list(world.tmp.iterdir()) == []
    # on the box: apt refuses the index, so the pinned build is nowhere and the role's candidate assertion refuses
    role = plan(world, snapshot)
    apt = BoxApt(tmp_path / "box", world.archive, world.keyring, sources=role["sources"], pref=pref(role))
    update = apt.update()
    assert update.returncode == 100 and says in update.stderr, update.stderr
    assert apt.candidates(*VERSIONED) == dict.fromkeys(VERSIONED, NOW_535)
    assert PIN not in apt("apt-cache", "madison", *VERSIONED).stdout


def test_a_snapshot_the_box_cannot_reach_is_refused_not_ignored(world: World, tmp_path: Path) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.2", 0))  # a port bound and never listened on: connections are refused
    try:
        gone = dataclasses.replace(world, service=f"http://127.0.0.2:{closed.getsockname()[1]}/ubuntu/")
        proc = look_up(gone)
        assert proc.returncode == 100 and proc.stdout == "", proc.stdout + proc.stderr
        assert "E: Failed to fetch" in proc.stderr, proc.stderr
        # control: apt-get update's default is a warning and exit 0, so the look-up would have passed on nothing
        role = plan(gone)
        apt = BoxApt(tmp_path / "box", world.archive, world.keyring, sources=role["sources"], pref=pref(role))
        update = apt.update()
        assert update.returncode == 0 and "W: Failed to fetch" in update.stderr, update.stdout + update.stderr
        assert PIN not in apt("apt-cache", "madison", *VERSIONED).stdout
    finally:
        closed.close()


# --- another source on the snapshot host ------------------------------------------------------------------------------


def test_another_source_on_the_snapshot_host_is_found_in_apts_own_policy(world: World, tmp_path: Path) -> None:
    role = plan(world)
    second = plan(world, SECOND)["sources"]  # another snapshot of the same service, as a whole archive would be
    box = BoxApt(tmp_path / "box", world.archive, world.keyring, sources=role["sources"] + second, pref=pref(role))
    assert box.update().returncode == 0
    found = ds.foreign_sources(box("apt-cache", "policy").stdout, role["origin"], role["uri"])
    assert found == sorted(f"{world.service}{SECOND} {suite}/restricted" for suite in SUITES)
    alone = BoxApt(tmp_path / "alone", world.archive, world.keyring, sources=role["sources"], pref=pref(role))
    assert alone.update().returncode == 0
    assert ds.foreign_sources(alone("apt-cache", "policy").stdout, role["origin"], role["uri"]) == []
