"""The HTTP translation service (``serve.py``): a FastAPI app whose one worker thread owns the model and
decodes the requests that arrive together as one batch, and a page that shows each translation's
cross-attention. Needs the ``serve`` extra (FastAPI, uvicorn); no other tier imports it.

    batcher.py   the worker: requests queued, grouped for a few milliseconds or a token budget, decoded
    schema.py    what a request may hold (strict: an unknown field is refused), and what an answer holds
    app.py       the routes (/translate, /health, /model, the page), the API key, the body size limit
    static/      the page: plain HTML and JavaScript, no build step, no CDN
"""
