"""The image's HEALTHCHECK: asks this container's own server whether it is well, by role.

web, ws: GET /healthz on :8000 (200 `ok` or `degraded`; 503 when the database does not answer).
The request names the first of ALLOWED_HOSTS and says it came over HTTPS, as the proxy in front
would: with DEBUG=0 Django refuses unknown hosts and redirects plain HTTP.
proxy: the same through nginx on :8080. worker: a Celery ping to this container's worker only.
beat, migrate: healthy while they run (their process is the container's)."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys


def http_ok(port: int) -> bool:
    hosts = [h.strip().lstrip(".") for h in os.environ.get("ALLOWED_HOSTS", "").split(",")]
    host = next((h for h in hosts if h and h != "*"), "localhost")
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=8)
    try:
        connection.request("GET", "/healthz", headers={"Host": host, "X-Forwarded-Proto": "https"})
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def main() -> int:
    try:
        with open("/tmp/undolog-role") as f:
            role = f.read().strip()
    except OSError:
        return 1
    if role in ("web", "ws"):
        return 0 if http_ok(8000) else 1
    if role == "proxy":
        return 0 if http_ok(8080) else 1
    if role == "worker":
        node = f"celery@{socket.gethostname()}"
        ping = subprocess.run(["celery", "-A", "undolog_site", "inspect", "ping", "-d", node, "--timeout", "5"],
                              capture_output=True, timeout=30)
        return ping.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
