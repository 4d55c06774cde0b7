#!/usr/bin/env bash
# `make image`: builds deploy/Containerfile as $IMAGE (undolog:latest) with podman.
#   1. Where podman is missing (a fresh CI machine, as root), installs it from Debian's packages and
#      writes what it needs in this sandbox (deploy/podman-setup.sh).
#   2. The base image the Containerfile starts FROM: pulled where a registry answers; otherwise made
#      with debootstrap (Debian's minbase, trimmed as Debian's slim images are) and imported under
#      that name, so the Containerfile is the same either way. Kept: made once per machine.
#   3. This machine's pip certificate bundle and index (whatever its environment says) passed into
#      the build, nothing of them written into the repo or left in the image; pip's downloads kept
#      in var/image/pip-cache between builds.
#   4. The build, with --network host: apt and pip inside it reach Debian and the package index
#      as this machine does.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE="${IMAGE:-undolog:latest}"
BASE="$(sed -n 's/^FROM \([^ ]*\).*/\1/p' deploy/Containerfile | head -1)"
started=$(date +%s)

deploy/podman-setup.sh  # idempotent: installs what is missing, writes containers.conf once

if ! podman image exists "$BASE"; then
  if ! timeout 60 podman pull -q "$BASE" >/dev/null 2>&1; then
    echo "== no registry answers for $BASE: making it with debootstrap (about a minute)"
    command -v debootstrap >/dev/null 2>&1 || deploy/podman-setup.sh
    root="$(mktemp -d /var/tmp/undolog-base.XXXXXX)"
    trap 'rm -rf "$root"' EXIT
    debootstrap --variant=minbase bookworm "$root" >/dev/null
    # What Debian's slim images leave out: apt's lists and caches, documentation, translations.
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/log/* \
      "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/*
    tar --numeric-owner -C "$root" -c . | podman import -q - "$BASE" >/dev/null
    rm -rf "$root"; trap - EXIT
  fi
fi

# What this machine's pip is told (by its environment or its configuration files): its certificate
# bundle, mounted into the build, and its index if that is an http(s) one. Local (file://) indexes
# and find-links do not exist inside the build and are left out.
pip_get() { python3 -m pip config get "global.$1" 2>/dev/null || true; }
cert="${PIP_CERT:-$(pip_get cert)}"
cert="${cert:-${SSL_CERT_FILE:-}}"
index="${PIP_INDEX_URL:-$(pip_get index-url)}"
case "$index" in http://*|https://*) ;; *) index="" ;; esac
build_args=(--build-arg "HOST_PIP_INDEX_URL=$index")
if [ -n "$cert" ] && [ -f "$cert" ]; then
  build_args+=(-v "$(readlink -f "$cert"):/run/host-ca.crt:ro" --build-arg HOST_PIP_CERT=/run/host-ca.crt)
fi
mkdir -p var/image/pip-cache

podman build --network host --format docker --layers "${build_args[@]}" \
  -v "$PWD/var/image/pip-cache:/root/.cache/pip" -f deploy/Containerfile -t "$IMAGE" .
size=$(podman image inspect "$IMAGE" --format '{{.Size}}')
echo "== $IMAGE: $((size / 1000000)) MB, made in $(( $(date +%s) - started )) s"
