"""Benchmark settings: the product's production settings plus a baseline view, on PostgreSQL and Redis."""

import os

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/undolog_bench")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")
# As production runs it (no query logging), minus TLS: the bench speaks plain HTTP on loopback.
os.environ.setdefault("DEBUG", "0")
os.environ.setdefault("SECRET_KEY", "bench-only-secret-key-not-for-production-0123456789")
os.environ.setdefault("UNDOLOG_SEAL_KEY", "bench-only-seal-key-not-for-production-0123456789")
os.environ.setdefault("SECURE_SSL_REDIRECT", "0")
os.environ.setdefault("ALLOWED_HOSTS", "127.0.0.1,localhost")
os.environ.setdefault("UNDOLOG_ALLOW_PRIVATE_WEBHOOKS", "1")
os.environ.setdefault("LOG_LEVEL", "WARNING")

from undolog_site.settings import *  # noqa: F403

ROOT_URLCONF = "bench.urls"
