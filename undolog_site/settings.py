"""undolog settings: one file, driven by environment variables.

The defaults give a working local setup (SQLite under var/, the embedded Redis that
`make run` starts on a unix socket under var/). Production sets DATABASE_URL,
REDIS_URL, SECRET_KEY, ALLOWED_HOSTS and DEBUG=0, and then refuses to boot without them.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from undolog_site import embedded_redis

BASE_DIR = Path(__file__).resolve().parent.parent


def envbool(name: str, default: str) -> bool:
    value = os.environ.get(name, default).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false), not {value!r}")


def envint(name: str, default: str) -> int:
    value = os.environ.get(name, default)
    try:
        return int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, not {value!r}") from None


def envlist(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


VAR_DIR = Path(os.environ.get("UNDOLOG_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)
DEBUG = envbool("DEBUG", "1")

SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off")
    SECRET_KEY = "insecure-dev-key-only-for-debug-" + "x" * 32

ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", "127.0.0.1,localhost,testserver" if DEBUG else "")
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "core",
    "orgs",
    "effects",
    "approvals",
    "budgets",
    "deliveries",
    "ops",
    "lifecycle",  # the workflows that join the apps listed above (its tasks, its receivers)
]

MIDDLEWARE = [
    "core.logs.RequestIdMiddleware",  # first: every later line of the request carries its id
    "undolog_site.middleware.DatabaseUnavailableMiddleware",
    "undolog_site.middleware.NulRefusedMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "undolog_site.middleware.ContentSecurityPolicyMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # An agent's intercept and commit are answered here when the fast path can: nothing below
    # applies to them, and every call of a fleet would pay it (the middleware's docstring says why).
    "undolog_site.middleware.FastPathMiddleware",
    "undolog_site.staticfiles.StaticFilesMiddleware",  # WhiteNoise, streaming async under ASGI
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "undolog_site.urls"
WSGI_APPLICATION = "undolog_site.wsgi.application"
ASGI_APPLICATION = "undolog_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Database: SQLite under var/ by default, PostgreSQL through DATABASE_URL.
DATABASE_URL = os.environ.get("DATABASE_URL", "")


def parse_database_url(url: str) -> dict:
    """dj-database-url's parse, plus libpq's multi-host form, which it refuses when the hosts carry
    ports: `postgres://user@db1:5432,db2:5432/undolog?target_session_attrs=read-write` (a primary
    and its standby: psycopg tries them in order and keeps the one that accepts writes). Django
    hands HOST and PORT to libpq as given, and libpq reads comma-separated lists in both."""
    scheme, _, rest = url.partition("://")
    netloc, slash, tail = rest.partition("/")
    auth, at, hosts = netloc.rpartition("@")
    if "," not in hosts:
        return dj_database_url.parse(url)
    pairs = [_host_and_port(host) for host in hosts.split(",")]
    db = dj_database_url.parse(f"{scheme}://{auth}{at}multihost{slash}{tail}")
    db["HOST"] = ",".join(host for host, _ in pairs)
    db["PORT"] = ",".join(port or "5432" for _, port in pairs)
    return db


def _host_and_port(item: str) -> tuple[str, str]:
    if item.startswith("["):  # [::1]:5432
        host, _, port = item[1:].partition("]")
        return host, port.lstrip(":")
    host, _, port = item.partition(":")
    return host, port


if DATABASE_URL:
    default_db = parse_database_url(DATABASE_URL)
else:
    default_db = {"ENGINE": "django.db.backends.sqlite3", "NAME": VAR_DIR / "undolog.sqlite3"}

if default_db["ENGINE"] == "django.db.backends.sqlite3":
    # IMMEDIATE takes the write lock at BEGIN, so two writers queue on the busy timeout
    # instead of one failing with "database is locked" when it upgrades a read lock.
    default_db["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # A file, not :memory:, so that the worker and server processes that tests start
    # see the same test database.
    default_db["TEST"] = {"NAME": str(VAR_DIR / "test-undolog.sqlite3")}
elif default_db["ENGINE"] == "django.db.backends.postgresql":
    # Django's psycopg pool, not CONN_MAX_AGE: persistent connections leak under ASGI.
    default_db["CONN_MAX_AGE"] = 0
    # Fail fast (README, "Deploying and scaling"): while the database is away a request waits at
    # most DB_POOL_TIMEOUT_S for a connection and answers 503, well inside a load balancer's
    # health-check timeout; a connection attempt gives up after DB_CONNECT_TIMEOUT_S per host
    # (libpq's floor is 2 s), and a connection whose packets stop being acknowledged (a partition,
    # a host that died without a FIN) is dropped after DB_TCP_USER_TIMEOUT_MS, not after the
    # kernel's ~15 minutes of retransmissions. Options from the URL's query string win.
    DB_POOL_TIMEOUT_S = envint("DB_POOL_TIMEOUT_MS", "2000") / 1000
    default_db["OPTIONS"] = {
        "connect_timeout": envint("DB_CONNECT_TIMEOUT_S", "2"),
        "keepalives": 1,
        "keepalives_idle": 1,
        "keepalives_interval": 1,
        "keepalives_count": 3,
        "tcp_user_timeout": envint("DB_TCP_USER_TIMEOUT_MS", "3000"),
        **default_db.get("OPTIONS", {}),
        "pool": {
            "min_size": envint("DB_POOL_MIN", "1"),
            "max_size": envint("DB_POOL_MAX", "40"),
            "timeout": DB_POOL_TIMEOUT_S,
            # The pool's own reconnection attempts back off exponentially (1, 2, 4 … s) for this
            # long: kept short, an outage's attempt gives up within seconds and the next request
            # starts a fresh one, so the pool is back within a request of the database (with the
            # default 5 minutes it could wait a doubled delay of a minute after the database was).
            "reconnect_timeout": DB_POOL_TIMEOUT_S,
        },
        # Only server-side-binding cursors prepare: the intercept's fast path (lifecycle/fastpath.py)
        # has its one statement planned once per connection. Django's own cursors bind on the
        # client and never prepare, so this changes nothing else.
        "prepare_threshold": 1,
    }
DATABASES = {"default": default_db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Redis: the Celery broker, the Channels layer and the long-poll wake-ups.
# The embedded one is per var dir and database (undolog_site/embedded_redis.py says why).
REDIS_URL = os.environ.get("REDIS_URL") or f"unix://{embedded_redis.socket_for(VAR_DIR, DATABASE_URL)}"
EMBEDDED_REDIS = "REDIS_URL" not in os.environ or envbool("UNDOLOG_EMBEDDED_REDIS", "0")


def celery_url(redis_url: str) -> str:
    # redis-py spells a socket unix:///path; kombu spells it redis+socket:///path.
    if redis_url.startswith("unix://"):
        return "redis+socket://" + redis_url[len("unix://") :]
    return redis_url


CELERY_BROKER_URL = celery_url(REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = 300
CELERY_TASK_SOFT_TIME_LIMIT = 240
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Countdowns never exceed this (DESIGN: deadlines live in rows, a beat sweep finds them).
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_TASK_ALWAYS_EAGER = envbool("CELERY_TASK_ALWAYS_EAGER", "0")
CELERY_BEAT_SCHEDULE: dict = {
    # Approval deadlines: a guarded sweep of due rows, so a restarted worker catches up.
    "approvals.sweep_deadlines": {"task": "approvals.tasks.sweep_deadlines", "schedule": 2.0,
                                  "options": {"expires": 10}},
    # Deliveries (webhooks' events, executions, escalations, emails) whose message was lost
    # or whose worker died holding them (rows are the truth).
    "deliveries.sweep": {"task": "deliveries.tasks.sweep", "schedule": 5.0, "options": {"expires": 30}},
    # The outbox: events whose process died before fanning them out.
    "approvals.sweep_events": {"task": "approvals.tasks.sweep_events", "schedule": 5.0, "options": {"expires": 30}},
    # Slack messages whose post or update has not gone out (a lost message, Slack down).
    "approvals.sweep_slack": {"task": "approvals.tasks.sweep_slack", "schedule": 15.0,
                              "options": {"expires": 30}},
}

# How long a rotated agent key keeps working beside its successor (orgs.models.AgentKey.rotate).
UNDOLOG_KEY_ROTATION_GRACE_S = envint("UNDOLOG_KEY_ROTATION_GRACE_S", "86400")

# The compensation walk (lifecycle/undo.py). A running claim that outlives its function's timeout
# by UNDOLOG_UNDO_STALL_S, or a walk that sits still that long, is taken over by the sweep.
UNDOLOG_UNDO_SWEEP_S = envint("UNDOLOG_UNDO_SWEEP_S", "5")
UNDOLOG_UNDO_STALL_S = envint("UNDOLOG_UNDO_STALL_S", "30")
UNDOLOG_UNDO_MAX_BACKOFF_S = envint("UNDOLOG_UNDO_MAX_BACKOFF_S", "3600")
# One task runs the walk this long at most, then re-enqueues itself (below the task time limit).
UNDOLOG_UNDO_WALK_BUDGET_S = envint("UNDOLOG_UNDO_WALK_BUDGET_S", "60")
CELERY_BEAT_SCHEDULE["undo-sweep"] = {
    "task": "effects.tasks.sweep_undo_walks",
    "schedule": float(UNDOLOG_UNDO_SWEEP_S),
    "options": {"expires": float(UNDOLOG_UNDO_SWEEP_S)},  # a backlog of sweeps is one sweep
}



def channel_layer_host(redis_url: str) -> dict:
    """One channel layer host: the URL, and a read timeout above the layer's blocking receive.

    channels-redis 4.3 waits for a socket's next message in a 5 s `BZPOPMIN`
    (`RedisChannelLayer.brpop_timeout`), and redis-py 8's asyncio connections give up on any read
    after `socket_timeout`, whose default is also 5 s: the read lost that race, and every quiet
    dashboard socket was closed as "Redis unreachable" every ~5 s. A dict host is passed to
    `ConnectionPool.from_url(address, **rest)` as is (channels_redis.utils.create_pool); a read
    timeout of three blocking rounds still notices a Redis that stopped answering. That read no
    longer ends a receive whose cancellation Python 3.11 lost (before, it did, by accident): the
    layer's class does (core/channel_layer.py)."""
    return {"address": redis_url, "socket_timeout": 15, "socket_connect_timeout": 5}


