"""The modelscope client, run as the download user: the part of the store that reads what the hub sends.

Trust boundary: the client and everything it starts are hostile once it has read a byte from the
wire. It never runs as root. On every real box (systemd is PID 1) it is a transient service with a
file-system sandbox (ProtectSystem=strict, one ReadWritePaths: its staging directory, PrivateTmp, a
private /dev/shm, no capabilities), stopped with its whole cgroup when the run ends or fails, so
nothing it spawned (a grandchild that calls setsid included) outlives the run.

Without systemd there is no such sandbox, so the store refuses to run the client at all, unless the
test-only switch GPUBOX_TEST_UNSANDBOXED_CLIENT=1 is in its environment (the unit tests on a CI
machine set it). Then the client is a child process under the download user, and when the run ends
every process of the download user's uid is killed (a dedicated user: model_store_download_user),
so nothing can write after verification; what is published is in any case a copy made and hashed
by root (store_layout.assemble). That mode has no private /tmp, /var/tmp or /dev/shm.

Runs on the managed host (Python >= 3.10).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import time
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ansible_collections.gpubox.gpubox.plugins.module_utils.hub_listing import CLIENT_DIR, Listing
from ansible_collections.gpubox.gpubox.plugins.module_utils.model_errors import ModelStoreError
from ansible_collections.gpubox.gpubox.plugins.module_utils.store_layout import StoreLayout
from ansible_collections.gpubox.gpubox.plugins.module_utils.store_progress import (
    Progress,
    staging_progress,
    write_progress,
)

if TYPE_CHECKING:  # the request type only, for annotations: model_publish imports this module
    from ansible_collections.gpubox.gpubox.plugins.module_utils.model_publish import Request, StoreResult

SYSTEMD_RUN = "/usr/bin/systemd-run"
SYSTEMCTL = "/usr/bin/systemctl"
CLIENT_LOG_TAIL = 3000  # characters of the client's output quoted in an error
LEGACY_BEFORE = (1, 38)  # modelscope < 1.38 is the legacy generation (docs/facts.md, "ModelScope")
UNSANDBOXED_SWITCH = "GPUBOX_TEST_UNSANDBOXED_CLIENT"


def download_ids(req: Request) -> tuple[int, int]:
    import pwd

    try:
        entry = pwd.getpwnam(req.download_user)
    except KeyError as exc:
        raise ModelStoreError(
            f"download_user {req.download_user!r} does not exist on this host: the model_store role creates "
            "model_store_download_user; create it (a system user without a login shell) or choose another"
        ) from exc
    if entry.pw_uid == 0:
        raise ModelStoreError(f"download_user {req.download_user!r} has uid 0: choose an unprivileged user")
    return entry.pw_uid, entry.pw_gid


def client_argv(req: Request, staging: Path) -> list[str]:
    """The CLI call; the legacy-style flags are accepted by both client generations. No secrets here."""
    return [
        req.modelscope_bin,
        "download",
        "--model",
        req.model_id,
        "--revision",
        req.revision,
        "--local_dir",
        str(staging),
    ]


PASSED_ENV = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "LANG", "TZ")


def client_env(req: Request, staging: Path) -> dict[str, str]:
    """The whole environment of the CLI (nothing else of the module's is inherited). Both client
    generations are served: >= 1.38 reads MODELSCOPE_ENDPOINT (and then ignores MODELSCOPE_DOMAIN);
    <= 1.37 reads only MODELSCOPE_DOMAIN and always uses https. Its HOME and cache are inside its
    staging directory, the only place it may write."""
    env = {name: os.environ[name] for name in PASSED_ENV if name in os.environ}
    # The client's download tuning (MODELSCOPE_DOWNLOAD_MAX_RETRIES, ...): settings, never secrets.
    env |= {name: value for name, value in os.environ.items() if name.startswith("MODELSCOPE_DOWNLOAD_")}
    env["PATH"] = f"{Path(req.modelscope_bin).parent}:/usr/local/bin:/usr/bin:/bin"
    env["HOME"] = str(staging / CLIENT_DIR / "home")
    env["MODELSCOPE_CACHE"] = str(staging / CLIENT_DIR / "cache")
    env["MODELSCOPE_ENDPOINT"] = req.endpoint.rstrip("/")
    url = urllib.parse.urlsplit(req.endpoint)
    if url.scheme == "https":
        env["MODELSCOPE_DOMAIN"] = url.netloc
    if req.ca_bundle:
        env["REQUESTS_CA_BUNDLE"] = req.ca_bundle
        env["SSL_CERT_FILE"] = req.ca_bundle
    env["TQDM_DISABLE"] = "1"  # no progress bars in the captured log; we report progress ourselves
    env["PYTHONUNBUFFERED"] = "1"
    return env


def systemd_running() -> bool:
    """systemd is PID 1 here (sd_booted's test) and systemd-run is installed: sandbox the client."""
    return os.path.isdir("/run/systemd/system") and os.access(SYSTEMD_RUN, os.X_OK)


def client_unit(layout: StoreLayout) -> str:
    """One transient unit name per model: a run stops what a killed earlier run left behind."""
    return f"gpubox-model-fetch-{re.sub(r'[^A-Za-z0-9_.-]', '_', layout.name)}.service"


def sandbox_properties(staging: Path, user: str, runtime_max: int) -> list[str]:
    """The transient unit of the client: its user, one writable directory, nothing else. The directory
    is made of checked parts only; one with a space or a control character (which systemd would read as
    a second path or property) is refused all the same."""
    if re.search(r"[\s\x00-\x1f\x7f\\]", str(staging)) or not staging.is_absolute():
        raise ModelStoreError(f"refused to sandbox the client in {str(staging)!r}: not a plain absolute path")
    return [
        f"User={user}",  # and its primary group
        f"WorkingDirectory={staging}",
        "UMask=0022",
        "ProtectSystem=strict",
        f"ReadWritePaths={staging}",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "PrivateDevices=yes",
        # PrivateDevices keeps the host's /dev/shm (world-writable): a private one instead, so a hostile
        # listing's /dev/shm/... lands nowhere the box can see (found by molecule/serving's hostile hub).
        "TemporaryFileSystem=/dev/shm:mode=1777",
        "PrivateIPC=yes",
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=",
        "RestrictSUIDSGID=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "ProtectControlGroups=yes",
        "ProtectClock=yes",
        "ProtectHostname=yes",
        "LockPersonality=yes",
        "RestrictRealtime=yes",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        "SystemCallFilter=@system-service",
        "SystemCallFilter=~@privileged @resources",
        "SystemCallErrorNumber=EPERM",
        "SystemCallArchitectures=native",
        "RestrictNamespaces=yes",
        "ProtectProc=invisible",
        "ProcSubset=pid",
        "RemoveIPC=yes",
        "PrivateUsers=yes",
        "PrivateMounts=yes",
        "AmbientCapabilities=",
        "DevicePolicy=closed",
        "KeyringMode=private",
        # Not MemoryDenyWriteExecute: Python's ctypes callbacks may need writable+executable memory.
        # Not PrivateNetwork/IPAddressDeny: it downloads from the hub (or a LAN mirror) over the network.
        "KillMode=control-group",
        f"RuntimeMaxSec={max(1, runtime_max)}",
    ]


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """In the client (fallback path): SIGKILL when the module that started it dies."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class ClientRun:
    """One run of the client as the download user, sandboxed by systemd where it runs, and always
    stopped (with everything it started) by stop(): on success, failure, timeout or SIGTERM."""

    def __init__(self, req: Request, layout: StoreLayout, staging: Path, log: Any, runtime_max: int) -> None:
        self.argv = client_argv(req, staging)
        self.env = client_env(req, staging)
        self.unit = client_unit(layout)
        self.user = req.download_user
        self.uid, self.gid = download_ids(req)
        self.staging = staging
        self.log = log
        self.runtime_max = runtime_max
        self.sandbox = sandbox_kind()
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        if self.sandbox == "systemd":
            self._systemctl("stop", self.unit)  # left running by an earlier run that was killed
            self._systemctl("reset-failed", self.unit)
            argv = [SYSTEMD_RUN, "--quiet", "--collect", "--wait", "--pipe", f"--unit={self.unit}"]
            argv += [f"--property={p}" for p in sandbox_properties(self.staging, self.user, self.runtime_max)]
            argv += [f"--setenv={k}={v}" for k, v in sorted(self.env.items())]
            self.proc = subprocess.Popen(
                [*argv, "--", *self.argv], stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT
            )
            return
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=str(self.staging),
            user=self.uid,
            group=self.gid,
            extra_groups=[],
            umask=0o022,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    def poll(self, timeout: float) -> int | None:
        if self.proc is None:
            raise AssertionError("poll() before start()")
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        """Stop the client and anything it started; a no-op once it has ended on its own."""
        if self.sandbox == "systemd":
            self._systemctl("stop", self.unit)  # the whole cgroup, SIGTERM then SIGKILL
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM) if self.sandbox == "user" else self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL) if self.sandbox == "user" else self.proc.kill()
                self.proc.wait()
        if self.sandbox == "user":
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # anything it left in its process group
            kill_uid(self.uid)  # and anything that left the group (setsid): every process of the download user

    @staticmethod
    def _systemctl(*args: str) -> None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run([SYSTEMCTL, *args], capture_output=True, timeout=120, check=False)


def sandbox_kind() -> str:
    """systemd where it runs; else the test-only plain child, or a refusal naming why."""
    if systemd_running():
        return "systemd"
    if os.environ.get(UNSANDBOXED_SWITCH) == "1":
        return "user"
    raise ModelStoreError(
        "systemd is not running on this host, so the modelscope client cannot be sandboxed (a transient unit "
        "with one writable directory, stopped with everything it started): the model store refuses to run it. "
        "Run the model_store role on a host booted with systemd (every supported box is); "
        f"{UNSANDBOXED_SWITCH}=1 is for the unit tests only"
    )


def uid_pids(uid: int) -> list[int]:
    """Every live process of this PID namespace whose real, effective or saved uid is uid (/proc/<pid>/status).

    A process of another PID namespace (a container's: the same uid number there is another user) is
    never one of them, nor a zombie."""
    found = []
    try:
        own_ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        own_ns = None
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if own_ns is not None and os.readlink(f"/proc/{entry.name}/ns/pid") != own_ns:
                continue
            with open(f"/proc/{entry.name}/status", encoding="ascii", errors="replace") as fh:
                fields = dict(line.split(":", 1) for line in fh if ":" in line)
        except OSError:
            continue
        # A zombie has exited already (nothing to kill; its parent has not reaped it yet).
        if fields.get("State", "").split()[:1] == ["Z"]:
            continue
        if str(uid) in fields.get("Uid", "").split()[:3]:
            found.append(int(entry.name))
    return found


def kill_uid(uid: int, timeout: float = 10.0) -> None:
    """SIGKILL every process of uid until none is left (a fork racing the kill is caught next round)."""
    if uid == 0:
        raise ModelStoreError("refused to kill every process of uid 0")
    deadline = time.monotonic() + timeout
    while pids := uid_pids(uid):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise ModelStoreError(
                f"processes {pids} of the download user (uid {uid}) survived SIGKILL for {timeout:.0f}s; nothing was "
                "published. Stop them and re-run"
            )
        time.sleep(0.05)


def client_version(modelscope_bin: str) -> tuple[int, ...] | None:
    """The modelscope version installed beside the CLI (same environment), None when unknown."""
    python = Path(modelscope_bin).parent / "python"
    code = "import importlib.metadata as m; print(m.version('modelscope'))"
    try:
        out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", out.stdout.strip())
    return tuple(int(x) for x in found.groups() if x is not None) if found else None


def check_client(req: Request) -> str:
    """Refuse a combination the client cannot do, before anything is downloaded."""
    sandbox_kind()  # refuses before anything is downloaded when the client cannot be sandboxed
    if not os.access(req.modelscope_bin, os.X_OK):
        raise ModelStoreError(
            f"modelscope_bin {req.modelscope_bin!r} is not an executable; install the serving environment "
            "first (python_env, into the desired state's gpubox_env_prefix: the stack's own when unset) or point "
            "modelscope_bin at its bin/modelscope"
        )
    version = client_version(req.modelscope_bin)
    if version and version < LEGACY_BEFORE and urllib.parse.urlsplit(req.endpoint).scheme != "https":
        raise ModelStoreError(
            f"modelscope {'.'.join(map(str, version))} (before 1.38) only speaks https, but endpoint is "
            f"{req.endpoint!r}; use an https endpoint or modelscope >= 1.38"
        )
    return ".".join(map(str, version)) if version else "unknown"


def client_errors(path: Path, limit: int = 20) -> str:
    """The error lines of the client's last run (its log also holds banners and info lines)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    last_run = text.rsplit("\n=== ", 1)[-1]
    lines = [ln.strip() for ln in last_run.splitlines() if re.search(r"error|fail|mismatch|denied|refused", ln, re.I)]
    return "\n".join(lines[-limit:])[-CLIENT_LOG_TAIL:]


def run_client(
    req: Request,
    layout: StoreLayout,
    staging: Path,
    listing: Listing,
    deadline: float,
    progress: Progress,
    progress_path: Path | None,
    log_path: Path,
    result: StoreResult,
) -> int:
    """Run the modelscope CLI once as the download user, updating progress every second; stop it at
    the deadline. It never outlives this call: stopped in ``finally`` on any exit (an error, a
    SIGTERM turned into an exception, the deadline). A Popen of its own, not run_command: the run takes
    hours, is watched every second (progress file) and stopped as a whole."""
    with log_path.open("ab") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(client_argv(req, staging))}\n".encode())
        log.flush()
        run = ClientRun(req, layout, staging, log, int(deadline - time.monotonic()) + 1)
        result.sandbox = run.sandbox
        try:
            try:
                run.start()
            except OSError as exc:
                raise ModelStoreError(
                    f"cannot run modelscope_bin {req.modelscope_bin!r} as {req.download_user} ({exc}); point it "
                    "at the serving environment's modelscope CLI, readable and executable by model_store_download_user"
                ) from exc
            while True:
                rc = run.poll(1.0)
                if rc is not None:
                    return rc
                progress.bytes_done, progress.files_done = staging_progress(staging, listing.files)
                write_progress(progress_path, progress)
                if time.monotonic() > deadline:
                    raise ModelStoreError(
                        f"the download of {req.model_id}@{req.revision} did not finish within timeout "
                        f"{req.timeout}s; {staging} is kept and a re-run resumes from it (or raise the timeout)"
                    )
        finally:
            run.stop()
