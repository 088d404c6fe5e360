"""``glassllm inspect [PROMPT]``: open the inspector in a browser, or write it to one HTML file.

::

    glassllm inspect "Once upon a time"                    # local server on 127.0.0.1, opens the browser
    glassllm inspect "Once upon a time" --no-browser --port 8765
    glassllm inspect "Once upon a time" --html story.html  # one offline file, nothing fetched
    glassllm inspect --host 0.0.0.0 --no-browser           # for a class: prints a URL with an access token
    glassllm inspect --run runs/tiny                       # a run folder: its model and its training timeline

The bundled TinyStories model is used unless ``--model FILE`` names another
model file, or ``--run DIR`` a training run's folder. A model with a training
timeline beside it (``X.timeline.safetensors``, or a run's ``timeline.safetensors``;
see :mod:`glassllm.timeline`) gets a Training tab: the run's probe prompt at
log-spaced steps, with a step slider next to the loss curve. The server binds to
loopback, open to this machine's user, unless ``--host`` says otherwise; on any
other address it needs an access token (generated, or ``--token``), unless
``--no-token`` opens it to everyone who can reach the port.
"""

from __future__ import annotations

from ..limits import check_count

import os
import sys
import threading

from ..optional import require
from . import model_file

__all__ = ["add_cli", "run", "load_inspected", "DEFAULT_PROMPT", "DEFAULT_PORT"]

DEFAULT_PROMPT = "Once upon a time there was a little dog"
DEFAULT_PORT = 8765


def add_cli(name: str, parser) -> None:
    parser.add_argument("prompt", nargs="?", default=None, metavar="PROMPT",
                        help=f"the text to inspect (default: {DEFAULT_PROMPT!r})")
    parser.add_argument("--model", metavar="FILE", default=None,
                        help="model file (default, or 'bundled': the bundled TinyStories model)")
    parser.add_argument("--run", metavar="DIR", default=None,
                        help="a training run's folder: its model.safetensors, and its timeline.safetensors in a "
                             "Training tab (the probe's attention at log-spaced steps, next to the loss curve)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default: 127.0.0.1, this machine only)")
    parser.add_argument("--port", type=int, default=None, metavar="N",
                        help=f"port to listen on (default: {DEFAULT_PORT}, or a free one if it is taken; 0 = any free port)")
    parser.add_argument("--no-browser", action="store_true", help="print the URL but do not open a browser")
    parser.add_argument("--token", default=None, metavar="TOKEN",
                        help="the access token to require (default: a random one when --host is not loopback; "
                             "none on loopback)")
    parser.add_argument("--no-token", action="store_true",
                        help="serve a non-loopback --host without a token: anyone who can reach the port may use it")
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="threads that run the model (default: one per core)")
    parser.add_argument("--queue", type=int, default=32, metavar="N",
                        help="requests that may wait for a worker; beyond, 503 and Retry-After (default: 32)")
    parser.add_argument("--rate-limit", type=float, default=20.0, metavar="R",
                        help="requests per second one client address may send, on average; beyond, 429 (default: 20)")
    parser.add_argument("--rate-burst", type=int, default=60, metavar="N",
                        help="requests one client address may send at once before --rate-limit applies (default: 60)")
    parser.add_argument("--cache-mb", type=float, default=None, metavar="MB",
                        help="memory for traced prompts, least recently used dropped first (default: room for "
                             "three passes of the longest prompt, at least 512)")
    parser.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        help="another name clients may use to reach this server (a DNS name, a proxy); repeatable")
    parser.add_argument("--html", metavar="FILE", default=None,
                        help="write one self-contained offline HTML file for PROMPT instead of serving")
    parser.add_argument("--steps", type=int, default=None, metavar="N",
                        help="with --html: greedy decoding steps to include (default: 8, or --max-new-tokens "
                             "if lower)")
    parser.add_argument("--html-layers", default=None, metavar="I,J,...",
                        help="with --html: the layers whose views the file holds (default: all); the head grid, "
                             "logit lens, attributions and logits always cover every layer")
    parser.add_argument("--html-max-mb", type=float, default=None, metavar="MB",
                        help="with --html: refuse an export that would embed more than MB megabytes (default: 50)")
    parser.add_argument("--max-prompt-tokens", type=int, default=256, metavar="N",
                        help="longest prompt a request may send, in tokens (default: 256; capped by the context)")
    parser.add_argument("--max-new-tokens", type=int, default=64, metavar="N",
                        help="most decoding steps a request may ask for (default: 64)")
    parser.add_argument("--max-cells", type=int, default=1 << 19, metavar="N",
                        help=f"most values in one snapshot response (default: {1 << 19:,})")
    parser.set_defaults(func=run)


