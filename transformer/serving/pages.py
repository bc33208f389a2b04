"""The routes a browser reads: the page and its files, the OpenAPI schema, and its page at ``/docs``.

The page and its files hold no data and no key: they load without one, and the page asks its user for the
key when the service wants one (``static/page.js``). The schema and ``/docs`` are behind the key; a browser
opening them sends no header, so once the page has the key it asks ``POST /docs/access`` for a cookie that
opens these two routes alone (``keys.py``). ``/docs`` is Swagger UI served from this machine (the
``swagger-ui-py`` package of the serve extra holds its files), so it works offline; without that package
the route is left out and the schema stays at /openapi.json.
"""

from importlib import resources
from pathlib import Path

from fastapi import Depends, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, Response
from starlette.exceptions import HTTPException

from transformer.serving.keys import DOCS_COOKIE

STATIC = Path(__file__).with_name("static")
PAGE_FILES = ("page.js", "page.css")  # what the page loads besides index.html
SWAGGER_FILES = ("swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png")


def swagger_folder() -> Path | None:
    """The folder of Swagger UI's files, or None when the package that holds them is not installed."""
    try:
        folder = Path(str(resources.files("swagger_ui") / "static"))
    except ModuleNotFoundError:
        return None
    return folder if all((folder / name).is_file() for name in SWAGGER_FILES) else None


def add_pages(app: FastAPI, authorized) -> None:
    """The page, its files, and the OpenAPI schema and its page behind ``authorized`` (the API key)."""
    swagger = swagger_folder()
    files = {name: STATIC / name for name in PAGE_FILES}
    if swagger is not None:
        files |= {name: swagger / name for name in SWAGGER_FILES}

    @app.get("/", include_in_schema=False)
    async def page():
        return FileResponse(STATIC / "index.html")

    @app.get("/static/{name}", include_in_schema=False)
    async def static(name: str):
        if name not in files:
            raise HTTPException(404, f"no file {name}")
        return FileResponse(files[name])

    async def docs_authorized(request: Request) -> None:
        if not app.state.key.admits_docs(request):
            raise HTTPException(401, "Authorization: Bearer KEY is missing or wrong (or open the page first)")

    @app.post("/docs/access", dependencies=[Depends(authorized)], include_in_schema=False)
    async def docs_access() -> Response:
        """The cookie that opens /docs and /openapi.json in this browser (only they accept it)."""
        response = Response(status_code=204)
        if app.state.key.required:
            response.set_cookie(DOCS_COOKIE, app.state.key.docs_token, httponly=True, samesite="strict")
        return response

    @app.get("/openapi.json", dependencies=[Depends(docs_authorized)], include_in_schema=False)
    async def openapi() -> dict:
        return app.openapi()

    if swagger is None:
        return

    @app.get("/docs", dependencies=[Depends(docs_authorized)], include_in_schema=False)
    async def docs():
        return get_swagger_ui_html(
            openapi_url="/openapi.json", title=app.title, swagger_js_url="/static/swagger-ui-bundle.js",
            swagger_css_url="/static/swagger-ui.css", swagger_favicon_url="/static/favicon-32x32.png",
        )  # fmt: skip
