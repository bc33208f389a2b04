"""The HTTP translation service (``serve.py``): a FastAPI app whose one worker thread owns the model and
decodes the requests that arrive together as one batch, LibreTranslate's API for its existing clients, and a
page that shows each translation's cross-attention. Needs the ``serve`` extra; no other tier imports it.

    schema.py          what a request may hold and the service's limits, stated in the OpenAPI schema
    keys.py            the API key: bytes, from the Authorization header, the page's cookie or api_key
    answers.py         a group of jobs decoded together; what each gets back; a failure kept to its job
    batcher.py         the worker: a bounded queue, batches gathered under load, callers who left dropped
    handling.py        a request's job queued and awaited (or dropped when its caller hangs up); refusals
    libretranslate.py  LibreTranslate's routes under /libretranslate/
    pages.py           the page, its files, the OpenAPI schema and /docs (Swagger UI served offline)
    app.py             the app: /translate, /health, /model, errors, the body size limit
    static/            the page: plain HTML and JavaScript, no build step, no CDN
"""
