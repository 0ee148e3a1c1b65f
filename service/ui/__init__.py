"""The web dashboard: static files shipped in this package, served by the API at ``/ui/``.

``mount(app)`` serves ``/ui/static/*`` (the ES modules, the stylesheet, the icon) and answers every
other ``/ui/...`` path (``/ui/``, ``/ui/jobs/7``, ``/ui/cluster``) with the single page's
``index.html``, so deep links work. Nothing is fetched from anywhere else: the Content-Security-Policy
(``service.api.headers``, on every ``/ui`` response including the static files) allows this origin only.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"
#: the CSP, frame and nosniff headers of every /ui response (static files included) are set by
#: ``service.api.headers``; the page itself is revalidated on each load
HEADERS = {"Cache-Control": "no-cache"}


def mount(app: FastAPI) -> None:
    """Serve the dashboard under ``/ui/`` (same origin as the API)."""
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")

    @app.get("/ui", include_in_schema=False)
    def ui_root() -> RedirectResponse:
        return RedirectResponse("/ui/", status_code=308)

    @app.get("/ui/{path:path}", include_in_schema=False)
    def ui_page(path: str) -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html", headers=HEADERS)
