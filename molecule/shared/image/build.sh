#!/usr/bin/env bash
# Builds the Debian 12 test image with systemd as PID 1 from Debian's archive (mmdebstrap), tagged by
# a hash of this recipe: a changed recipe never reuses a stale image; an unchanged one is not rebuilt.
# Prints the image reference. The mirror is taken from the host's own apt configuration.
set -euo pipefail
NAME=${GPUBOX_IMAGE_NAME:-localhost/gpubox-debian12}
PKGS=systemd,systemd-sysv,dbus,python3,python3-apt,sudo,ca-certificates,iproute2,procps,openssh-server,kmod,initramfs-tools,linux-image-cloud-amd64,curl,gnupg
OPTS=(--variant=apt --include="$PKGS"
  --components="main contrib non-free non-free-firmware"
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*'
  --aptopt='APT::Install-Recommends "false"'
  --skip=cleanup/apt/lists)   # keep apt lists: an image without them breaks apt's cache_valid_time
TAG=$( { printf '%s\n' "${OPTS[@]}"; cat "$0"; } | sha256sum | cut -c1-12)
if ! podman image exists "$NAME:$TAG"; then
  mirror=$(apt-get indextargets --format '$(REPO_URI)' 'Created-By: Packages' | grep -m1 '/debian/$' || true)
  [ -n "$mirror" ] || { echo "build.sh: no Debian mirror found in the host's apt configuration" >&2; exit 1; }
  security=${mirror%/debian/}/debian-security/
  src=$(mktemp)
  trap 'rm -f "$src"' EXIT
  cat > "$src" <<SRC
deb $mirror bookworm main contrib non-free non-free-firmware
deb $mirror bookworm-updates main contrib non-free non-free-firmware
deb $security bookworm-security main contrib non-free non-free-firmware
SRC
  echo "building $NAME:$TAG from $mirror" >&2
  mmdebstrap "${OPTS[@]}" --format=tar bookworm - "$src" \
    | podman import --change 'CMD ["/sbin/init"]' --change 'ENV container=podman' - "$NAME:$TAG" >/dev/null
fi
podman tag "$NAME:$TAG" "$NAME:latest"
echo "$NAME:$TAG"
