"""``/docs``: Swagger UI served by the API itself, from the files the pinned ``swagger-ui-bundle-v2``
package ships (Swagger UI 5, which reads OpenAPI 3.1; no CDN: the dashboard's origin loads scripts
from itself only, see ``service.api.headers``). No inline script: the page loads ``/docs/init.js``, which points Swagger UI
at ``/openapi.json``. ReDoc is not served (it would need a CDN or another bundle).
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Orthoplex API</title>
<link rel="stylesheet" href="/docs/static/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="/docs/static/swagger-ui-bundle.js"></script>
<script src="/docs/init.js"></script>
</body>
</html>
"""
INIT = """window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
  validatorUrl: null,
});
"""


def mount(app: FastAPI) -> None:
    """Serve ``/docs``, ``/docs/init.js`` and ``/docs/static/*`` (create the app with ``docs_url=None``)."""
    from swagger_ui_bundle import swagger_ui_path

    app.mount("/docs/static", StaticFiles(directory=swagger_ui_path), name="docs-static")

    @app.get("/docs", include_in_schema=False)
    def docs_page() -> HTMLResponse:
        return HTMLResponse(PAGE)

    @app.get("/docs/init.js", include_in_schema=False)
    def docs_init() -> Response:
        return Response(INIT, media_type="text/javascript")
