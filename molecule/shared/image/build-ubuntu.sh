#!/usr/bin/env bash
# Builds the Ubuntu 22.04 (jammy) test image with systemd as PID 1, as build.sh builds the Debian 12
# one: mmdebstrap from Ubuntu's archive (the mirror of the host's own apt configuration), tagged by a
# hash of this recipe. Prints the image reference. Used only where Ubuntu's archive is reachable
# (.github/workflows/ubuntu.yml, molecule/host_ubuntu); the machines `make test` runs on cannot reach
# it, so this script is never run there.
set -euo pipefail
NAME=${GPUBOX_UBUNTU_IMAGE_NAME:-localhost/gpubox-ubuntu2204}
COMPONENTS="main restricted universe multiverse"
PKGS=systemd,systemd-sysv,dbus,python3,python3-apt,sudo,ca-certificates,iproute2,procps,openssh-server,kmod,initramfs-tools,linux-image-generic,curl,gnupg
OPTS=(--variant=apt --include="$PKGS"
  --components="$COMPONENTS"
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*'
  --aptopt='APT::Install-Recommends "false"'
  --skip=cleanup/apt/lists)   # keep apt lists: an image without them breaks apt's cache_valid_time
TAG=$( { printf '%s\n' "${OPTS[@]}"; cat "$0"; } | sha256sum | cut -c1-12)
if ! podman image exists "$NAME:$TAG"; then
  mirror=$(apt-get indextargets --format '$(REPO_URI)' 'Created-By: Packages' | grep -m1 '/ubuntu/$' || true)
  [ -n "$mirror" ] || { echo "build-ubuntu.sh: no Ubuntu mirror found in the host's apt configuration" >&2; exit 1; }
  src=$(mktemp)
  trap 'rm -f "$src"' EXIT
  cat > "$src" <<SRC
deb $mirror jammy $COMPONENTS
deb $mirror jammy-updates $COMPONENTS
deb http://security.ubuntu.com/ubuntu/ jammy-security $COMPONENTS
SRC
  echo "building $NAME:$TAG from $mirror" >&2
  mmdebstrap "${OPTS[@]}" --format=tar jammy - "$src" \
    | podman import --change 'CMD ["/sbin/init"]' --change 'ENV container=podman' - "$NAME:$TAG" >/dev/null
fi
podman tag "$NAME:$TAG" "$NAME:latest"
echo "$NAME:$TAG"
