"""Serve a trained model over HTTP: POST /translate, GET /health, GET /model, LibreTranslate's API under
/libretranslate/, the OpenAPI page at /docs, and a page at / that shows each translation's cross-attention.

    python serve.py --checkpoint runs/multi30k_de_en                        # http://127.0.0.1:8000
    python serve.py --checkpoint runs/multi30k_de_en --port 8080 --api-key-env TRANSLATE_KEY
    curl -s 127.0.0.1:8000/translate -H 'Content-Type: application/json' -d '{"texts": ["Ein Hund läuft."]}'

Requests that arrive together are decoded as one batch by a single worker (``transformer/serving/``). The
answers equal translate.py's with the same options; device and beam default as translate.py's do. The model
is loaded and the port opened before the service starts: a bad checkpoint, device or port is one error line
(exit status 1), a bad flag a usage error (exit status 2). Needs the serve extra: pip install -e ".[serve]".
"""

import argparse
import logging
import os
import socket
import sys

from transformer.core.checkpoint import CheckpointError
from transformer.interop.formats import run_folder_note
from transformer.runtime.precision import DECODE_PRECISIONS, DeviceError
from transformer.runtime.usage import UsageParser, command_name


def build_parser() -> UsageParser:
    """Every flag of serve.py with its help (docs/serving.md lists them)."""
    parser = UsageParser(prog=command_name("serve"), description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkpoint", required=True, help="best.pt, a run folder, a Marian folder or hf:NAME"
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: this machine only)"
    )
    parser.add_argument(
        "--port", type=int, default=8000, help="port to listen on (0: any free one) (default: %(default)s)"
    )
    parser.add_argument("--device", default="auto", help="auto (cuda if present), cpu, cuda, cuda:1, ...")
    parser.add_argument("--precision", default="auto", choices=DECODE_PRECISIONS,
                        help="as translate.py's: auto = bf16 on CUDA, fp32 on the CPU")  # fmt: skip
    parser.add_argument("--api-key-env", metavar="NAME",
                        help="require the key held in $NAME on every route that translates or describes the "
                        "model (docs/serving.md)")  # fmt: skip
    parser.add_argument(
        "--max-wait-ms", type=float, default=25.0,
        help="under load, how long a batch waits for the next request (4x at most) (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=8000,
        help="source tokens that close a batch at once (default: %(default)s)",
    )
    parser.add_argument(
        "--max-queue", type=int, default=512,
        help="texts waiting to be decoded; more are refused with 503 and Retry-After (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument("--max-texts", type=int, default=64, help="texts per request (default: %(default)s)")
    parser.add_argument(
        "--max-chars",
        type=int,
        default=2000,
        help="characters per text and per prefix (default: %(default)s)",
    )
    parser.add_argument(
        "--max-attention-texts",
        type=int,
        default=4,
        help="texts per attention request (default: %(default)s)",
    )
    parser.add_argument("--max-attention-chars", type=int, default=300,
                        help="characters per text and prefix of an attention request "
                        "(default: %(default)s)")  # fmt: skip
    parser.add_argument(
        "--max-body-bytes", type=int, default=1 << 20, help="request body size limit (default: %(default)s)"
    )
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port {args.port}: not a port number (0 to 65535)")
    for flag in ("max_wait_ms", "max_tokens", "max_queue", "max_texts", "max_chars", "max_attention_texts",
                 "max_attention_chars", "max_body_bytes"):  # fmt: skip
        if getattr(args, flag) < (0 if flag == "max_wait_ms" else 1):
            parser.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be positive")
    if args.max_queue < args.max_texts:
        parser.error(f"--max-queue {args.max_queue} is less than --max-texts {args.max_texts}: a request of "
                     "--max-texts texts could never be queued")  # fmt: skip
    return args


def listen(host: str, port: int) -> socket.socket:
    """The listening socket, opened before the model is served (OSError: the address is unusable)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not left 0: asyncio sets TCP_NODELAY only on such sockets, and without it each
    # answer on a kept-alive connection waits ~40 ms for the client's delayed ACK (Nagle's algorithm)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import uvicorn

        from transformer.serving.app import create_app
        from transformer.serving.keys import HiddenKeys
        from transformer.serving.schema import Limits
    except ImportError as error:
        print(f'error: serving needs the serve extra ({error.name} is missing): pip install -e ".[serve]"',
              file=sys.stderr)  # fmt: skip
        return 1
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if args.api_key_env and not api_key:
        print(f"error: --api-key-env {args.api_key_env}: that environment variable is empty or unset",
              file=sys.stderr)  # fmt: skip
        return 1
    limits = Limits(max_texts=args.max_texts, max_chars=args.max_chars, max_body_bytes=args.max_body_bytes,
                    max_attention_texts=args.max_attention_texts,
                    max_attention_chars=args.max_attention_chars)  # fmt: skip
    try:
        sock = listen(args.host, args.port)
    except (OSError, OverflowError) as error:
        print(f"error: cannot listen on {args.host}:{args.port}: {error}", file=sys.stderr)
        return 1
    if note := run_folder_note(args.checkpoint):  # as translate.py says it
        print(f"{command_name('serve')}: {note}", file=sys.stderr)
    try:
        app = create_app(args.checkpoint, args.device, args.precision, api_key, limits, args.max_wait_ms,
                         args.max_tokens, args.max_queue)  # fmt: skip
    except DeviceError as error:
        print(f"error: --{error}", file=sys.stderr)
        return 1
    except (CheckpointError, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    config = uvicorn.Config(app, timeout_graceful_shutdown=60, log_level="info")  # sets up uvicorn's logging
    logging.getLogger("uvicorn.access").addFilter(HiddenKeys())
    uvicorn.Server(config).run(sockets=[sock])
    return 0
