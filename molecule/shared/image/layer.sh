#!/usr/bin/env bash
# The boxes' image: build.sh's Debian 12 image plus one test-harness layer: zipimport_cache.py (a compile
# cache for the AnsiballZ payloads every task imports; see its docstring) and an initramfs-tools setting,
# MODULES=list (the box's initramfs holds only the modules /etc/initramfs-tools/modules lists, none here,
# instead of Debian's default `most`). A container never boots its initramfs; the tests read only the
# modprobe configuration in it (the nouveau blacklist), which is there either way, and `update-initramfs`
# (three runs in each driver install's apt transaction, one more from the role's handler when the
# blacklist is new) stays real: 1.4 s instead of 5.4 s on the development machine. Tagged by a hash of
# the base image's tag and this layer's files, so build.sh's image is reused and a changed layer is rebuilt.
# Prints the image reference; create.yml boots localhost/gpubox-box:latest unless GPUBOX_IMAGE says otherwise.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
base=${1:?usage: layer.sh BASE_IMAGE}
NAME=${GPUBOX_BOX_IMAGE_NAME:-localhost/gpubox-box}
TAG=$( { echo "$base"; cat "$0" "$here/zipimport_cache.py"; } | sha256sum | cut -c1-12)
if ! podman image exists "$NAME:$TAG"; then
  ctr=$(podman create "$base" /bin/true)
  scratch=$(mktemp -d)
  trap 'podman rm -f "$ctr" >/dev/null; rm -rf "$scratch"' EXIT
  # put DEST LINE...: a root-owned 0644 file of these lines at DEST in the layer
  put() {
    local dest=$1; shift
    printf '%s\n' "$@" > "$scratch/file" && chmod 644 "$scratch/file"
    podman cp "$scratch/file" "$ctr:$dest"
  }
  site=/usr/lib/python3/dist-packages
  podman cp "$here/zipimport_cache.py" "$ctr:$site/gpubox_zipimport_cache.py"
  put "$site/gpubox-zipimport-cache.pth" 'import gpubox_zipimport_cache'
  put /etc/initramfs-tools/conf.d/gpubox-test-box \
    '# TEST HARNESS ONLY (molecule/shared/image/layer.sh): a container never boots its initramfs.' 'MODULES=list'
  podman commit -q --change 'CMD ["/sbin/init"]' "$ctr" "$NAME:$TAG" >/dev/null
fi
podman tag "$NAME:$TAG" "$NAME:latest"
echo "$NAME:$TAG"
