"""An OpenID provider for the tests, in its own process: PyPI's oidc-provider-mock (authlib under Flask), with
clients required to register (so a wrong client secret is refused) and nonces required.

`--mode` makes it misbehave the way a broken or hostile provider would, to prove the portal refuses:
- `tamper`: the ID token's payload is changed after signing (a man in the middle adding a group);
- `foreign-issuer`: tokens are signed with the right key but name another issuer than the discovery document;
- `discovery-issuer`: the discovery document names another issuer than the URL it is read from;
- `--token-max-age -300`: ID tokens that expired five minutes before they were issued.

Run: python -m tests.identity.oidc_provider --port 9400 [--mode normal|tamper|foreign-issuer] [--token-max-age N]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

os.environ["AUTHLIB_INSECURE_TRANSPORT"] = "1"  # plain HTTP on loopback

import werkzeug.serving
from oidc_provider_mock import app as provider_app

StartResponse = Callable[..., Any]
Environ = dict[str, Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def tamper_id_token(id_token: str) -> str:
    """The same header and signature over a changed payload: an extra group the provider never granted."""
    header, payload, signature = id_token.split(".")
    claims = json.loads(_unb64(payload))
    claims["groups"] = [*claims.get("groups", []), "gpu-admins"]
    return ".".join([header, _b64(json.dumps(claims).encode()), signature])


def misbehaving(app: WSGIApp, mode: str) -> WSGIApp:
    def wrapped(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        if mode == "discovery-issuer" and environ.get("PATH_INFO") == "/.well-known/openid-configuration":
            environ["HTTP_HOST"] = "issuer.invalid"  # a document naming another issuer than the URL it is read from
            return app(environ, start_response)
        is_token = environ.get("PATH_INFO") == "/oauth2/token" and environ.get("REQUEST_METHOD") == "POST"
        if not is_token or mode in ("normal", "discovery-issuer"):
            return app(environ, start_response)
        if mode == "foreign-issuer":
            # authlib takes the `iss` claim from the request's host: another host, another issuer.
            environ["HTTP_HOST"] = "issuer.invalid"
            return app(environ, start_response)
        captured: dict[str, Any] = {}

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
            captured["status"], captured["headers"] = status, headers
            return lambda _data: None

        body = b"".join(app(environ, capture))
        if captured["status"].startswith("200"):
            doc = json.loads(body)
            doc["id_token"] = tamper_id_token(doc["id_token"])
            body = json.dumps(doc).encode()
        headers = [(k, v) for k, v in captured["headers"] if k.lower() != "content-length"]
        start_response(captured["status"], [*headers, ("Content-Length", str(len(body)))])
        return [body]

    return wrapped


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=["normal", "tamper", "foreign-issuer", "discovery-issuer"], default="normal")
    parser.add_argument("--token-max-age", type=int, default=3600)
    args = parser.parse_args()
    app = provider_app(
        require_client_registration=True,
        require_nonce=True,
        access_token_max_age=timedelta(seconds=args.token_max_age),
    )
    server = werkzeug.serving.make_server("127.0.0.1", args.port, misbehaving(app.wsgi_app, args.mode), threaded=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
