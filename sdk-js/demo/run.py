"""`make demo-js`: the account cleanup with an AI SDK agent (the SDK's mock model) and
@undolog/sdk, against `make run`'s server on the same PORT if it is up, else a throwaway one
(sdk/demo/server.py, as `make demo` does). The org is the demo's own (`cleanup-demo`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from sdk.demo.server import attach, is_up, start  # noqa: E402

# Its agent key's name: each run revokes the previous run's key of that name (sdk/demo/provision.py).
KEY_NAME = "make demo-js"


def main() -> int:
    url = os.environ.get("UNDOLOG_URL") or f"http://127.0.0.1:{os.environ.get('PORT', '8000')}"
    server = attach(url, KEY_NAME) if is_up(url) else start(REPO / "var" / "demo-js", KEY_NAME)
    creds = server.credentials
    env = {**os.environ, "UNDOLOG_DEMO_URL": server.url, "UNDOLOG_DEMO_ORG": creds["org"],
           "UNDOLOG_DEMO_KEY": creds["agent_key"],
           "UNDOLOG_DEMO_ADMIN_TOKEN": creds["admin_token"], "UNDOLOG_DEMO_REVIEWER_TOKEN": creds["reviewer_token"],
           "UNDOLOG_DEMO_WEBHOOK_SECRET": creds["webhook_secret"],
           "UNDOLOG_DEMO_WHERE": "the server already running" if not server.own else "a server of its own"}
    try:
        return subprocess.run(["npm", "--prefix", str(REPO / "sdk-js"), "run", "demo", "--silent"], env=env).returncode
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
