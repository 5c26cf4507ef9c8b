"""Tests for the test-only CUDA apt repository (harness/aptrepo).

The repository is built for real (real wheels from PyPI, real dpkg-deb, real gpg), served by
serve.py on a free loopback port and read by a sandboxed apt-get that never touches the host's
apt state or installs anything. What it simulates is NVIDIA's server, not apt.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils.kernel_modules import parse_policy

ROOT = Path(__file__).resolve().parents[2]
APTREPO = ROOT / "harness/aptrepo"
BUILD = APTREPO / "build_repo.py"
SERVE = APTREPO / "serve.py"
CACHE = Path(os.environ.get("GPUBOX_CACHE", Path.home() / ".cache/gpubox")) / "aptrepo"

# The pin from docs/facts.md ("CUDA apt repository"), as the cuda_toolkit role writes it.
FACTS_PIN_PACKAGES = "nvidia-* libnvidia-* cuda-drivers*"

pytestmark = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("dpkg-deb", "gpg", "gpgv", "apt-get")),
    reason="needs dpkg-deb, gpg, gpgv and apt-get (apt-get install dpkg-dev gnupg)",
)


def load_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_repo", BUILD)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


br = load_module()


def placeholder_sim_inputs(base: Path) -> tuple[Path, Path]:
    """Stand-ins for the fake nvidia-smi and its fixtures, for builds that must vary them."""
    smi = base / "nvidia-smi"
    smi.parent.mkdir(parents=True, exist_ok=True)
    smi.write_text("#!/usr/bin/env python3\nprint('placeholder')\n")
    smi.chmod(0o755)
    box = base / "fixtures/box-a"
    box.mkdir(parents=True, exist_ok=True)
    (box / "q.xml").write_text("<nvidia_smi_log/>\n")
    return smi, base / "fixtures"


def run_build(out: Path, cache: Path, sim: tuple[Path, Path] | None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(BUILD), "--out", str(out), "--cache", str(cache)]
    if sim:
        cmd += ["--sim-nvidia-smi", str(sim[0]), "--sim-fixtures", str(sim[1])]
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=900)


def checked_build(out: Path, cache: Path, sim: tuple[Path, Path] | None) -> str:
    proc = run_build(out, cache, sim)
    if proc.returncode == br.EXIT_DOWNLOAD:
        pytest.fail(f"PyPI unreachable and wheels not cached in {cache}/wheels: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@dataclass(frozen=True)
class Built:
    repo: Path
    sim: tuple[Path, Path] | None


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The repository, built once per session; real sim inputs when they exist yet."""
    base = tmp_path_factory.mktemp("aptrepo")
    real = br.DEFAULT_FAKE_NVIDIA_SMI.is_file() and any(p.is_dir() for p in br.DEFAULT_FIXTURES.glob("*"))
    sim = None if real else placeholder_sim_inputs(base / "sim-inputs")
    checked_build(base / "repo", CACHE, sim)
    return Built(base / "repo", sim)


def parse_stanzas(text: str) -> list[dict[str, str]]:
    stanzas = []
    for block in text.strip().split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in block.splitlines():
            if line.startswith((" ", "\t")):
                fields[key] += "\n" + line.strip()
            else:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        stanzas.append(fields)
    return stanzas


def packages(repo: Path) -> dict[str, dict[str, str]]:
    return {s["Package"]: s for s in parse_stanzas((repo / "Packages").read_text())}


def release_fields(repo: Path) -> dict[str, str]:
    return parse_stanzas((repo / "Release").read_text())[0]


# ---------------------------------------------------------------- pure helpers


def test_control_text_folds_description_and_lists_depends() -> None:
    deb = br.Deb("pkg", "1.0-1", "summary\nfirst line\n\nafter blank", depends=("a", "b (>= 2)"))
    text = br.control_text(deb)
    assert "Depends: a, b (>= 2)\n" in text
    assert text.endswith("Description: summary\n first line\n .\n after blank\n")


def test_interpreter_depends_reads_the_shebang() -> None:
    assert br.interpreter_depends(b"#!/usr/bin/env python3\nx") == ("python3",)
    assert br.interpreter_depends(b"#!/bin/sh\n# python3 mentioned later\n") == ()


