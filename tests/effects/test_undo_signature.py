"""Webhook signatures: the verifier documented in effects/README.md accepts a real delivery and
rejects a bad signature, a tampered body, a stale timestamp; two secrets work during a rotation."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from approvals import webhooks
from effects.models import CompensationFunction, UndoAttempt
from orgs.models import new_webhook_secret
from tests.receiver import Receiver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager")]

README = Path(__file__).resolve().parents[2] / "effects" / "README.md"


def documented_verify():
    """The receiver's `verify` exactly as the README shows it."""
    section = README.read_text().split("## Verifying webhooks", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)
    return namespace["verify"]


@pytest.fixture
def delivery(stack_of, receiver):
    """A real compensation webhook, as the receiver got it: (raw body, signature header)."""
    stack_of(1).fail()
    (got,) = receiver.log
    return got.raw, got.headers["Undolog-Signature"]


@pytest.mark.parametrize("verify", [documented_verify(), webhooks.verify], ids=["readme", "approvals.webhooks"])
def test_it_accepts_a_genuine_delivery_and_rejects_a_bad_one(acme, delivery, verify):
    raw, header = delivery
    secret = acme.org.webhook_secret
    t = int(header.split(",")[0][2:])

    assert verify([secret], header, raw)
    assert not verify([new_webhook_secret()], header, raw)  # a bad signature
    assert not verify([secret], header, raw.replace(b"user1", b"user2"))  # a tampered body
    assert not verify([secret], header, raw + b" ")  # the raw bytes, not the parsed JSON
    assert not verify([secret], header, raw, now=t + 301)  # older than five minutes
    assert verify([secret], header, raw, now=t + 299)
    assert verify([new_webhook_secret(), secret], header, raw)  # two secrets during a rotation
    assert not verify([secret], "t=abc,v1=00", raw)
    assert not verify([secret], "", raw)
    assert not verify([secret], header.split(",")[1], raw)  # no timestamp


def test_it_matches_the_servers_signature_byte_for_byte():
    verify = documented_verify()
    body = b'{"fn_name":"undo_send_email","args":{"to":"a@x.io"}}'
    header = webhooks.sign("whsec_test", body, timestamp=int(time.time()))

    assert verify(["whsec_test"], header, body)


def test_it_escalates_at_once_when_the_receiver_rejects_the_signature(acme, stack_of):
    with Receiver(secrets=[new_webhook_secret()]) as strict:  # not acme's secret
        stack = stack_of(1)
        CompensationFunction.objects.filter(org=acme.org).update(target=strict.url)

        stack.fail()

    assert [d.verified for d in strict.log] == [False]
    (attempt,) = UndoAttempt.objects.filter(entry_id=stack.entries[0])
    assert (attempt.outcome, attempt.status_code) == ("permanent", 401)
    assert stack.session.state == "compensation_failed"


def test_it_is_accepted_with_two_secrets_while_the_org_rotates(acme, stack_of):
    old = acme.org.webhook_secret
    acme.org.webhook_secret = new_webhook_secret()
    acme.org.save(update_fields=["webhook_secret"])
    with Receiver(secrets=[acme.org.webhook_secret, old]) as rotating:
        stack = stack_of(1)
        CompensationFunction.objects.filter(org=acme.org).update(target=rotating.url)

        stack.fail()

    assert [d.verified for d in rotating.log] == [True]
    assert stack.session.state == "compensated"


def test_the_documented_receiver_undoes_a_real_delivery_once_and_refuses_a_bad_signature(acme, eager):
    """effects/README.md's complete receiver, run as written (with its verify) on a real port."""
    import threading
    from http.server import HTTPServer

    section = README.read_text().split("## Verifying webhooks", 1)[1]
    verify_code, receiver_code = re.findall(r"```python\n(.*?)```", section, re.S)[:2]
    namespace: dict = {}
    exec(compile(verify_code + receiver_code, str(README), "exec"), namespace)
    undone: list[tuple[str, dict]] = []
    namespace["SECRETS"][:] = [acme.org.webhook_secret]
    namespace["undo"] = lambda fn_name, args: undone.append((fn_name, args))
    server = HTTPServer(("127.0.0.1", 0), namespace["Undo"])
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/undo"
    try:
        from tests.effects.conftest import build_stack

        stack = build_stack(acme, url, 2)
        stack.fail()
        entry = stack.entry(0)
        again = webhooks.post(url, {"fn_name": "undo_send_email", "args": {"to": "user1@x.io"}},
                              secret=acme.org.webhook_secret, timeout_s=5, headers={"Idempotency-Key": str(entry.pk)})
        forged = webhooks.post(url, {"fn_name": "undo_send_email", "args": {}}, secret=new_webhook_secret(),
                               timeout_s=5, headers={"Idempotency-Key": "forged"})
    finally:
        server.shutdown()

    assert undone == [("undo_send_email", {"to": "user2@x.io"}), ("undo_send_email", {"to": "user1@x.io"})]
    assert stack.session.state == "compensated"
    assert (again.status_code, len(undone)) == (200, 2)  # a repeated key: 2xx, not undone twice
    assert (forged.status_code, forged.retryable) == (401, False)
