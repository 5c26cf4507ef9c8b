#!/usr/bin/env bash
# ansible-test sanity on the collection's plugins, with no containers and no network but PyPI.
#
#   tools/sanity.sh [ansible-test sanity options, e.g. --test validate-modules]
#
# 1. ansible-test wants the collection at .../ansible_collections/gpubox/gpubox/; the checkout is not such a
#    path, so what it checks (galaxy.yml, meta/, plugins/, tests/config.yml, tests/sanity/) is copied into
#    a temporary tree of that shape.
# 2. It runs `--local` (no docker here) on the venv's Python. Sanity tests that need packages get venvs
#    of their own, pinned by ansible-test, kept under $GPUBOX_CACHE/ansible-test (ansible-test puts them
#    under ~/.ansible/test, so HOME points there for it): the first run takes about a minute more.
# 3. ansible-test bootstraps pip in those venvs with a get-pip script from ci-files.testing.ansible.com,
#    which this machine cannot reach. It uses a cached copy when there is one: ours runs pip from the
#    pip wheel of the pinned version, fetched from PyPI.
# 4. Environmental skip: compile and import run only on this Python (Debian 12 has no other). Python
#    3.10 (the managed box's, tests/config.yml) is covered by vermin instead: modules and module_utils
#    (and vLLM's request guard, which runs in the environment) must use no syntax or standard library
#    newer than 3.10, gpu_parsers.py and the boot-time check none
#    newer than 3.9 (they say so).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV:-$repo/.venv}"
[[ "$venv" = /* ]] || venv="$repo/$venv"
cache="${GPUBOX_CACHE:-$HOME/.cache/gpubox}"
at_home="$cache/ansible-test"
vermin_venv="$cache/vermin-venv"
vermin_pin="vermin==1.9.2"
py="$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
started=$SECONDS

# --- pip bootstrap for ansible-test's venvs (see 3.)
pip_version="$("$venv/bin/python" -c '
import types
from ansible_test._internal.python_requirements import get_venv_packages
print(get_venv_packages(types.SimpleNamespace(version="'"$py"'"))["pip"])')"
at_cache="$at_home/.ansible/test/cache"
bootstrap="$at_cache/get_pip_${pip_version//./_}.py"
wheel="pip-$pip_version-py3-none-any.whl"
mkdir -p "$at_cache"
if [[ ! -f "$at_cache/$wheel" ]]; then
  "$venv/bin/pip" download -q --no-deps --only-binary :all: -d "$at_cache" "pip==$pip_version"
fi
cat >"$bootstrap.new" <<EOF
# Stand-in for get-pip.py $pip_version, written by gpubox's tools/sanity.sh: runs pip from its wheel.
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "$wheel"))
from pip._internal.cli.main import main
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]  # get-pip.py's own flags
sys.exit(main(["install", "--upgrade", "--force-reinstall", *args]))
EOF
mv -f "$bootstrap.new" "$bootstrap"

# --- the collection tree (see 1.)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tree="$work/ansible_collections/gpubox/gpubox"
mkdir -p "$tree/tests"
(cd "$repo" && tar -c --exclude=__pycache__ --exclude='*.pyc' galaxy.yml meta plugins) | tar -x -C "$tree"
cp "$repo/tests/config.yml" "$tree/tests/"
cp -r "$repo/tests/sanity" "$tree/tests/"

# --- ansible-test sanity (see 2.)
(cd "$tree" && HOME="$at_home" "$venv/bin/ansible-test" sanity --local --python "$py" --color no "$@")

# --- Python 3.10 on the managed box (see 4.)
if [[ ! -x "$vermin_venv/bin/vermin" ]] || [[ "$(cat "$vermin_venv/.pin" 2>/dev/null)" != "$vermin_pin" ]]; then
  rm -rf "$vermin_venv"
  "$venv/bin/python" -m venv "$vermin_venv"
  "$vermin_venv/bin/pip" install -q --disable-pip-version-check "$vermin_pin"
  echo "$vermin_pin" >"$vermin_venv/.pin"
fi
cd "$repo"
"$vermin_venv/bin/vermin" -q --no-tips --violations -t=3.10- plugins/modules plugins/module_utils \
  roles/vllm_service/files/gpubox_vllm_guard.py
"$vermin_venv/bin/vermin" -q --no-tips --violations -t=3.9- plugins/module_utils/gpu_parsers.py \
  roles/gpu_tuning/files/gpubox-gpu-check
echo "sanity: ansible-test sanity (Python $py) and vermin (3.10 modules, 3.9 GPU check) passed in $((SECONDS - started))s"