def test_sim_inputs_name_the_missing_path(tmp_path: Path) -> None:
    with pytest.raises(br.BuildError, match="nvidia-smi not found"):
        br.sim_inputs(tmp_path / "absent", tmp_path)
    smi, _ = placeholder_sim_inputs(tmp_path)
    with pytest.raises(br.BuildError, match="no fixture directories"):
        br.sim_inputs(smi, tmp_path / "empty")


# ---------------------------------------------------------------- the built repository


def test_keyring_and_fingerprint_agree(built: Built) -> None:
    fpr = (built.repo / "KEY_FINGERPRINT").read_text().strip()
    assert len(fpr) == 40 and all(c in "0123456789ABCDEF" for c in fpr)
    shown = subprocess.run(
        ["gpg", "--show-keys", "--with-colons", str(built.repo / "cuda-archive-keyring.gpg")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert next(line.split(":")[9] for line in shown.splitlines() if line.startswith("fpr:")) == fpr
    assert (built.repo / "cuda-archive-keyring.gpg").read_bytes()[:1] != b"-"  # binary, not armored


def gpgv(keyring: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    cmd = ["gpgv", "--keyring", str(keyring), *map(str, files)]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def test_release_signatures_verify_and_detect_tampering(built: Built, tmp_path: Path) -> None:
    keyring = built.repo / "cuda-archive-keyring.gpg"
    assert gpgv(keyring, built.repo / "InRelease").returncode == 0
    assert gpgv(keyring, built.repo / "Release.gpg", built.repo / "Release").returncode == 0
    tampered = tmp_path / "Release"
    tampered.write_text((built.repo / "Release").read_text().replace("NVIDIA CUDA", "NVIDIA CUDX"))
    assert gpgv(keyring, built.repo / "Release.gpg", tampered).returncode != 0
    signed = (built.repo / "InRelease").read_text()
    assert (built.repo / "Release").read_text() in signed


def test_release_fields_and_index_hashes(built: Built) -> None:
    fields = release_fields(built.repo)
    assert fields["Origin"] == "NVIDIA"
    assert fields["Label"] == "NVIDIA CUDA"
    assert fields["Architecture"] and fields["Date"]
    raw = (built.repo / "Packages").read_bytes()
    assert gzip.decompress((built.repo / "Packages.gz").read_bytes()) == raw
    for title, algo in (("MD5Sum", "md5"), ("SHA256", "sha256")):
        entries = {line.split()[2]: line.split()[:2] for line in fields[title].splitlines() if line}
        for name in ("Packages", "Packages.gz"):
            data = (built.repo / name).read_bytes()
            assert entries[name] == [hashlib.new(algo, data).hexdigest(), str(len(data))]


def test_packages_index_matches_every_deb(built: Built) -> None:
    index = packages(built.repo)
    on_disk = {p.name for p in built.repo.glob("*.deb")}
    assert {s["Filename"].removeprefix("./") for s in index.values()} == on_disk
    for name, stanza in index.items():
        deb = built.repo / stanza["Filename"]
        data = deb.read_bytes()
        assert int(stanza["Size"]) == len(data), name
        assert stanza["SHA256"] == hashlib.sha256(data).hexdigest(), name
        assert stanza["MD5sum"] == hashlib.md5(data).hexdigest(), name
        for key in ("Package", "Version", "Architecture", "Depends"):
            got = subprocess.run(["dpkg-deb", "-f", str(deb), key], capture_output=True, text=True, check=True)
            assert got.stdout.strip() == stanza.get(key, ""), (name, key)
    assert "gpubox-sim-gpu" not in index


def test_real_cuda_names_and_versions(built: Built) -> None:
    index = packages(built.repo)
    assert index["cuda-toolkit-12-2"]["Version"] == "12.2.2-1"
    assert index["cuda-toolkit-12-4"]["Version"] == "12.4.1-1"
    depends = index["cuda-toolkit-12-2"]["Depends"]
    for dep in ("cuda-nvcc-12-2", "cuda-cudart-dev-12-2", "cuda-toolkit-config-common"):
        assert dep in depends
    for name in ("cuda-nvcc-12-2", "cuda-cudart-12-2", "cuda-cudart-dev-12-2"):
        assert index[name]["Version"] == "12.2.140-1"
    assert not any("nvidia" in index[name].get("Depends", "") for name in index if name.startswith("cuda-toolkit"))


def test_decoys_outrank_debian_and_carry_no_payload(built: Built) -> None:
    index = packages(built.repo)
    debian_535 = "535.261.03-1"
    for name in ("nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "libnvidia-ml1"):
        assert index[name]["Version"] == "545.23.08-1"
        newer = subprocess.run(["dpkg", "--compare-versions", index[name]["Version"], "gt", debian_535])
        assert newer.returncode == 0
    for name in ("cuda-drivers", "cuda-drivers-545"):
        assert index[name]["Version"] == "545.23.08-1"
    for name in br.DECOY_NAMES:
        listing = subprocess.run(
            ["dpkg-deb", "-c", str(built.repo / index[name]["Filename"])],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        files = [line.split()[-1] for line in listing.splitlines() if not line.startswith("d")]
        assert files == [f"./usr/share/doc/{name}/DECOY"], name


def extract(repo: Path, names: list[str], dest: Path) -> Path:
    index = packages(repo)
    for name in names:
        subprocess.run(["dpkg-deb", "-x", str(repo / index[name]["Filename"]), str(dest)], check=True)
    return dest / "usr/local/cuda-12.2"


# A hand-written PTX kernel (adds 1 to each element) for ptxas to assemble to SASS.
ADD_ONE_PTX = """.version 8.2
.target sm_86
.address_size 64
.visible .entry add_one(.param .u64 p)
{
    .reg .b32 %r<3>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [p];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd2, %rd2, %rd3;
    ld.global.u32 %r2, [%rd2];
    add.s32 %r2, %r2, 1;
    st.global.u32 [%rd2], %r2;
    ret;
}
"""

HOST_PROGRAM = """#include <cstdio>
#include <cuda_runtime.h>
int main() {
  int version = 0, count = -1;
  if (cudaRuntimeGetVersion(&version) != cudaSuccess) return 1;
  cudaError_t err = cudaGetDeviceCount(&count);
  std::printf("%d %s\\n", version, cudaGetErrorName(err));
  return 0;
}
"""


@pytest.mark.skipif(not shutil.which("g++"), reason="needs g++ (apt-get install g++)")
def test_toolkit_payload_is_real_cuda_12_2(built: Built, tmp_path: Path) -> None:
    cuda = extract(built.repo, ["cuda-nvcc-12-2", "cuda-cudart-12-2", "cuda-cudart-dev-12-2"], tmp_path / "root")
    version = subprocess.run([cuda / "bin/ptxas", "--version"], capture_output=True, text=True, check=True)
    assert "release 12.2, V12.2.140" in version.stdout
    (tmp_path / "k.ptx").write_text(ADD_ONE_PTX)
    for arch in ("sm_86", "sm_89"):  # RTX 3090, RTX 4090
        cubin = tmp_path / f"k_{arch}.cubin"
        subprocess.run([cuda / "bin/ptxas", f"-arch={arch}", tmp_path / "k.ptx", "-o", cubin], check=True)
        assert cubin.read_bytes()[:4] == b"\x7fELF"
    (tmp_path / "h.cpp").write_text(HOST_PROGRAM)
    exe = tmp_path / "h"
    compile_cmd = ["g++", f"-I{cuda}/include", tmp_path / "h.cpp", f"-L{cuda}/lib64", "-lcudart", "-o", exe]
    subprocess.run(compile_cmd, check=True)
    env = {**os.environ, "LD_LIBRARY_PATH": str(cuda / "lib64")}
    out = subprocess.run([exe], capture_output=True, text=True, check=True, env=env).stdout.split()
    assert out[0] == "12020"  # CUDA 12.2 runtime
    assert out[1] in ("cudaErrorInsufficientDriver", "cudaErrorNoDevice")  # no GPU driver here
    # No PyPI wheel carries the nvcc driver binary; the package must not pretend it does.
    assert not (cuda / "bin/nvcc").exists()


def test_config_common_points_usr_local_cuda_at_the_minor_version(built: Built) -> None:
    index = packages(built.repo)
    for name, prefix in (
        ("cuda-toolkit-12-2-config-common", "/usr/local/cuda-12.2"),
        ("cuda-toolkit-12-4-config-common", "/usr/local/cuda-12.4"),
    ):
        postinst = subprocess.run(
            ["dpkg-deb", "-I", str(built.repo / index[name]["Filename"]), "postinst"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert f"update-alternatives --install /usr/local/cuda cuda {prefix} " in postinst


def test_sim_package_is_outside_the_signed_index(built: Built) -> None:
    debs = list((built.repo / "sim").glob("*.deb"))
    assert len(debs) == 1 and debs[0].name.startswith("gpubox-sim-gpu_0.1.0+")
    listing = subprocess.run(["dpkg-deb", "-c", str(debs[0])], capture_output=True, text=True, check=True).stdout
    assert "-rwxr-xr-x root/root" in next(line for line in listing.splitlines() if "/usr/local/bin/nvidia-smi" in line)
    fixtures = br.DEFAULT_FIXTURES if built.sim is None else built.sim[1]
    for src in (p for p in fixtures.glob("*/**/*") if p.is_file()):
        assert f"./usr/share/gpubox-sim/fixtures/{src.relative_to(fixtures)}" in listing


def test_rebuild_is_cached_reproducible_and_follows_inputs(tmp_path: Path) -> None:
    sim = placeholder_sim_inputs(tmp_path / "inputs")
    out = tmp_path / "repo"
    checked_build(out, CACHE, sim)
    packages_before = (out / "Packages").read_bytes()
    inrelease_mtime = (out / "InRelease").stat().st_mtime_ns
    started = time.monotonic()
    assert "up to date" in checked_build(out, CACHE, sim)
    assert time.monotonic() - started < 5
    assert (out / "InRelease").stat().st_mtime_ns == inrelease_mtime
    old_sim = next((out / "sim").glob("*.deb")).name
    (sim[1] / "box-a/q.xml").write_text("<nvidia_smi_log>changed</nvidia_smi_log>\n")
    assert "built" in checked_build(out, CACHE, sim)
    assert next((out / "sim").glob("*.deb")).name != old_sim
    assert (out / "Packages").read_bytes() == packages_before  # same inputs, byte-identical .debs


def test_refuses_to_replace_a_foreign_directory(tmp_path: Path) -> None:
    out = tmp_path / "precious"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    proc = run_build(out, CACHE, placeholder_sim_inputs(tmp_path / "inputs"))
    if proc.returncode == br.EXIT_DOWNLOAD:
        pytest.fail(f"PyPI unreachable and wheels not cached: {proc.stderr}")
    assert proc.returncode == 1 and "not built by build_repo.py" in proc.stderr
    assert (out / "keep.txt").read_text() == "mine"


def test_serve_refuses_an_unbuilt_root(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SERVE), "--root", str(tmp_path), "--port", "0"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "build_repo.py --out" in proc.stderr


# ---------------------------------------------------------------- apt, for real, sandboxed


@pytest.fixture
def served(built: Built) -> Iterator[str]:
    """serve.py on a free loopback port; yields its base URL."""
    proc = subprocess.Popen(
        [sys.executable, str(SERVE), "--root", str(built.repo), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("serving "), line
        yield line.split(" on ")[1].strip()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@dataclass(frozen=True)
class Apt:
    """apt-get/apt-cache with every directory under one temp dir; no host state is read or written."""

    base: Path

    @classmethod
    def create(cls, base: Path, source_line: str, pin_packages: str | None) -> Apt:
        for sub in ("etc/apt.conf.d", "etc/sources.list.d", "etc/preferences.d", "etc/trusted.gpg.d"):
            (base / sub).mkdir(parents=True)
        for sub in ("state/lists/partial", "cache/archives/partial"):
            (base / sub).mkdir(parents=True)
        (base / "state/status").touch()
        (base / "etc/sources.list").write_text(source_line + "\n")
        if pin_packages:
            (base / "etc/preferences.d/cuda-repo-drivers").write_text(
                f"Package: {pin_packages}\nPin: release l=NVIDIA CUDA\nPin-Priority: -1\n"
            )
        user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
        # Read after the host's apt.conf.d, so the #clear lines drop its hooks (e.g. docker-clean).
        (base / "apt.conf").write_text(
            f'Dir::Etc "{base}/etc/";\n'
            'Dir::Etc::sourcelist "sources.list";\nDir::Etc::sourceparts "sources.list.d";\n'
            'Dir::Etc::preferences "preferences";\nDir::Etc::preferencesparts "preferences.d";\n'
            'Dir::Etc::trusted "trusted.gpg";\nDir::Etc::trustedparts "trusted.gpg.d";\n'
            f'Dir::State "{base}/state/";\nDir::State::status "{base}/state/status";\n'
            f'Dir::Cache "{base}/cache/";\n'
            f'Debug::NoLocking "true";\nAPT::Sandbox::User "{user}";\nAcquire::http::Proxy "DIRECT";\n'
            "#clear APT::Update::Pre-Invoke;\n#clear APT::Update::Post-Invoke;\n"
            "#clear APT::Update::Post-Invoke-Success;\n#clear DPkg::Pre-Invoke;\n#clear DPkg::Post-Invoke;\n"
        )
        return cls(base)

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "APT_CONFIG": str(self.base / "apt.conf"), "LC_ALL": "C"}
        return subprocess.run(list(args), capture_output=True, text=True, env=env, check=False, timeout=120)

    def candidates(self, *names: str) -> dict[str, str]:
        proc = self("apt-cache", "policy", *names)
        assert proc.returncode == 0, proc.stderr
        return parse_policy(proc.stdout)  # the one reader of apt-cache policy (preflight's)


def apt_for(tmp_path: Path, url: str, keyring: Path, pin: str | None) -> Apt:
    return Apt.create(tmp_path / "apt", f"deb [signed-by={keyring}] {url} /", pin)


def test_apt_accepts_the_signed_repo(built: Built, served: str, tmp_path: Path) -> None:
    apt = apt_for(tmp_path, served, built.repo / "cuda-archive-keyring.gpg", None)
    update = apt("apt-get", "update")
    assert update.returncode == 0, update.stdout + update.stderr
    assert "W:" not in update.stderr and "E:" not in update.stderr, update.stderr
    assert list((apt.base / "state/lists").glob("*_InRelease"))  # apt keeps only verified InRelease
    got = apt.candidates("cuda-toolkit-12-2", "cuda-toolkit-12-4", "nvidia-smi")
    assert got == {
        "cuda-toolkit-12-2": "12.2.2-1",
        "cuda-toolkit-12-4": "12.4.1-1",
        "nvidia-smi": "545.23.08-1",
    }
    sim = apt("apt-get", "-s", "install", "cuda-toolkit-12-2")
    assert sim.returncode == 0, sim.stdout + sim.stderr
    installs = {line.split()[1] for line in sim.stdout.splitlines() if line.startswith("Inst ")}
    assert installs == {
        "cuda-toolkit-12-2",
        "cuda-nvcc-12-2",
        "cuda-cudart-12-2",
        "cuda-cudart-dev-12-2",
        "cuda-toolkit-config-common",
        "cuda-toolkit-12-config-common",
        "cuda-toolkit-12-2-config-common",
    }


def test_apt_rejects_the_repo_under_another_key(built: Built, served: str, tmp_path: Path) -> None:
    other = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
    if not other.is_file():
        pytest.fail("needs debian-archive-keyring (apt-get install debian-archive-keyring), a key that did not sign")
    apt = apt_for(tmp_path, served, other, None)
    update = apt("apt-get", "update")
    assert update.returncode != 0 and "NO_PUBKEY" in update.stdout + update.stderr
    assert apt.candidates("cuda-toolkit-12-2") == {}  # apt knows no such package: the index was dropped


def test_driver_pin_leaves_no_decoy_candidate(built: Built, served: str, tmp_path: Path) -> None:
    pin = FACTS_PIN_PACKAGES + " libcuda*"
    apt = apt_for(tmp_path, served, built.repo / "cuda-archive-keyring.gpg", pin)
    assert apt("apt-get", "update").returncode == 0
    got = apt.candidates("cuda-toolkit-12-2", *br.DECOY_NAMES)
    assert got.pop("cuda-toolkit-12-2") == "12.2.2-1"
    assert got == dict.fromkeys(br.DECOY_NAMES, "(none)")
    trap = apt("apt-get", "-s", "install", "cuda-12-2")  # `cuda-12-2` pulls NVIDIA's driver: refused
    assert trap.returncode != 0 and "cuda-drivers" in trap.stdout


def test_facts_md_pin_alone_misses_libcuda1(built: Built, served: str, tmp_path: Path) -> None:
    """NVIDIA's debian12 repo names the CUDA driver library libcuda1, which `nvidia-* libnvidia-*
    cuda-drivers*` does not match: a role using only that pattern lets the 545 decoy win."""
    apt = apt_for(tmp_path, served, built.repo / "cuda-archive-keyring.gpg", FACTS_PIN_PACKAGES)
    assert apt("apt-get", "update").returncode == 0
    got = apt.candidates(*br.DECOY_NAMES)
    assert {name for name, cand in got.items() if cand != "(none)"} == {"libcuda1"}
