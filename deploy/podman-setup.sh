#!/usr/bin/env bash
# What podman needs on this kind of machine (root, no systemd, no registry), installed once:
# Debian's podman, runc, debootstrap and podman-compose; runc instead of crun (crun fails here:
# "cgroups in hybrid mode not supported") with the cgroupfs manager; no default ulimits (setrlimit
# is not permitted in this sandbox). Leaves an existing /etc/containers/containers.conf alone.
set -euo pipefail
SUDO=$( [ "$(id -u)" = 0 ] || echo sudo )
missing=""
for tool in podman runc debootstrap podman-compose; do command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"; done
if [ -n "$missing" ]; then
  echo "== installing$missing from Debian's packages"
  for attempt in 1 2 3 4 5 6; do  # the dpkg lock may be held by another install for a while
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
      podman runc debootstrap podman-compose >/dev/null && break
    sleep 20
  done
fi
if [ ! -e /etc/containers/containers.conf ]; then
  $SUDO tee /etc/containers/containers.conf >/dev/null <<'CONF'
[containers]
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
events_logger = "file"
CONF
fi
