"""`python -m sdk.demo`: find or start a server, play the story, stop what it started."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from .server import REPO, attach, is_up, start
from .story import Demo

# `make run` serves on $PORT (8000 unless set); `make demo` passes the same PORT on.
DEFAULT_URL = f"http://127.0.0.1:{os.environ.get('PORT') or 8000}"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sdk.demo", description=__doc__)
    parser.add_argument("--url", default=os.environ.get("UNDOLOG_URL", DEFAULT_URL),
                        help="a running server (`make run`) to use; default $UNDOLOG_URL, "
                             "else port $PORT of 127.0.0.1: %(default)s")
    parser.add_argument("--own-server", action="store_true",
                        help="start a throwaway server even if one is running at --url")
    parser.add_argument("--interactive", action="store_true",
                        help="wait for a person to decide in the dashboard instead of the "
                             "scripted reviewer")
    parser.add_argument("--framework", choices=("scripted", "langgraph"), default="scripted",
                        help="the agent: undolog's ScriptedAgent, or a LangGraph agent driven by "
                             "LangChain's fake chat model (needs undolog[langchain])")
    parser.add_argument("--rewind", action="store_true",
                        help="play the reference guide's rewind demo instead, made real: "
                             "a LangGraph agent's thread taken back to its first checkpoint "
                             "undoes what it did (needs undolog[langchain])")
    parser.add_argument("--var-dir", type=Path, default=REPO / "var" / "demo",
                        help="where its own server keeps its database and Redis socket "
                             "(wiped first)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    url = args.url.rstrip("/")
    if not args.own_server and is_up(url):
        server = attach(url)
    else:
        why = "as asked" if args.own_server else f"no server at {url}"
        print(f"{why}: starting one of its own (SQLite and Redis under {args.var_dir})",
              flush=True)
        server = start(args.var_dir)
    demo = Demo(server, args.var_dir, interactive=args.interactive,
                say=lambda line: print(line, flush=True), framework=args.framework,
                rewind=args.rewind)
    try:
        demo.run()
    finally:
        demo.close()
        if server.own:
            server.stop()
            print(f"\nstopped the demo's server (log: {server.log})")
    print(f"done in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
