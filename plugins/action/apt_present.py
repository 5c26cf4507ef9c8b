"""Action plugin gpubox.gpubox.apt_present: ``ansible.builtin.apt`` with state present, answered from dpkg's
database when there is nothing to do.

The roles make sure of their distribution packages with apt's ``state: present`` on every run, and nearly
always every package is already there. The apt module still opens the apt cache for that (python3-apt, some
two seconds of CPU on the box and the controller per task, a dozen tasks per converge, dozens of converges
a day in a fleet's rebuild). This plugin first asks dpkg, with one shell command and no module: when every
package named is installed (or held) and, where the name pins one, at exactly that version, the answer is
"ok, nothing changed", as apt's would be. In every other case (a package missing, another version, a
half-installed one, a name with a wildcard or a relation, an argument that does more than install) it runs
``ansible.builtin.apt`` with the task's arguments unchanged, so what apt does and reports is apt's own.

The one difference: apt's ``cache_valid_time`` refreshes a stale package index even when nothing is to be
installed; here a run with nothing to install reads no index and so refreshes none (the index is refreshed
when a package is installed, as before).

    - gpubox.gpubox.apt_present:
        name: [nginx, ssl-cert]
        cache_valid_time: 3600
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from ansible.executor.module_common import _apply_action_arg_defaults
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.gpubox.gpubox.plugins.module_utils import dpkg

display = Display()

APT = "ansible.builtin.apt"
# apt's arguments that change nothing when every package is already installed as asked.
QUIET_WHEN_PRESENT = frozenset(
    {
        "name",
        "pkg",
        "package",
        "state",
        "cache_valid_time",
        "install_recommends",
        "allow_downgrade",
        "allow_downgrades",
        "allow_change_held_packages",
        "allow_unauthenticated",
        "default_release",
        "dpkg_options",
        "force_apt_get",
        "lock_timeout",
        "policy_rc_d",
        "update_cache_retries",
        "update_cache_retry_max_delay",
    }
)
# A Debian package name (Debian Policy 5.6.7), an optional :architecture, an optional =exact-version
# (Debian Policy 5.6.12's characters; no wildcard, no relation such as >=).
_NAME = re.compile(r"^(?P<name>[a-z0-9][a-z0-9+.-]+)(?::(?P<arch>[a-z0-9-]+))?(?:=(?P<version>[A-Za-z0-9.+~:-]+))?$")


@dataclass(frozen=True)
class Wanted:
    name: str
    arch: str | None
    version: str | None


def names_of(args: dict) -> list[str] | None:
    """The package names the task asks for, as apt reads them (a list, or one comma-separated string)."""
    raw = args.get("name", args.get("pkg", args.get("package")))
    if isinstance(raw, str):
        raw = [part.strip() for part in raw.split(",")]
    if not isinstance(raw, list) or not raw or not all(isinstance(item, str) and item for item in raw):
        return None
    return raw


def wanted(args: dict) -> list[Wanted] | None:
    """What dpkg must show for the task to have nothing to do, or None where only apt can say."""
    if str(args.get("state") or "present") != "present" or args.get("update_cache"):
        return None
    if set(args) - QUIET_WHEN_PRESENT - {"update_cache"}:
        return None
    names = names_of(args)
    if names is None:
        return None
    out = []
    for item in names:
        match = _NAME.match(item)
        if match is None:
            return None
        out.append(Wanted(match["name"], match["arch"], match["version"]))
    return out


def query_command(packages: list[Wanted]) -> str:
    """One dpkg-query for every package named (rc 1, and a line on stderr, for a name dpkg has never seen)."""
    names = " ".join(shlex.quote(p.name if p.arch is None else f"{p.name}:{p.arch}") for p in packages)
    return f"LC_ALL=C dpkg-query -W -f {shlex.quote(dpkg.FORMAT)} -- {names}"


def unmet(packages: list[Wanted], stdout: str) -> list[str]:
    """The packages dpkg does not show installed as asked ([] when there is nothing to do)."""
    installed: dict[str, list[tuple[str, str]]] = {}
    for row in dpkg.rows(stdout):
        if dpkg.settled(row.status):  # the only states with nothing left for apt to do
            installed.setdefault(row.name, []).append((row.arch, row.version))
    missing = []
    for p in packages:
        rows = [
            row
            for row in installed.get(p.name, [])
            if (p.arch is None or row[0] == p.arch) and (p.version is None or row[1] == p.version)
        ]
        if not rows:
            missing.append(p.name if p.version is None else f"{p.name}={p.version}")
    return missing


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        self._supports_check_mode = True
        self._supports_async = True
        result = super().run(tmp, task_vars)
        # The play's module_defaults for apt count here too, as they would for apt itself.
        args = _apply_action_arg_defaults(APT, self._task, dict(self._task.args), self._templar)
        packages = wanted(args)
        if packages is not None:
            # Read only, as any user: no become, nothing written, the same in check mode.
            query = self._low_level_execute_command(query_command(packages), sudoable=False)
            if query.get("rc") in (0, 1) and not unmet(packages, query.get("stdout", "")):
                names = [p.name for p in packages]
                display.vvv(f"apt_present: dpkg shows {', '.join(names)} installed as asked; apt not run")
                result.update(changed=False, cache_updated=False, packages=names, msg="installed as asked (dpkg)")
                return result
        async_val = self._task.async_val
        answer = self._execute_module(module_name=APT, module_args=args, task_vars=task_vars, wrap_async=async_val)
        result.update(answer)
        return result
