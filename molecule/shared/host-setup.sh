#!/usr/bin/env bash
# Host side of the test harness: podman with runc, mmdebstrap, dpkg-dev, gnupg; containers.conf
# tuned for this kind of VM (docs: ../shared/docs/testing.md). Idempotent; needs root.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
# python3-venv: the unit tests' modelscope client venv runs as an unprivileged user, so it is built on
# Debian's /usr/bin/python3 (a pyenv Python under /root is out of that user's reach).
# nginx, haproxy: tests/integration/test_front_door_live.py runs the rendered front door and gateway on loopback
# (their services are not started here: policy-rc.d says no while they install). curl, openssh-client: the
# README's first request and its scp, which molecule/serving/operator_suite.py runs. tcpd: its tcpdmatch is
# libwrap's own matcher, which tests/unit/test_fleet_cache_inputs.py runs on apt-cacher-ng's rendered lines.
need=(podman runc mmdebstrap dpkg-dev gnupg uidmap python3-venv nginx haproxy curl openssh-client tcpd)
missing=()
for p in "${need[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# crun rejects the hybrid cgroup layout of these VMs -> runc. No CAP_SYS_RESOURCE -> podman's default
# ulimits cannot be applied -> pin them at or below the hard limits.
nofile=$(ulimit -Hn); { [ "$nofile" = unlimited ] || [ "$nofile" -gt 16384 ]; } && nofile=16384
nproc=$(ulimit -Hu); { [ "$nproc" = unlimited ] || [ "$nproc" -gt 16384 ]; } && nproc=16384
mkdir -p /etc/containers
conf=$(printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n[engine]\nruntime = "runc"\n' \
  "$nofile" "$nofile" "$nproc" "$nproc")
[ "$(cat /etc/containers/containers.conf 2>/dev/null)" = "$conf" ] || printf '%s\n' "$conf" > /etc/containers/containers.conf
