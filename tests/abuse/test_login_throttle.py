"""Sign-in throttling (orgs/login.py): failed sign-ins per account and per address, counted in
Redis; past a limit the form answers 429 with `Retry-After` and does not check the password."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.test import Client


def sign_in(username: str, password: str, address: str = "10.0.0.1", path: str = "/accounts/login/"):
    return Client(REMOTE_ADDR=address).post(path, {"username": username, "password": password})


def test_an_account_is_throttled_after_its_failures_even_with_the_right_password(db, settings):
    settings.UNDOLOG_LOGIN_FAILURES_PER_ACCOUNT = 3
    get_user_model().objects.create_user("ada", password="right-one")

    codes = [sign_in("ada", f"guess-{n}", address=f"10.0.0.{n}").status_code for n in range(3)]
    throttled = sign_in("Ada", "right-one", address="10.0.0.99")  # another address, other case

    assert codes == [200, 200, 200]  # the form again, with its error
    assert throttled.status_code == 429
    assert 1 <= int(throttled["Retry-After"]) <= settings.UNDOLOG_LOGIN_WINDOW_S
    assert b"Too many failed sign-ins" in throttled.content
    assert "_auth_user_id" not in throttled.wsgi_request.session


def test_an_address_is_throttled_across_accounts_and_a_success_clears_only_the_account(db, settings):
    settings.UNDOLOG_LOGIN_FAILURES_PER_ADDRESS = 4
    get_user_model().objects.create_user("bob", password="right-one")
    assert sign_in("bob", "wrong").status_code == 200
    assert sign_in("bob", "right-one").status_code == 302  # signed in; bob's counter starts again

    for n in range(3):
        assert sign_in(f"nobody-{n}", "x").status_code == 200
    assert sign_in("bob", "right-one").status_code == 429  # four failures from 10.0.0.1
    assert sign_in("bob", "right-one", address="10.0.0.2").status_code == 302


def test_the_admin_login_is_throttled_too(db, settings):
    settings.UNDOLOG_LOGIN_FAILURES_PER_ACCOUNT = 2
    get_user_model().objects.create_superuser("root", password="right-one")
    for _ in range(2):
        assert sign_in("root", "wrong", path="/admin/login/").status_code == 200
    response = sign_in("root", "right-one", path="/admin/login/")
    assert response.status_code == 200 and b"Too many failed sign-ins" in response.content
    assert "_auth_user_id" not in response.wsgi_request.session