# channels-redis' layer, whose receive stops when cancelled on Python 3.11 too (core/channel_layer.py).
CHANNEL_LAYER_BACKEND = "core.channel_layer.RedisChannelLayer"
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": CHANNEL_LAYER_BACKEND,
        "CONFIG": {"hosts": [channel_layer_host(REDIS_URL)], "prefix": "undolog"},
    }
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT", VAR_DIR / "staticfiles"))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
WHITENOISE_USE_FINDERS = DEBUG
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

# Agents send args up to 256 KiB (checked per call); the body limit leaves room for the rest.
DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024
UNDOLOG_MAX_ARGS_BYTES = 256 * 1024
# Run-aware policy (effects/outputs.py): a reported SAFE output (or a run's inputs) up to 256 KiB of
# JSON; fingerprints kept per run up to this many (past it tainted() fails closed).
UNDOLOG_MAX_OUTPUT_BYTES = 256 * 1024
# Pre-images (issue 42, effects/preimages.py): what a compensable tool's `before` read found,
# sealed at rest (core/seal.py) with UNDOLOG_SEAL_KEY; UNDOLOG_SEAL_KEYS_OLD still unseal after a
# rotation. The bounds: one entry's (a declaration's max_bytes may only lower it) and one run's.
UNDOLOG_SEAL_KEY = os.environ.get("UNDOLOG_SEAL_KEY", "")
UNDOLOG_SEAL_KEYS_OLD = envlist("UNDOLOG_SEAL_KEYS_OLD", "")
# One entry's at most 900 KiB by default: it comes in one request (DATA_UPLOAD_MAX_MEMORY_SIZE).
UNDOLOG_PRE_IMAGE_MAX_BYTES = envint("UNDOLOG_PRE_IMAGE_MAX_BYTES", str(900 * 1024))
UNDOLOG_PRE_IMAGE_RUN_MAX_BYTES = envint("UNDOLOG_PRE_IMAGE_RUN_MAX_BYTES", str(64 * 1024 * 1024))
UNDOLOG_RUN_FINGERPRINTS = 50_000

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "orgs.auth.AgentKeyAuthentication",
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_THROTTLE_CLASSES": ["orgs.auth.ApiRateLimit"],
    "DEFAULT_PARSER_CLASSES": ["core.parsers.DepthLimitedJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["core.renderers.NewlineJSONRenderer"],  # answers end with a newline
    "EXCEPTION_HANDLER": "core.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "undolog API",
    "DESCRIPTION": "Effect log, undo stacks, approvals and autonomy budgets for AI agents.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI served from our own static files: the docs work with no internet.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Request bodies are components of their own (`ToolRequest`), responses keep the plain
    # name (`Tool`): the response shapes are TypedDicts (core/schema.py), the requests serializers.
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "core.schema.add_common_errors"],
    "TAGS": [
        {"name": "registry", "description": "Tools and compensation functions, declared once per org."},
        {"name": "sessions", "description": "Runs of an agent; the intercept every changing call goes through."},
        {"name": "effects", "description": "The effect log: commit, fail, long-poll."},
        {"name": "undo entries", "description": "Compensations on the undo stacks, and the two ways out."},
        {"name": "approvals", "description": "The reviewers' queue and their decisions."},
        {"name": "budgets", "description": "Autonomy budgets: limits, usage, what remains, sizing help."},
        {"name": "agents", "description": "Agents' states: suspend and resume."},
        {"name": "incident", "description": "The org-wide incident switch."},
        {"name": "streams", "description": "Refusals and the audit stream, by cursor."},
        {"name": "org", "description": "The org's settings."},
        {"name": "webhooks", "description": "Where the org's events go."},
    ],
}

