"""The web dashboard: static files shipped in this package, served by the API at ``/ui/``.

``mount(app)`` serves ``/ui/static/*`` (the ES modules, the stylesheet, the icon) and answers every
other ``/ui/...`` path (``/ui/``, ``/ui/jobs/7``, ``/ui/cluster``) with the single page's
``index.html``, so deep links work. Nothing is fetched from anywhere else: the Content-Security-Policy
allows this origin only.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-cache"}


def mount(app: FastAPI) -> None:
    """Serve the dashboard under ``/ui/`` (same origin as the API)."""
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")

    @app.get("/ui", include_in_schema=False)
    def ui_root() -> RedirectResponse:
        return RedirectResponse("/ui/", status_code=308)

    @app.get("/ui/{path:path}", include_in_schema=False)
    def ui_page(path: str) -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html", headers=HEADERS)
