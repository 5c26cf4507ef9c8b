#!/usr/bin/env python3
"""Build the TEST-ONLY stand-in for NVIDIA's CUDA apt repository (debian12 x86_64 layout).

SIMULATED: this repository replaces developer.download.nvidia.com in tests, which cannot reach it.
Package names and versions are NVIDIA's; the payload is either real CUDA 12.2 files taken from
NVIDIA's PyPI wheels (ptxas, libnvvm, libdevice, headers, libcudart) or empty. The driver packages
are decoys at a version above Debian's 535 driver: the roles must pin them away. The index is signed
with a throwaway key that lives in the cache directory. See README.md beside this file.

usage: build_repo.py --out DIR [--cache DIR]
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.utils import format_datetime
from pathlib import Path

SCRIPT = Path(__file__).resolve()
REPO_ROOT = SCRIPT.parents[2]  # harness/aptrepo/build_repo.py
DEFAULT_FAKE_NVIDIA_SMI = REPO_ROOT / "harness/fakegpu/nvidia-smi"
DEFAULT_FIXTURES = REPO_ROOT / "tests/fixtures/nvidia-smi"
DEFAULT_CACHE = Path.home() / ".cache/gpubox/aptrepo"

# Fixed timestamp for file mtimes and the Release Date: same inputs give byte-identical .debs.
SOURCE_DATE_EPOCH = 1700000000
# zstd (dpkg >= 1.21.18, Debian 12 has 1.21.22+): 0.3 s for the 50 MB toolkit payload here, where
# dpkg-deb's default xz took 50 s on 2 cores. NVIDIA's own .debs use xz; apt does not care.
COMPRESSION = ("-Zzstd",)
ARCH = "amd64"
MAINTAINER = "gpubox test harness (simulated NVIDIA CUDA repo) <gpubox-tests@localhost>"
KEY_UID = "gpubox throwaway CUDA test repo key <gpubox-tests@localhost>"
STAMP_NAME = ".gpubox-aptrepo-stamp"
EXIT_DOWNLOAD = 3  # the wheels are neither cached nor downloadable (tests skip on this code only)

CUDA_22 = "/usr/local/cuda-12.2"
CUDA_24 = "/usr/local/cuda-12.4"
TARGET_22 = f"{CUDA_22}/targets/x86_64-linux"
CUDA_22_COMPONENT = "12.2.140-1"  # CUDA 12.2.2 (update 2) ships nvcc and cudart 12.2.140
CUDA_24_COMPONENT = "12.4.127-1"  # CUDA 12.4.1 ships cudart 12.4.127
# Version of the real driver packages in NVIDIA's debian12 repo at CUDA 12.3 (above Debian's 535).
DECOY_VERSION = "545.23.08-1"
DECOY_NAMES = (
    "nvidia-driver",
    "nvidia-kernel-dkms",
    "nvidia-smi",
    "libcuda1",
    "libnvidia-ml1",
    "cuda-drivers-545",
    "cuda-drivers",
)


@dataclass(frozen=True)
class Wheel:
    """A pinned PyPI wheel whose files become package payload."""

    project: str
    version: str
    filename: str
    sha256: str


# There is no 12.2 nvcc *driver* binary on PyPI: every nvidia-cuda-nvcc-cu12 wheel from 12.0 to 12.9
# carries only ptxas, libnvvm, libdevice and headers (checked 12.2.140 .. 12.9.86). See README.md.
WHEELS = (
    Wheel(
        "nvidia-cuda-nvcc-cu12",
        "12.2.140",
        "nvidia_cuda_nvcc_cu12-12.2.140-py3-none-manylinux1_x86_64.whl",
        "c6ff4ae7a636eb6cab7621191e19ac3779690686bbcf52c04d8b1ca2944e1e27",
    ),
    Wheel(
        "nvidia-cuda-runtime-cu12",
        "12.2.140",
        "nvidia_cuda_runtime_cu12-12.2.140-py3-none-manylinux1_x86_64.whl",
        "acb9cb7e44594a3512533497ea790d9f0b0e399abcc888584c157d1ffa080e41",
    ),
)


class BuildError(Exception):
    """A failure whose message names the input and the fix."""

    exit_code = 1


class DownloadError(BuildError):
    exit_code = EXIT_DOWNLOAD


@dataclass
class Deb:
    """One binary package: control fields plus an in-memory payload."""

    name: str
    version: str
    description: str
    arch: str = ARCH
    section: str = "devel"
    depends: tuple[str, ...] = ()
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)  # abs path -> (data, mode)
    symlinks: dict[str, str] = field(default_factory=dict)  # abs path -> target
    scripts: dict[str, str] = field(default_factory=dict)  # postinst/prerm -> shell text

    @property
    def filename(self) -> str:
        return f"{self.name}_{self.version.split(':')[-1]}_{self.arch}.deb"


# ---------------------------------------------------------------- pure helpers


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_digest(path: Path, algo: str) -> str:
    h = hashlib.new(algo)
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def installed_size_kib(deb: Deb) -> int:
    """Approximate dpkg's Installed-Size: KiB per file rounded up, one per symlink."""
    return sum(-(-len(data) // 1024) for data, _ in deb.files.values()) + len(deb.symlinks)


def control_text(deb: Deb) -> str:
    lines = [
        f"Package: {deb.name}",
        f"Version: {deb.version}",
        f"Architecture: {deb.arch}",
        f"Maintainer: {MAINTAINER}",
        f"Installed-Size: {installed_size_kib(deb)}",
    ]
    if deb.depends:
        lines.append("Depends: " + ", ".join(deb.depends))
    lines += [f"Section: {deb.section}", "Priority: optional"]
    summary, _, body = deb.description.partition("\n")
    lines.append(f"Description: {summary}")
    lines += [f" {line}" if line.strip() else " ." for line in body.splitlines()]
    return "\n".join(lines) + "\n"


def wheel_payload(archive: zipfile.ZipFile, prefix: str, dest: str) -> dict[str, tuple[bytes, int]]:
    """Files under `prefix` in a wheel, placed under `dest`; Python package markers dropped."""
    out: dict[str, tuple[bytes, int]] = {}
    for info in archive.infolist():
        name = info.filename
        if not name.startswith(prefix) or name.endswith(("/", "__init__.py")):
            continue
        mode = 0o755 if (info.external_attr >> 16) & 0o100 else 0o644
        out[f"{dest}/{name[len(prefix) :]}"] = (archive.read(name), mode)
    return out


def doc(name: str, text: str) -> dict[str, tuple[bytes, int]]:
    return {f"/usr/share/doc/{name}/README.gpubox": (text.encode(), 0o644)}


def alternatives_scripts(prefix: str, priority: int) -> dict[str, str]:
    """Maintainer scripts registering /usr/local/cuda and /usr/local/cuda-12 as alternatives.

    NVIDIA's versioned config-common packages do this with update-alternatives (names `cuda` and
    `cuda-12`), so installing a newer minor version moves /usr/local/cuda to it.
    """
    postinst = f"""#!/bin/sh
set -e
if [ "$1" = configure ]; then
    update-alternatives --install /usr/local/cuda cuda {prefix} {priority}
    update-alternatives --install /usr/local/cuda-12 cuda-12 {prefix} {priority}
fi
"""
    prerm = f"""#!/bin/sh
set -e
if [ "$1" = remove ] || [ "$1" = deconfigure ]; then
    update-alternatives --remove cuda {prefix}
    update-alternatives --remove cuda-12 {prefix}
fi
"""
    return {"postinst": postinst, "prerm": prerm}


LDCONFIG_POSTINST = """#!/bin/sh
set -e
if [ "$1" = configure ]; then
    ldconfig
fi
"""


def config_packages() -> list[Deb]:
    common = [
        Deb(
            "cuda-toolkit-config-common",
            CUDA_24_COMPONENT,
            "Common config package for CUDA Toolkit (simulated)\n"
            "Adds /usr/local/cuda's library directory to the dynamic linker path.",
            arch="all",
            files={
                "/etc/ld.so.conf.d/000_cuda.conf": (b"/usr/local/cuda/targets/x86_64-linux/lib\n", 0o644),
            },
            scripts={"postinst": LDCONFIG_POSTINST},
        ),
        Deb(
            "cuda-toolkit-12-config-common",
            CUDA_24_COMPONENT,
            "Common config package for CUDA Toolkit 12 (simulated)\n"
            "Adds /usr/local/cuda-12's library directory to the dynamic linker path.",
            arch="all",
            files={
                "/etc/ld.so.conf.d/988_cuda-12.conf": (
                    b"/usr/local/cuda-12/targets/x86_64-linux/lib\n",
                    0o644,
                ),
            },
            scripts={"postinst": LDCONFIG_POSTINST},
        ),
        Deb(
            "cuda-toolkit-12-2-config-common",
            CUDA_22_COMPONENT,
            "Common config package for CUDA Toolkit 12.2 (simulated)\n"
            "Points /usr/local/cuda and /usr/local/cuda-12 at /usr/local/cuda-12.2 (alternatives).",
            arch="all",
            scripts=alternatives_scripts(CUDA_22, 122),
        ),
        Deb(
            "cuda-toolkit-12-4-config-common",
            CUDA_24_COMPONENT,
            "Common config package for CUDA Toolkit 12.4 (simulated)\n"
            "Points /usr/local/cuda and /usr/local/cuda-12 at /usr/local/cuda-12.4 (alternatives).",
            arch="all",
            scripts=alternatives_scripts(CUDA_24, 124),
        ),
    ]
    return common


CONFIG_DEPENDS_22 = (
    "cuda-toolkit-12-2-config-common",
    "cuda-toolkit-12-config-common",
    "cuda-toolkit-config-common",
)

REAL_NOTE = """This file was added by gpubox's test-only apt repository (harness/aptrepo).
The binaries and headers in this package are NVIDIA's real CUDA {version} files, taken unmodified
from the PyPI wheel {wheel} (sha256 {sha256}).
{extra}"""


def toolkit_12_2_packages(nvcc: zipfile.ZipFile, runtime: zipfile.ZipFile) -> list[Deb]:
    nvcc_whl, rt_whl = WHEELS
    nvcc_files: dict[str, tuple[bytes, int]] = {}
    nvcc_files.update(wheel_payload(nvcc, "nvidia/cuda_nvcc/bin/", f"{CUDA_22}/bin"))
    nvcc_files.update(wheel_payload(nvcc, "nvidia/cuda_nvcc/nvvm/", f"{CUDA_22}/nvvm"))
    nvcc_files.update(wheel_payload(nvcc, "nvidia/cuda_nvcc/include/", f"{TARGET_22}/include"))
    nvcc_files.update(
        doc(
            "cuda-nvcc-12-2",
            REAL_NOTE.format(
                version="12.2.140",
                wheel=nvcc_whl.filename,
                sha256=nvcc_whl.sha256,
                extra="bin/nvcc, cicc, cudafe++, fatbinary and nvlink are ABSENT: no PyPI wheel carries\n"
                "them. ptxas, libnvvm, libdevice and the crt headers are real.\n",
            ),
        )
    )
    libcudart = runtime.read("nvidia/cuda_runtime/lib/libcudart.so.12")
    runtime_note = REAL_NOTE.format(version="12.2.140", wheel=rt_whl.filename, sha256=rt_whl.sha256, extra="")
    cudart = Deb(
        "cuda-cudart-12-2",
        CUDA_22_COMPONENT,
        "CUDA Runtime native Libraries (real 12.2.140 libcudart from PyPI)",
        depends=CONFIG_DEPENDS_22,
        files={
            f"{TARGET_22}/lib/libcudart.so.12.2.140": (libcudart, 0o644),
            **doc("cuda-cudart-12-2", runtime_note),
        },
        symlinks={
            f"{TARGET_22}/lib/libcudart.so.12": "libcudart.so.12.2.140",
            f"{CUDA_22}/lib64": "targets/x86_64-linux/lib",
        },
    )
    cudart_dev = Deb(
        "cuda-cudart-dev-12-2",
        CUDA_22_COMPONENT,
        "CUDA Runtime native dev links, headers (real 12.2.140 headers from PyPI)",
        depends=(f"cuda-cudart-12-2 (>= {CUDA_22_COMPONENT})",),
        files={
            **wheel_payload(runtime, "nvidia/cuda_runtime/include/", f"{TARGET_22}/include"),
            **doc("cuda-cudart-dev-12-2", runtime_note),
        },
        symlinks={
            f"{TARGET_22}/lib/libcudart.so": "libcudart.so.12",
            f"{CUDA_22}/include": "targets/x86_64-linux/include",
        },
    )
    nvcc_deb = Deb(
        "cuda-nvcc-12-2",
        CUDA_22_COMPONENT,
        "CUDA nvcc (real 12.2.140 ptxas, libnvvm, libdevice, crt headers; no nvcc driver)",
        depends=CONFIG_DEPENDS_22,
        files=nvcc_files,
    )
    toolkit = Deb(
        "cuda-toolkit-12-2",
        "12.2.2-1",
        "CUDA Toolkit 12.2 meta-package (simulated subset)\n"
        "Pulls the 12.2 compiler pieces and runtime available from PyPI; see README.gpubox.",
        section="metapackages",
        depends=(
            f"cuda-nvcc-12-2 (>= {CUDA_22_COMPONENT})",
            f"cuda-cudart-dev-12-2 (>= {CUDA_22_COMPONENT})",
            "cuda-toolkit-config-common",
            "cuda-toolkit-12-config-common",
            "cuda-toolkit-12-2-config-common",
        ),
        files=doc("cuda-toolkit-12-2", "Simulated CUDA 12.2.2 meta-package from gpubox's test apt repo.\n"),
    )
    return [cudart, cudart_dev, nvcc_deb, toolkit]


def other_cuda_packages() -> list[Deb]:
    """Payload-free packages that let tests catch the wrong minor version or the `cuda-12-2` trap."""
    return [
        Deb(
            "cuda-toolkit-12-4",
            "12.4.1-1",
            "CUDA Toolkit 12.4 meta-package (simulated, no payload)\n"
            "Present so that tests can prove only the pinned minor version is installed.",
            section="metapackages",
            depends=(
                "cuda-toolkit-config-common",
                "cuda-toolkit-12-config-common",
                "cuda-toolkit-12-4-config-common",
            ),
        ),
        Deb(
            "cuda-runtime-12-2",
            "12.2.2-1",
            "CUDA Runtime 12.2 meta-package (simulated): pulls cuda-drivers, i.e. NVIDIA's driver",
            section="metapackages",
            depends=("cuda-drivers (>= 535.104.05)",),
        ),
        Deb(
            "cuda-12-2",
            "12.2.2-1",
            "CUDA 12.2 meta-package (simulated): toolkit plus runtime, so also NVIDIA's driver",
            section="metapackages",
            depends=("cuda-toolkit-12-2 (>= 12.2.2)", "cuda-runtime-12-2 (>= 12.2.2)"),
        ),
    ]


def decoy_packages() -> list[Deb]:
    upstream = DECOY_VERSION.split("-")[0]
    depends = {
        "cuda-drivers": (f"cuda-drivers-545 (= {DECOY_VERSION})",),
        "cuda-drivers-545": tuple(
            f"{name} (>= {upstream})" for name in DECOY_NAMES if name not in ("cuda-drivers", "cuda-drivers-545")
        ),
    }
    return [
        Deb(
            name,
            DECOY_VERSION,
            f"DECOY of NVIDIA's CUDA-repo package {name}: must never be installed\n"
            "gpubox's roles pin the CUDA repo's driver packages to -1; tests prove this one stays out.",
            section="non-free/libs" if name.startswith("lib") else "non-free/x11",
            depends=depends.get(name, ()),
            files={
                f"/usr/share/doc/{name}/DECOY": (
                    f"decoy: must never be installed ({name} {DECOY_VERSION} from gpubox's simulated "
                    "NVIDIA CUDA repo; the driver must come from Debian's archive)\n".encode(),
                    0o644,
                )
            },
        )
        for name in DECOY_NAMES
    ]


def interpreter_depends(script: bytes) -> tuple[str, ...]:
    first = script.split(b"\n", 1)[0]
    return ("python3",) if first.startswith(b"#!") and b"python3" in first else ()


def sim_inputs(fake_smi: Path, fixtures: Path) -> list[tuple[str, Path]]:
    """(install path, source) pairs for the simulator package; raises if an input is missing."""
    if not fake_smi.is_file():
        raise BuildError(
            f"simulated nvidia-smi not found at {fake_smi}: create it (harness/fakegpu) or pass --sim-nvidia-smi PATH"
        )
    boxes = sorted(p for p in fixtures.iterdir() if p.is_dir()) if fixtures.is_dir() else []
    if not boxes:
        raise BuildError(
            f"no fixture directories under {fixtures}: capture at least one box "
            "(tests/fixtures/nvidia-smi/<box>/) or pass --sim-fixtures DIR"
        )
    pairs = [("/usr/local/bin/nvidia-smi", fake_smi)]
    for box in boxes:
        for src in sorted(p for p in box.rglob("*") if p.is_file()):
            pairs.append((f"/usr/share/gpubox-sim/fixtures/{src.relative_to(fixtures)}", src))
    return pairs


def sim_package(pairs: list[tuple[str, Path]], version: str) -> Deb:
    files: dict[str, tuple[bytes, int]] = {}
    for dest, src in pairs:
        files[dest] = (src.read_bytes(), 0o755 if dest == "/usr/local/bin/nvidia-smi" else 0o644)
    return Deb(
        "gpubox-sim-gpu",
        version,
        "gpubox TEST-ONLY GPU simulator: an nvidia-smi that replays real captures\n"
        "Installed by the test harness only, never by the roles. Fixtures are under\n"
        "/usr/share/gpubox-sim/fixtures/<box>/.",
        arch="all",
        section="misc",
        depends=interpreter_depends(files["/usr/local/bin/nvidia-smi"][0]),
        files=files,
    )


def inputs_digest(parts: list[tuple[str, bytes]]) -> str:
    h = hashlib.sha256()
    for name, data in sorted(parts):
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def packages_stanza(control: str, filename: str, data_path: Path) -> str:
    size = data_path.stat().st_size
    extra = [
        f"Filename: ./{filename}",
        f"Size: {size}",
        f"MD5sum: {file_digest(data_path, 'md5')}",
        f"SHA256: {file_digest(data_path, 'sha256')}",
    ]
    return control.rstrip("\n") + "\n" + "\n".join(extra) + "\n"


def release_text(files: dict[str, bytes], epoch: int) -> str:
    """A flat-repo Release with the fields NVIDIA's carries (Origin/Label are what pins match)."""
    date = format_datetime(datetime.fromtimestamp(epoch, tz=timezone.utc), usegmt=True)
    lines = [
        "Origin: NVIDIA",
        "Label: NVIDIA CUDA",
        "Architecture: x86_64",
        f"Date: {date}",
    ]
    for title, algo in (("MD5Sum", "md5"), ("SHA256", "sha256")):
        lines.append(f"{title}:")
        for name in sorted(files):
            data = files[name]
            lines.append(f" {hashlib.new(algo, data).hexdigest()} {len(data):>16} {name}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- side effects


def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(cmd, check=True, capture_output=True, **kwargs)  # type: ignore[call-overload]
    except FileNotFoundError as exc:
        raise BuildError(f"{cmd[0]} not found: apt-get install dpkg-dev gnupg") from exc
    except subprocess.CalledProcessError as exc:
        err = exc.stderr.decode(errors="replace").strip()
        raise BuildError(f"{' '.join(cmd[:3])} ... failed (rc {exc.returncode}): {err}") from exc


def ensure_wheel(wheel: Wheel, cache: Path) -> Path:
    """The cached wheel, downloaded once with pip and checked against the pinned sha256."""
    target = cache / "wheels" / wheel.filename
    if target.is_file() and file_digest(target, "sha256") == wheel.sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
            "--no-deps", "--only-binary=:all:", "--platform", "manylinux2014_x86_64",
            "--python-version", "3", "--dest", tmp, f"{wheel.project}=={wheel.version}",
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        got = Path(tmp) / wheel.filename
        if proc.returncode != 0 or not got.is_file():
            raise DownloadError(
                f"could not download {wheel.project}=={wheel.version} from PyPI with {sys.executable} -m pip "
                f"(rc {proc.returncode}): {proc.stderr.strip()[-400:]}; put {wheel.filename} into "
                f"{target.parent} by hand or run where PyPI is reachable"
            )
        digest = file_digest(got, "sha256")
        if digest != wheel.sha256:
            raise BuildError(
                f"{wheel.filename} has sha256 {digest}, pinned {wheel.sha256}: PyPI served different "
                "bytes; do not use it. Re-check the pin in build_repo.py WHEELS"
            )
        os.replace(got, target)
    return target


def stage_and_build(deb: Deb, out_dir: Path, work: Path) -> Path:
    """Write the package tree, then `dpkg-deb --root-owner-group --build` it reproducibly."""
    root = work / deb.name
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN/control").write_text(control_text(deb))
    (root / "DEBIAN/control").chmod(0o644)
    for name, text in deb.scripts.items():
        path = root / "DEBIAN" / name
        path.write_text(text)
        path.chmod(0o755)
    for dest, (data, mode) in deb.files.items():
        path = root / dest.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(mode)
    for dest, target in deb.symlinks.items():
        path = root / dest.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
    for path in [*sorted(root.rglob("*"), reverse=True), root]:
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
        os.utime(path, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH), follow_symlinks=False)
    target = out_dir / deb.filename
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)}
    run(["dpkg-deb", "--root-owner-group", *COMPRESSION, "--build", str(root), str(target)], env=env)
    shutil.rmtree(root)
    return target