# Outgoing webhooks may reach loopback/private addresses only when this is on (SSRF).
UNDOLOG_ALLOW_PRIVATE_WEBHOOKS = envbool("UNDOLOG_ALLOW_PRIVATE_WEBHOOKS", "1" if DEBUG else "0")
# Outgoing notification webhooks: per-request timeout, attempts, and the first retry's
# delay (doubling each time, at most 1 h between attempts).
UNDOLOG_WEBHOOK_TIMEOUT_MS = envint("UNDOLOG_WEBHOOK_TIMEOUT_MS", "10000")
UNDOLOG_WEBHOOK_MAX_ATTEMPTS = envint("UNDOLOG_WEBHOOK_MAX_ATTEMPTS", "6")
UNDOLOG_WEBHOOK_RETRY_BASE_MS = envint("UNDOLOG_WEBHOOK_RETRY_BASE_MS", "1000")
# Executor webhooks (an approved call run by the worker): attempts before the effect fails.
UNDOLOG_EXECUTOR_MAX_ATTEMPTS = envint("UNDOLOG_EXECUTOR_MAX_ATTEMPTS", "3")
# Slack (approvals/slack.py): the Web API's base (a test points it at a local fake), the
# dashboard's public address for links in messages, and how often unsynced messages are retried.
UNDOLOG_SLACK_API_URL = os.environ.get("UNDOLOG_SLACK_API_URL", "https://slack.com/api/")
UNDOLOG_PUBLIC_URL = os.environ.get("UNDOLOG_PUBLIC_URL", "").rstrip("/")
UNDOLOG_SLACK_MAX_ATTEMPTS = envint("UNDOLOG_SLACK_MAX_ATTEMPTS", "5")
# The outbox (approvals/notify.py): an event not fanned out this long after it was recorded
# (its process died between the commit and the fan-out) is fanned out by the beat's sweep.
UNDOLOG_OUTBOX_GRACE_S = envint("UNDOLOG_OUTBOX_GRACE_S", "5")
# The fast approval path's fan-out (lifecycle/fastapproval.py, core.fanout.after_answer): on a
# thread of its own once the answer is on its way (1), or in the request right after its commit,
# as the pipeline's (0: in-process tests written before it, which read the fan-out at once).
UNDOLOG_FANOUT_AFTER_ANSWER = envbool("UNDOLOG_FANOUT_AFTER_ANSWER", "1")
# ... and the events of a burst within this window are fanned out together: one claim statement
# and one group message per org for all of them (well under the dashboard's 1 s promise).
UNDOLOG_FANOUT_WINDOW_MS = envint("UNDOLOG_FANOUT_WINDOW_MS", "50")
# Abandoned runs (lifecycle/abandon.py): how often the beat looks for runs silent past their
# org's (or agent's) run_idle_timeout_s.
UNDOLOG_ABANDON_SWEEP_S = envint("UNDOLOG_ABANDON_SWEEP_S", "15")
CELERY_BEAT_SCHEDULE["effects.sweep_abandoned"] = {
    "task": "effects.tasks.sweep_abandoned", "schedule": float(UNDOLOG_ABANDON_SWEEP_S),
    "options": {"expires": float(UNDOLOG_ABANDON_SWEEP_S)},
}
# Fault injection for the tests that kill a process at the worst moment (core/faults.py):
# read only when the test suite says so, so a stray variable in production does nothing.
TESTING = envbool("UNDOLOG_TESTING", "0")
UNDOLOG_TEST_FAULT = os.environ.get("UNDOLOG_TEST_FAULT", "") if TESTING else ""
# Longest long poll on GET /api/v1/effects/{id}?wait=
UNDOLOG_MAX_WAIT_S = 60
# session.updated (core/fanout.py): a run's changes within this window reach open dashboards
# as one message, so a burst of transitions is one nudge, not hundreds; well under the 1 s promise.
UNDOLOG_SESSION_UPDATE_WINDOW_MS = envint("UNDOLOG_SESSION_UPDATE_WINDOW_MS", "100")

