#!/usr/bin/env bash
# The boxes' image: build.sh's Debian 12 image plus one test-harness layer, zipimport_cache.py (a compile
# cache for the AnsiballZ payloads every task imports; see its docstring). Tagged by a hash of the base
# image's tag and this layer's files, so build.sh's image is reused and a changed layer is rebuilt.
# Prints the image reference; create.yml boots localhost/gpubox-box:latest unless GPUBOX_IMAGE says otherwise.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
base=${1:?usage: layer.sh BASE_IMAGE}
NAME=${GPUBOX_BOX_IMAGE_NAME:-localhost/gpubox-box}
TAG=$( { echo "$base"; cat "$0" "$here/zipimport_cache.py"; } | sha256sum | cut -c1-12)
if ! podman image exists "$NAME:$TAG"; then
  ctr=$(podman create "$base" /bin/true)
  trap 'podman rm -f "$ctr" >/dev/null' EXIT
  site=/usr/lib/python3/dist-packages
  podman cp "$here/zipimport_cache.py" "$ctr:$site/gpubox_zipimport_cache.py"
  pth=$(mktemp)
  printf 'import gpubox_zipimport_cache\n' > "$pth" && chmod 644 "$pth"
  podman cp "$pth" "$ctr:$site/gpubox-zipimport-cache.pth"
  rm -f "$pth"
  podman commit -q --change 'CMD ["/sbin/init"]' "$ctr" "$NAME:$TAG" >/dev/null
fi
podman tag "$NAME:$TAG" "$NAME:latest"
echo "$NAME:$TAG"
