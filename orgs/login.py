"""Sign-in throttling: failed sign-ins are counted per account and per address (in Redis, so
across web nodes), and past either limit the form refuses for the rest of the window without
checking the password, so a guessing script learns nothing more.

Used by `/accounts/login/` and by the admin's login (one form). Only failures count: a
reviewer who signs in is not slowed by colleagues behind the same address, and a success
clears the account's counter. Redis down: not throttled (core/ratelimit.py fails open).
"""

from __future__ import annotations

import hashlib
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView

from core import ratelimit


def client_address(request) -> str:
    """The caller's address. Behind a load balancer, set `UNDOLOG_TRUSTED_PROXIES` to the number of
    proxies that append to X-Forwarded-For, so the address is the one the first proxy saw (a
    client can put anything it likes in front)."""
    hops = settings.UNDOLOG_TRUSTED_PROXIES
    forwarded = [part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if part.strip()]
    if hops and len(forwarded) >= hops:
        return forwarded[-hops]
    return request.META.get("REMOTE_ADDR", "")


def _counters(request, username: str) -> tuple[str, str]:
    account = hashlib.sha256(username.strip().lower().encode()).hexdigest()[:32]  # no usernames in Redis
    return f"undolog:login:account:{account}", f"undolog:login:address:{client_address(request)}"


class ThrottledLogin:
    """The throttle, mixed into Django's two sign-in forms."""

    throttled_for_s = 0

    def clean(self) -> dict[str, Any]:
        if self.request is None:  # a form built without a request (a shell): no address to count
            return super().clean()
        username = self.cleaned_data.get("username") or ""
        keys = _counters(self.request, username)
        limits = (settings.UNDOLOG_LOGIN_FAILURES_PER_ACCOUNT, settings.UNDOLOG_LOGIN_FAILURES_PER_ADDRESS)
        over = [ttl or settings.UNDOLOG_LOGIN_WINDOW_S
                for (count, ttl), limit in zip(ratelimit.failures(keys), limits, strict=True) if count >= limit]
        if over:
            self.throttled_for_s = max(over)
            minutes = -(-self.throttled_for_s // 60)
            raise forms.ValidationError(
                f"Too many failed sign-ins for this account or from this address. Try again in {minutes} "
                f"minute{'s' if minutes != 1 else ''}.", code="throttled")
        try:
            cleaned = super().clean()
        except forms.ValidationError:
            ratelimit.fail(keys, settings.UNDOLOG_LOGIN_WINDOW_S)
            raise
        ratelimit.forget(keys[:1])
        return cleaned


class ThrottledAuthenticationForm(ThrottledLogin, AuthenticationForm):
    pass


class ThrottledAdminAuthenticationForm(ThrottledLogin, AdminAuthenticationForm):
    pass


class ThrottledLoginView(LoginView):
    """`/accounts/login/`: a throttled sign-in answers 429 with `Retry-After`."""

    authentication_form = ThrottledAuthenticationForm

    def form_invalid(self, form):
        response = super().form_invalid(form)
        if form.throttled_for_s:
            response.status_code = 429
            response["Retry-After"] = str(form.throttled_for_s)
        return response