# API rate limits (core/ratelimit.py), counted in Redis across nodes: requests per minute per
# key (an agent key, or a person's token or session) and per org; an org may set its own
# (org settings). Sized so a busy agent never meets them and a loop stuck at full speed does.
UNDOLOG_RATE_LIMITS = envbool("UNDOLOG_RATE_LIMITS", "1")
UNDOLOG_RATE_LIMIT_PER_KEY = envint("UNDOLOG_RATE_LIMIT_PER_KEY", "1200")
UNDOLOG_RATE_LIMIT_PER_ORG = envint("UNDOLOG_RATE_LIMIT_PER_ORG", "6000")
# Redis down: the limiter waits this long for it, then lets requests through without asking
# for this many seconds (fail open: the API keeps working on PostgreSQL alone).
UNDOLOG_RATE_LIMIT_TIMEOUT_MS = envint("UNDOLOG_RATE_LIMIT_TIMEOUT_MS", "250")
UNDOLOG_RATE_LIMIT_BACKOFF_S = envint("UNDOLOG_RATE_LIMIT_BACKOFF_S", "5")
# How long a process may spend tokens it leased from Redis before giving the rest back (core/ratelimit.py).
UNDOLOG_RATE_LIMIT_LEASE_MS = envint("UNDOLOG_RATE_LIMIT_LEASE_MS", "250")
# Sign-in throttling (orgs/login.py): failed sign-ins per account and per address in a window.
UNDOLOG_LOGIN_FAILURES_PER_ACCOUNT = envint("UNDOLOG_LOGIN_FAILURES_PER_ACCOUNT", "5")
UNDOLOG_LOGIN_FAILURES_PER_ADDRESS = envint("UNDOLOG_LOGIN_FAILURES_PER_ADDRESS", "30")
UNDOLOG_LOGIN_WINDOW_S = envint("UNDOLOG_LOGIN_WINDOW_S", "900")
# 503 database_unavailable (undolog_site/middleware.py): when to try again.
UNDOLOG_DATABASE_RETRY_AFTER_S = envint("UNDOLOG_DATABASE_RETRY_AFTER_S", "2")
# /healthz answers within this whatever is down (undolog_site/health.py).
UNDOLOG_HEALTHZ_TIMEOUT_MS = envint("UNDOLOG_HEALTHZ_TIMEOUT_MS", "800")
# A task the broker could not take (core/enqueue.py): how long not to try again (the sweeps catch up).
UNDOLOG_ENQUEUE_BACKOFF_S = envint("UNDOLOG_ENQUEUE_BACKOFF_S", "5")
# How many proxies in front append to X-Forwarded-For (0: use the connection's address).
UNDOLOG_TRUSTED_PROXIES = envint("UNDOLOG_TRUSTED_PROXIES", "0")

EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "undolog@localhost")
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = envint("EMAIL_PORT", "25")
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = envbool("EMAIL_USE_TLS", "0")
EMAIL_FILE_PATH = os.environ.get("EMAIL_FILE_PATH", str(VAR_DIR / "mail"))

if not DEBUG:
    SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", "1")
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    # Browsers send Secure cookies back over plain HTTP to 127.0.0.1 and localhost only: a plain-HTTP
    # trial reached at any other address (a LAN IP) signs no one in until this is 0 (README).
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = envbool("UNDOLOG_SECURE_COOKIES", "1")
    SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", "31536000")
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_CONTENT_TYPE_NOSNIFF = True

# Metrics (ops/metrics.py): /metrics answers 404 until a token is set; Prometheus sends it as
# `Authorization: Bearer <token>`. Every process (web workers, Celery children) writes its counters
# under PROMETHEUS_MULTIPROC_DIR, read by prometheus_client at import: so it is set here, before
# any app imports it. The launcher empties it at start (a restart must not add to the old counts).
UNDOLOG_METRICS_TOKEN = os.environ.get("UNDOLOG_METRICS_TOKEN", "")
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(VAR_DIR / "metrics"))
Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]).mkdir(parents=True, exist_ok=True)

# The audit chain (ops/audit.py): sealed in order, in batches, by a beat task after commit.
UNDOLOG_AUDIT_SEAL_S = envint("UNDOLOG_AUDIT_SEAL_S", "2")
CELERY_BEAT_SCHEDULE["ops.seal_audit"] = {"task": "ops.tasks.seal_audit", "schedule": float(UNDOLOG_AUDIT_SEAL_S),
                                          "options": {"expires": 30}}
