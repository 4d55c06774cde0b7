#!/usr/bin/env bash
# PostgreSQL and Redis images for deploy/compose.yaml where no registry answers: builds the stand-ins
# of deploy/standins/ from Debian's packages (once; kept) and prints the variables that point
# compose at them. Where a registry answers, compose pulls the official images and this is not needed.
set -euo pipefail
cd "$(dirname "$0")/.."
for role in postgres redis; do
  tag="localhost/undolog-standin-$role:latest"
  podman image exists "$tag" || podman build -q --network host --format docker --layers \
    --target "$role" -f deploy/standins/Containerfile -t "$tag" . >/dev/null
done
echo "POSTGRES_IMAGE=localhost/undolog-standin-postgres:latest"
echo "REDIS_IMAGE=localhost/undolog-standin-redis:latest"
