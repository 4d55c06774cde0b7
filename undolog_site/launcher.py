"""`make run`: the embedded Redis (unless REDIS_URL is set), the ASGI server and a Celery
worker with beat inside, as one foreground command. Ctrl-C stops them all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "undolog_site.settings")
    var = Path(os.environ.get("UNDOLOG_VAR_DIR", BASE_DIR / "var"))
    redis_process = None
    if "REDIS_URL" not in os.environ:
        from undolog_site import embedded_redis

        socket_path = var / "redis.sock"
        redis_process = embedded_redis.start(socket_path)
        os.environ["REDIS_URL"] = f"unix://{socket_path}"
        print(f"embedded Redis on {socket_path}", flush=True)
    port = os.environ.get("PORT", "8000")
    host = os.environ.get("HOST", "127.0.0.1")
    children = [
        subprocess.Popen([sys.executable, "-m", "uvicorn", "undolog_site.asgi:application",
                          "--host", host, "--port", port, "--no-access-log"], cwd=BASE_DIR),
        subprocess.Popen([sys.executable, "-m", "celery", "-A", "undolog_site", "worker", "-B",
                          "--loglevel", "INFO", "--concurrency", os.environ.get("WORKER_CONCURRENCY", "4"),
                          "--schedule", str(var / "celerybeat-schedule")], cwd=BASE_DIR),
    ]
    print(f"undolog is up: dashboard http://{host}:{port}/ · API http://{host}:{port}/api/docs/ · "
          "Ctrl-C stops everything", flush=True)
    stopping = False

    def stop(signum, frame) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        while not stopping and all(child.poll() is None for child in children):
            time.sleep(0.2)
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
        if redis_process is not None:
            from undolog_site import embedded_redis

            embedded_redis.stop(redis_process)
    failed = [child.args[2] for child in children if child.returncode not in (0, -signal.SIGTERM, None)]
    return 1 if failed and not stopping else 0


if __name__ == "__main__":
    sys.exit(main())