# Retention (ops/retention.py): what is past each org's retention is archived here as JSON Lines,
# then deleted, once an hour.
UNDOLOG_ARCHIVE_DIR = Path(os.environ.get("UNDOLOG_ARCHIVE_DIR", VAR_DIR / "archive"))
CELERY_BEAT_SCHEDULE["ops.purge"] = {"task": "ops.tasks.purge", "schedule": 3600.0, "options": {"expires": 600}}

# Where `make run`'s setupdemo keeps the demo agent's key (the tests point it elsewhere).
UNDOLOG_DEMO_KEY_FILE = Path(os.environ.get("UNDOLOG_DEMO_KEY_FILE", VAR_DIR / "demo-agent.key"))

# Logs: LOG_FORMAT=json for one JSON object per line; every line of a request carries its id.
LOG_FORMAT = os.environ.get("LOG_FORMAT", "text").strip().lower()
if LOG_FORMAT not in ("text", "json"):
    raise ImproperlyConfigured(f"LOG_FORMAT must be text or json, not {LOG_FORMAT!r}")
LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO").upper()
# Celery logs through these handlers, not its own (its periodic tasks' lines are DEBUG below).
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Loggers that say something on every task or tick: heard only when debugging.
_CHATTY = "DEBUG" if LOG_LEVEL == "DEBUG" else "WARNING"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_id": {"()": "core.logs.RequestIdFilter"},
                "client_errors_at_debug": {"()": "core.logs.ClientErrorsAtDebug"}},
    "formatters": {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"},
        "json": {"()": "core.logs.JsonFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT, "filters": ["request_id"]}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.db.backends": {"level": "INFO", "handlers": ["console"], "propagate": False},
        # A line per received and finished task, and per beat tick: every 2 s from the sweeps, they
        # buried everything else. Shown again with LOG_LEVEL=DEBUG.
        "celery.app.trace": {"level": _CHATTY},
        "celery.worker.strategy": {"level": _CHATTY},
        "celery.beat": {"level": _CHATTY},
        # The servers' own lines and Django's in the same format (one JSON object per line under
        # LOG_FORMAT=json), and once: Django's default "django" handler would print each a second time.
        "django": {"handlers": ["console"], "level": LOG_LEVEL, "propagate": False},
        # A WARNING per 4xx (a replay's 409, a budget's 429) told the operator nothing was wrong.
        "django.request": {"filters": ["client_errors_at_debug"]},
        # No level: the server's own --log-level keeps deciding (make run asks uvicorn for warnings only).
        **{name: {"handlers": ["console"], "propagate": False}
           for name in ("uvicorn", "uvicorn.error", "gunicorn.error")},
        # A line per request: the proxy in front logs those; LOG_LEVEL=DEBUG shows them here.
        **{name: {"handlers": ["console"], "level": _CHATTY,
                  "propagate": False} for name in ("uvicorn.access", "gunicorn.access")},
        # Connected, mingle: start-up chatter that would push `make run`'s summary off screen
        # (celery.apps.worker's one "ready" line stays: the tests wait for it).
        "celery.worker.consumer": {"level": _CHATTY},
        # A line per outgoing request (every compensation webhook): the attempt rows record them.
        "httpx": {"level": _CHATTY},
    },
}