def load_inspected(path, run=None):
    """(model, tokenizer, meta, timeline or None) from --model FILE, --run DIR, or the bundled model."""
    from pathlib import Path

    from .. import checkpoint
    from ..files import file_in_folder
    from ..timeline import load_timeline, timeline_path_for

    if run is not None:
        if path is not None:
            raise ValueError("give --model FILE or --run DIR, not both (a run folder holds its model)")
        folder = Path(run)
        path = file_in_folder(folder, "model.safetensors", "a training run's folder (glassllm train --out)",
                              f"--run {run!r} holds no model.safetensors yet; a run writes it at its first checkpoint",
                              label=f"--run {run!r}")
        if not timeline_path_for(folder).is_file():
            raise ValueError(f"--run {run!r} holds no timeline.safetensors (train with --timeline-points N, N > 0)")
    path = model_file(path)
    model, tokenizer, meta = checkpoint.load_model(path)
    beside = timeline_path_for(Path(run) if run is not None else Path(path))
    return model, tokenizer, meta, load_timeline(beside) if beside.is_file() else None


def run(args) -> int:
    for module in ("fastapi", "pydantic", "uvicorn"):
        require(module, "glassllm inspect")
    from ..inspector.auth import check_token_text
    from ..inspector.data import Inspector
    from ..inspector.schema import Limits

    for flag in ("max_prompt_tokens", "max_new_tokens", "max_cells"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.port is not None and not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535 (0 = any free port), got {args.port}")
    if args.html is not None:
        served = [flag for flag, given in (("--port", args.port is not None), ("--host", args.host != "127.0.0.1"),
                                           ("--no-browser", args.no_browser), ("--token", args.token is not None),
                                           ("--no-token", args.no_token), ("--allow-host", bool(args.allow_host)))
                  if given]
        if served:
            raise ValueError(f"{' and '.join(served)} {'apply' if len(served) > 1 else 'applies'} only to the server; "
                             "--html writes a file and serves nothing")
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    check_count("--workers", args.workers, "threads")
    if args.queue < 0:
        raise ValueError(f"--queue must be >= 0, got {args.queue}")
    check_count("--queue", args.queue, "threads")
    if not (args.rate_limit > 0 and args.rate_limit != float("inf")):
        raise ValueError(f"--rate-limit must be a number of requests per second > 0, got {args.rate_limit}")
    if args.rate_burst < 1:
        raise ValueError(f"--rate-burst must be >= 1, got {args.rate_burst}")
    if args.cache_mb is not None and (not args.cache_mb >= 0 or args.cache_mb == float("inf")):
        raise ValueError(f"--cache-mb must be a number of MB >= 0, got {args.cache_mb}")
    if args.token is not None and args.no_token:
        raise ValueError("--token and --no-token contradict each other: give one")
    if args.token is not None:
        check_token_text(args.token)
    for flag in ("html_layers", "html_max_mb"):
        if getattr(args, flag) is not None and args.html is None:
            raise ValueError(f"--{flag.replace('_', '-')} applies only with --html")
    if args.html_max_mb is not None and not 0 < args.html_max_mb < float("inf"):
        raise ValueError(f"--html-max-mb must be a number of MB > 0, got {args.html_max_mb}")
    layers = None
    if args.html_layers is not None:
        try:
            layers = [int(part) for part in args.html_layers.split(",")]
        except ValueError:
            raise ValueError(f"--html-layers must be layer numbers separated by commas (0,3), "
                             f"got {args.html_layers[:40]!r}") from None
    if args.steps is not None and args.html is None:
        raise ValueError("--steps applies only with --html (the server decodes as far as the page asks)")
    if args.steps is not None and not 0 <= args.steps <= args.max_new_tokens:
        raise ValueError(f"--steps must be in [0, {args.max_new_tokens}] (at most --max-new-tokens), got {args.steps}")
    prompt = DEFAULT_PROMPT if args.prompt is None else args.prompt
    if prompt == "":
        raise ValueError("prompt is empty: give at least one character")
    model, tokenizer, meta, timeline = load_inspected(args.model, args.run)
    limits = Limits(args.max_prompt_tokens, args.max_new_tokens, args.max_cells)
    inspector = Inspector(model, tokenizer, limits, meta, cache_mb=args.cache_mb, timeline=timeline)
    inspector.encode(prompt)  # refuse a bad prompt before serving or writing anything

    if args.html is not None:
        from ..files import read_head, refuse_to_replace
        from ..inspector.export import export_html

        refuse_to_replace(args.html, "--html", "an earlier inspector export",
                          lambda p: b"<title>glassllm inspector</title>" in read_head(p, 2048), inputs=[args.model])
        from ..inspector.export import MAX_MB

        stats = export_html(inspector, prompt, args.html, steps=args.steps, layers=layers,
                            max_mb=MAX_MB if args.html_max_mb is None else args.html_max_mb)
        ablation = stats["parts"].get("ablation", 0)
        print(f"wrote {stats['path']} ({stats['bytes'] / 1e6:.1f} MB, {stats['responses']} precomputed views, "
              f"{ablation / 1e6:.1f} MB of them the later layers' attention under each layer-0 head's ablation); "
              "open it in any browser, offline")
        n, context = len(inspector.encode(prompt)), inspector.config.max_seq_len
        room = max(0, context - n - 1)                  # the last step's pass must leave a position to decode into
        if args.steps is not None and args.steps > room:
            print(f"note: the context of {context} positions has room for {room} decoding step(s) after this "
                  f"{n}-token prompt, not {args.steps}: the file holds those", file=sys.stderr)
        if stats["left_out"]:
            print(f"note: {stats['left_out']}", file=sys.stderr)
        if stats["over_max_cells"]:
            print(f"note: {stats['over_max_cells']} of those views hold more than --max-cells "
                  f"{args.max_cells:,} values, so the file holds their error instead; raise --max-cells to include them",
                  file=sys.stderr)
        return 0
    return _serve(inspector, prompt, args)


def _serve(inspector, prompt: str, args) -> int:
    from ..inspector.auth import Access, lan_addresses, new_token, own_hosts
    from ..inspector.server import PortInUse, Server, create_app, is_loopback

    loopback = is_loopback(args.host)
    token = args.token if args.token is not None else None if (loopback or args.no_token) else new_token()
    access = Access(token, own_hosts(args.host, tuple(args.allow_host)))
    threadpool_limits = require("threadpoolctl", "glassllm inspect").threadpool_limits

    from ..inspector.pool import RateLimiter, WorkPool

    # Parallelism comes from the pool's workers, one core each: BLAS threads on top of them would
    # oversubscribe the cores (and OpenBLAS's spinning threads slow to a crawl on a busy machine).
    threadpool_limits(1)
    app = create_app(inspector, prompt=prompt, access=access, tab="training" if args.run else None,
                     pool=WorkPool(args.workers, args.queue), limiter=RateLimiter(args.rate_limit, args.rate_burst))
    ports = [args.port] if args.port is not None else [DEFAULT_PORT, 0]
    server = None
    for i, port in enumerate(ports):
        try:
            server = Server(app, args.host, port).start()
            break
        except PortInUse:
            if i == len(ports) - 1:
                raise
            print(f"port {port} is taken; serving on a free port instead (--port chooses one)", file=sys.stderr)
    suffix = f"?token={token}" if token else ""
    url = server.url
    if url.startswith(("http://0.0.0.0:", "http://[::]:")):              # every interface: this machine's own
        url = f"http://127.0.0.1:{server.port}/"
    if not loopback and args.no_token:
        print(f"WARNING: --no-token: listening on {args.host} with no access token. Anyone who can reach port "
              f"{server.port} can use this inspector and make this machine compute. Use it only on a network "
              "you trust.", file=sys.stderr)
    print(f"glassllm inspector: {url}{suffix}   (Ctrl+C to stop)", flush=True)
    if not loopback:
        others = lan_addresses() if url.startswith("http://127.0.0.1:") else []
        for address in others:
            print(f"  from other machines: http://{address}:{server.port}/{suffix}", flush=True)
    if not args.no_browser:
        _open_browser(url + suffix)
    try:
        while server.thread.is_alive():
            server.thread.join(0.5)
    except KeyboardInterrupt:
        print("stopping", file=sys.stderr)
    finally:
        server.stop()
    return 0


def _open_browser(url: str) -> None:
    """Open ``url`` when a graphical browser is likely; never a text browser in this terminal."""
    import webbrowser

    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        print("(no display: open the URL above in a browser)", file=sys.stderr)
        return
    threading.Thread(target=webbrowser.open, args=(url,), daemon=True).start()
