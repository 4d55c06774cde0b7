"""Each framework extra installs cleanly in a fresh venv and its adapter imports.

``python sdk/scripts/check_extras.py`` (``make extras``, part of ``make check``): for
``undolog[langchain]`` and ``undolog[openai-agents]``, a new venv under var/extras/,
``pip install ./sdk[extra]`` (the resolver picks the newest releases the extra's range
allows), then imports the adapter and checks that the core SDK alone pulled in no
framework. Prints what was installed and how long each took.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "sdk"
EXTRAS = {
    "langchain": ("undolog.integrations.langchain", ("langchain", "langchain-core", "langgraph")),
    "openai-agents": ("undolog.integrations.openai_agents", ("openai-agents",)),
    "otel": ("undolog._http", ("opentelemetry-api",)),
}
PROBE = """
import sys, undolog
assert not any(m.split('.')[0] in ('langchain', 'langgraph', 'agents') for m in sys.modules)
import {module}
print('{module} imports')
"""


def check(extra: str, module: str, packages: tuple[str, ...], base: Path) -> float:
    started = time.monotonic()
    env_dir = base / extra
    shutil.rmtree(env_dir, ignore_errors=True)
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", f"{SDK}[{extra}]"], check=True)
    subprocess.run([python, "-c", PROBE.format(module=module)], check=True)
    versions = subprocess.run([python, "-m", "pip", "show", *packages], check=True,
                              capture_output=True, text=True).stdout
    found = [line.split(": ", 1)[1] for line in versions.splitlines()
             if line.startswith(("Name:", "Version:"))]
    took = time.monotonic() - started
    pairs = " ".join(f"{n}=={v}" for n, v in zip(found[::2], found[1::2], strict=True))
    print(f"undolog[{extra}]: fresh venv, installed {pairs}, adapter imports ({took:.0f} s)")
    shutil.rmtree(env_dir, ignore_errors=True)
    return took


def main() -> None:
    base = ROOT / "var" / "extras"
    base.mkdir(parents=True, exist_ok=True)
    total = sum(check(extra, module, packages, base)
                for extra, (module, packages) in EXTRAS.items())
    print(f"extras ok in {total:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
