"""Security headers on every response, by path (one ASGI middleware, streaming untouched):

- ``/ui`` and everything under it (the page and ``/ui/static/*``), ``/docs``: a Content-Security-Policy
  allowing this origin only with ``frame-ancestors 'none'``, ``X-Frame-Options: DENY``,
  ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer``: the dashboard keeps the
  token in ``sessionStorage``; no other origin may script it, frame it or receive its URLs.
- ``/v1/*`` (every authenticated answer, the one-time token of ``POST /v1/tenants/{id}/tokens``
  included): ``Cache-Control: no-store`` and ``nosniff``.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

UI_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
          "frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'")
#: Swagger UI sets inline styles; its scripts still come from this origin only
DOCS_CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
            "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'")
_PAGE = {"x-frame-options": "DENY", "x-content-type-options": "nosniff", "referrer-policy": "no-referrer"}


def headers_for(path: str) -> dict[str, str]:
    """The security headers a response to ``path`` carries (lower-case names)."""
    if path == "/ui" or path.startswith("/ui/"):
        return {"content-security-policy": UI_CSP, **_PAGE}
    if path == "/docs" or path.startswith("/docs/"):
        return {"content-security-policy": DOCS_CSP, **_PAGE}
    if path.startswith("/v1/") or path == "/v1":
        return {"cache-control": "no-store", "x-content-type-options": "nosniff"}
    return {}


class SecurityHeaders:
    """Sets :func:`headers_for` on every HTTP response (replacing the same headers a route set)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        extra = headers_for(scope.get("path", "")) if scope["type"] == "http" else {}
        if not extra:
            await self.app(scope, receive, send)
            return
        add = [(k.encode(), v.encode()) for k, v in extra.items()]

        async def send_with(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.decode("latin-1").lower() not in extra]
                message = {**message, "headers": kept + add}
            await send(message)

        await self.app(scope, receive, send_with)
