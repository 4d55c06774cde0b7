#!/bin/sh
# The image's one entry point: the first argument is the role, the rest go to its server.
#   web      gunicorn (gthread) on :8000: /api/, pages, admin, static files
#   ws       uvicorn on :8000: /ws/ (the dashboard's websockets)
#   worker   a Celery worker (compensations, executors, webhooks, emails)
#   beat     Celery beat (exactly one: deadlines, retries, sweeps)
#   migrate  manage.py migrate, then exits (a one-shot job before the others start)
#   proxy    the compose topology's example nginx on :8080: /ws/ to ws, the rest to web
#   manage   any manage.py command (createorg, createreviewer, createagent, check --deploy...)
# Each server is exec'd, so it is PID 1 and gets the container's SIGTERM itself: gunicorn stops
# taking connections and lets its workers finish (--graceful-timeout), Celery's warm shutdown
# lets running tasks finish (acks_late: a task cut off by SIGKILL is delivered again).
set -eu
role="${1:-web}"
[ "$#" -gt 0 ] && shift
# The health check (deploy/healthcheck.py) runs in another process: it reads the role here.
echo "$role" > /tmp/undolog-role
# Prometheus' multiprocess files belong to this container's processes only: a restarted container
# must not add to its dead processes' counts.
metrics="${PROMETHEUS_MULTIPROC_DIR:-${UNDOLOG_VAR_DIR}/metrics}"
rm -rf "$metrics" && mkdir -p "$metrics"

# PostgreSQL may still be starting (compose starts everything at once; podman-compose ignores
# depends_on's conditions): the Django roles wait for it, up to two minutes.
wait_for_database() {
  [ -n "${DATABASE_URL:-}" ] || return 0
  python3 - <<'PY'
import os, sys, time
import psycopg
deadline = time.monotonic() + 120
while True:
    try:
        psycopg.connect(os.environ["DATABASE_URL"], connect_timeout=3).close()
        break
    except psycopg.OperationalError as exc:
        if time.monotonic() > deadline:
            sys.exit(f"the database did not answer in 120 s: {exc}")
        time.sleep(1)
PY
}
case "$role" in web|ws|worker|beat|migrate) wait_for_database ;; esac

case "$role" in
  web)
    exec gunicorn undolog_site.wsgi:application -k gthread --threads 8 --keep-alive 75 \
      --graceful-timeout 30 --worker-tmp-dir /dev/shm -b 0.0.0.0:8000 "$@" ;;
  ws)
    exec uvicorn undolog_site.asgi:application --host 0.0.0.0 --port 8000 \
      --timeout-graceful-shutdown 30 "$@" ;;
  worker)
    exec celery -A undolog_site worker --loglevel "${LOG_LEVEL:-INFO}" "$@" ;;
  beat)
    exec celery -A undolog_site beat --loglevel "${LOG_LEVEL:-INFO}" \
      --schedule "${UNDOLOG_VAR_DIR}/celerybeat-schedule" "$@" ;;
  migrate)
    # A one-shot job waits for a slow connection instead of failing fast as a server must (its
    # pool's 2 s suits a request, not a first connection to a PostgreSQL still warming up).
    DB_POOL_TIMEOUT_MS="${DB_POOL_TIMEOUT_MS:-30000}" exec python manage.py migrate --noinput "$@" ;;
  proxy)
    exec nginx -c /app/deploy/nginx.conf -g 'daemon off;' "$@" ;;
  manage)
    DB_POOL_TIMEOUT_MS="${DB_POOL_TIMEOUT_MS:-30000}" exec python manage.py "$@" ;;
  *)
    echo "unknown role '$role': web, ws, worker, beat, migrate, proxy or manage" >&2
    exit 64 ;;
esac
