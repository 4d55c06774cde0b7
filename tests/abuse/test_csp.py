"""The dashboard's Content-Security-Policy: scripts from our own files only, no inline script;
and no template carries one (the browser tests in tests/dashboard run under the policy)."""

from __future__ import annotations

import re
from pathlib import Path

from undolog_site.middleware import ContentSecurityPolicyMiddleware

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


def test_dashboard_pages_login_and_admin_carry_the_policy(acme, client):
    client.force_login(acme.reviewer.user)
    for path in ("/", "/accounts/login/", "/admin/login/"):
        policy = client.get(path)["Content-Security-Policy"]
        assert "script-src 'self';" in policy and "unsafe-inline' " not in policy.split("style-src")[0], path
        assert "object-src 'none'" in policy and "frame-ancestors 'none'" in policy


def test_the_api_answers_json_without_the_policy(acme):
    assert "Content-Security-Policy" not in acme.viewer.get("/api/v1/org/settings")


def test_no_template_has_an_inline_script_or_a_handler_attribute():
    inline = re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")[^>]*>", re.I)
    handler = re.compile(r"\son[a-z]+\s*=", re.I)
    for template in TEMPLATES.rglob("*.html"):
        text = template.read_text()
        assert not inline.search(text), template
        assert not handler.search(text), template
        assert "javascript:" not in text, template
    assert "'unsafe-eval'" not in ContentSecurityPolicyMiddleware.POLICY
