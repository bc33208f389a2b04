"""Serve a trained model over HTTP: POST /translate, GET /health, GET /model, and a page at / that shows
each translation's cross-attention.

    python serve.py --checkpoint runs/multi30k_de_en/best.pt                # http://127.0.0.1:8000
    python serve.py --checkpoint runs/multi30k_de_en --port 8080 --api-key-env TRANSLATE_KEY
    curl -s 127.0.0.1:8000/translate -H 'Content-Type: application/json' -d '{"texts": ["Ein Hund läuft."]}'

Requests that arrive together are decoded as one batch by a single worker (``transformer/serving/``).
Needs the serve extra: pip install -e ".[serve]".
"""

import argparse
import os
import sys

from transformer.training.usage import UsageParser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = UsageParser(prog="serve.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkpoint", required=True, help="best.pt, a run folder, a Marian folder or hf:NAME"
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: this machine only)"
    )
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, auto")
    parser.add_argument("--precision", default="auto", help="auto, fp32, bf16, fp16, int8, int8-bf16")
    parser.add_argument("--api-key-env", metavar="NAME", help="require Authorization: Bearer $NAME")
    parser.add_argument("--max-wait-ms", type=float, default=25.0,
                        help="how long a batch waits for the next request (4x at most)")  # fmt: skip
    parser.add_argument(
        "--max-tokens", type=int, default=8000, help="source tokens that close a batch at once"
    )
    parser.add_argument("--max-texts", type=int, default=64, help="texts per request")
    parser.add_argument("--max-chars", type=int, default=2000, help="characters per text")
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20, help="request body size limit")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import uvicorn

        from transformer.serving.app import create_app
        from transformer.serving.schema import Limits
    except ImportError as error:
        print(f'error: serving needs the serve extra ({error.name} is missing): pip install -e ".[serve]"',
              file=sys.stderr)  # fmt: skip
        return 1
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            print(f"error: --api-key-env {args.api_key_env}: that environment variable is empty or unset",
                  file=sys.stderr)  # fmt: skip
            return 1
    limits = Limits(max_texts=args.max_texts, max_chars=args.max_chars, max_body_bytes=args.max_body_bytes)
    app = create_app(args.checkpoint, args.device, args.precision, api_key, limits, args.max_wait_ms,
                     args.max_tokens)  # fmt: skip
    uvicorn.run(app, host=args.host, port=args.port, timeout_graceful_shutdown=60, log_level="info")
    return 0


if __name__ == "__main__":
    sys.exit(main())