@dataclass(frozen=True)
class Signer:
    home: Path

    def gpg(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        base = ["gpg", "--batch", "--no-tty", "--pinentry-mode", "loopback", "--passphrase", ""]
        return run([*base, *args], env={**os.environ, "GNUPGHOME": str(self.home)})

    def fingerprint(self) -> str:
        """Fingerprint of the throwaway key, created on first use."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.home.chmod(0o700)
        for attempt in range(2):
            listing = subprocess.run(
                ["gpg", "--batch", "--with-colons", "--list-secret-keys", KEY_UID],
                env={**os.environ, "GNUPGHOME": str(self.home)},
                capture_output=True,
                text=True,
                check=False,
            ).stdout  # rc 2 and no output while the key does not exist yet
            fprs = [line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:")]
            if fprs:
                return fprs[0]
            if attempt == 0:
                self.gpg("--quick-generate-key", KEY_UID, "ed25519", "sign", "never")
        raise BuildError(f"gpg made no key in {self.home}: delete that directory and run again")

    def export(self, fpr: str) -> bytes:
        return self.gpg("--export", fpr).stdout

    def sign(self, fpr: str, release: Path) -> None:
        common = ["--yes", "--local-user", fpr, "--digest-algo", "SHA512"]
        self.gpg(*common, "--clearsign", "--output", str(release.parent / "InRelease"), str(release))
        self.gpg(*common, "--armor", "--detach-sign", "--output", str(release) + ".gpg", str(release))

    def stop_agent(self) -> None:
        subprocess.run(
            ["gpgconf", "--kill", "gpg-agent"],
            env={**os.environ, "GNUPGHOME": str(self.home)},
            capture_output=True,
            check=False,
        )


def write_index(out: Path, debs: list[tuple[Deb, Path]], signer: Signer, fpr: str) -> None:
    stanzas = [packages_stanza(control_text(deb), path.name, path) for deb, path in debs]
    packages = "\n".join(stanzas).encode()
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as gz:
        gz.write(packages)
    index = {"Packages": packages, "Packages.gz": buf.getvalue()}
    for name, data in index.items():
        (out / name).write_bytes(data)
    (out / "Release").write_text(release_text(index, SOURCE_DATE_EPOCH))
    signer.sign(fpr, out / "Release")


def replace_dir(new: Path, out: Path) -> None:
    """Move the finished tree into place; refuse to delete a directory this script did not make."""
    if out.exists():
        if any(out.iterdir()) and not (out / STAMP_NAME).exists():
            raise BuildError(
                f"{out} exists, is not empty and was not built by build_repo.py (no {STAMP_NAME}): "
                "choose another --out, or delete it yourself"
            )
        shutil.rmtree(out)
    os.replace(new, out)


@dataclass(frozen=True)
class Options:
    out: Path
    cache: Path
    fake_smi: Path
    fixtures: Path


def build(opts: Options) -> str:
    """Build (or confirm up to date) the repository; return the one-line summary."""
    started = time.monotonic()
    opts.cache.mkdir(parents=True, exist_ok=True)
    with (opts.cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel scenarios share one cache
        signer = Signer(opts.cache / "gnupg")
        try:
            fpr = signer.fingerprint()
            pairs = sim_inputs(opts.fake_smi, opts.fixtures)
            parts = [("script", SCRIPT.read_bytes()), ("key", fpr.encode())]
            parts += [(f"wheel:{w.filename}", w.sha256.encode()) for w in WHEELS]
            parts += [(f"sim:{dest}:{src.stat().st_mode & 0o111}", src.read_bytes()) for dest, src in pairs]
            digest = inputs_digest(parts)
            stamp = opts.out / STAMP_NAME
            if stamp.is_file() and stamp.read_text().strip() == digest and (opts.out / "InRelease").is_file():
                took = time.monotonic() - started
                return f"aptrepo: {opts.out} up to date ({digest[:12]}), checked in {took:.1f}s"
            wheels = [ensure_wheel(w, opts.cache) for w in WHEELS]
            return build_fresh(opts, signer, fpr, pairs, digest, wheels, started)
        finally:
            signer.stop_agent()


def build_fresh(
    opts: Options,
    signer: Signer,
    fpr: str,
    pairs: list[tuple[str, Path]],
    digest: str,
    wheels: list[Path],
    started: float,
) -> str:
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    new = Path(tempfile.mkdtemp(dir=opts.out.parent, prefix=f".{opts.out.name}.build-"))
    try:
        with zipfile.ZipFile(wheels[0]) as nvcc, zipfile.ZipFile(wheels[1]) as runtime:
            repo_debs = (
                config_packages() + toolkit_12_2_packages(nvcc, runtime) + other_cuda_packages() + decoy_packages()
            )
        owners: dict[str, str] = {}
        for deb in repo_debs:
            for path in [*deb.files, *deb.symlinks]:
                if path in owners:
                    raise BuildError(f"{path} is in both {owners[path]} and {deb.name}: fix build_repo.py")
                owners[path] = deb.name
        work = new / ".work"
        built = [(deb, stage_and_build(deb, new, work)) for deb in sorted(repo_debs, key=lambda d: d.name)]
        (new / "sim").mkdir()
        sim = sim_package(pairs, f"0.1.0+{digest[:12]}")
        stage_and_build(sim, new / "sim", work)
        work.rmdir()
        write_index(new, built, signer, fpr)
        (new / "cuda-archive-keyring.gpg").write_bytes(signer.export(fpr))
        (new / "KEY_FINGERPRINT").write_text(fpr + "\n")
        (new / STAMP_NAME).write_text(digest + "\n")
        new.chmod(0o755)
        replace_dir(new, opts.out)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    size = sum(p.stat().st_size for p in opts.out.rglob("*") if p.is_file())
    return (
        f"aptrepo: built {len(built)} packages + sim/{sim.filename} in {opts.out} "
        f"({size / 1e6:.1f} MB, key {fpr}) in {time.monotonic() - started:.1f}s"
    )


def parse_args(argv: list[str]) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="repository directory to (re)create")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="wheels and the throwaway GnuPG key")
    parser.add_argument("--sim-nvidia-smi", type=Path, default=DEFAULT_FAKE_NVIDIA_SMI, help=argparse.SUPPRESS)
    parser.add_argument("--sim-fixtures", type=Path, default=DEFAULT_FIXTURES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    return Options(args.out.absolute(), args.cache.absolute(), args.sim_nvidia_smi, args.sim_fixtures)


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        print(build(opts))
    except BuildError as exc:
        print(f"build_repo.py: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
