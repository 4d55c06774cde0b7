from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
# Run from a checkout without installing: the package lives in ../src.
try:
    import undolog  # noqa: F401
except ImportError:
    sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from undolog import UndoLogClient  # noqa: E402

from fakeserver import FakeServer  # noqa: E402


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("UNDOLOG_URL", "UNDOLOG_API_KEY", "UNDOLOG_AGENT"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server() -> FakeServer:
    return FakeServer()


@pytest.fixture
def client(server: FakeServer) -> UndoLogClient:
    transport = server.transport()
    return UndoLogClient("http://undolog.test", "test-key", transport=transport,
                         async_transport=transport, poll_wait=1)
