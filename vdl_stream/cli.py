"""The ``vdl-stream`` command: ``serve``, ``demo``, ``import``, ``export`` and ``replay``."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

# Only what every command needs is imported here; each command imports its own modules when it
# runs (and ``import``/``export``/``replay`` their arguments' modules only when chosen), so
# ``vdl-stream serve`` does not load the importers and ``--help`` loads nothing heavy.
from . import __version__
from .errors import PortInUseError, unwrap


def _serve(args: argparse.Namespace) -> int:
    import trio

    if args.bus is not None:
        from .bus import check_bus_url

        try:
            check_bus_url(args.bus)
        except ValueError as exc:
            return _fail(exc)
    from . import storage

    if storage.is_store_url(args.logdir):
        try:
            storage.parse_store_url(args.logdir, "--logdir")
        except ValueError as exc:
            return _fail(exc)
        # Process-wide defaults of the store sync run_server makes (docs/object-storage.md).
        if args.head_interval is not None:
            storage.HEAD_INTERVAL = args.head_interval
        if args.store_cache_mb is not None:
            storage.READ_CACHE_BYTES = args.store_cache_mb << 20
        # The bucket's listing and the runs' first objects are fetched while the web server is
        # imported below (network waits beside CPU work); run_server's sync takes the result.
        storage.start_early_mirror(args.logdir, storage.cache_dir(args.logdir, args.cache_dir))
    else:
        for flag, value in (
            ("--head-interval", args.head_interval),
            ("--store-cache-mb", args.store_cache_mb),
        ):
            if value is not None:
                return _fail(
                    ValueError(f"{flag} needs a --logdir in an object store, got {args.logdir}")
                )
        if Path(args.logdir).exists() and not Path(args.logdir).is_dir():
            return _fail(ValueError(f"--logdir {args.logdir} is not a directory"))
    from .server import Limits, check_token, run_server

    try:
        check_token(args.token)  # --token "$UNSET" must not serve without authentication
    except ValueError as exc:
        return _fail(exc)
    try:
        engine, notifier = _alerts(args)
    except (OSError, ValueError) as exc:
        return _fail(exc)

    async def main() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:

            async def shutdown_trigger() -> None:
                async for _ in signals:
                    return

            async with trio.open_nursery() as nursery:
                url = await nursery.start(
                    lambda task_status: run_server(
                        args.logdir,
                        args.host,
                        args.port,
                        args.token,
                        insecure=args.insecure,
                        cache_bytes=args.cache_mb << 20,
                        bus=args.bus,
                        bus_lease=args.bus_lease,
                        alerts=engine,
                        webhooks=notifier,
                        allowed_hosts=args.allow_host,
                        limits=Limits(
                            max_websockets=args.max_connections,
                            max_browsers=args.max_browsers,
                        ),
                        shutdown_trigger=shutdown_trigger,
                        cache_dir=args.cache_dir,
                        foreign=not args.no_foreign,
                        task_status=task_status,
                    )
                )
                suffix = f"/?token={args.token}" if args.token else "/"
                print(
                    f"vdl-stream {__version__}: serving {args.logdir} at {url}{suffix}", flush=True
                )
                if args.host in ("0.0.0.0", "::"):
                    names = ", ".join(args.allow_host) or "none yet"
                    print(
                        f"listening on every interface; other machines reach it by the names "
                        f"given with --allow-host ({names})",
                        flush=True,
                    )

    try:
        trio.run(main)
    except BaseException as exc:
        error = unwrap(exc)
        # Start-up errors a user can fix (a bad argument, a taken port, an unreadable log
        # directory) are one line; anything else is a bug and keeps its traceback.
        if isinstance(error, (OSError, ValueError)):
            return _fail(error)
        raise
    return 0


def _alerts(args: argparse.Namespace) -> tuple:
    """The alert engine and webhook notifier of ``serve --alerts/--webhook`` (docs/alerts.md)."""
    from .alerts import AlertEngine, load_rules
    from .webhooks import Webhook, WebhookNotifier

    hooks = [Webhook.parse(url, args.webhook_format) for url in args.webhook]
    if args.alerts == "off":
        if hooks:
            raise ValueError("--webhook needs the alert detectors: it cannot go with --alerts off")
        return False, None
    rules = load_rules(args.alerts) if args.alerts else None
    notifier = WebhookNotifier(hooks) if hooks else None
    engine = AlertEngine(rules, notify=None if notifier is None else notifier.notify)
    return engine, notifier


def _fail(error: BaseException) -> int:
    """Print a user-facing error as one line and return the exit status for it."""
    if isinstance(error, PortInUseError):
        text = error.strerror
    elif isinstance(error, OSError) and error.strerror and error.filename is not None:
        text = f"{error.filename}: {error.strerror}"
    else:
        text = str(error) or type(error).__name__
    print(f"vdl-stream: {text}", file=sys.stderr)
    return 2


def _allowed_host(value: str) -> str:
    """argparse type of ``--allow-host``."""
    from .server import check_allowed_host

    try:
        return check_allowed_host(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}")
    return number


def _positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    if not 0 < number < 3600:
        raise argparse.ArgumentTypeError(f"must be a number of seconds in (0, 3600), got {value!r}")
    return number


def _demo(args: argparse.Namespace) -> int:
    from .demo import train
    from .session import attach

    try:
        writer = attach(args.logdir, serve=not args.no_serve, port=args.port)
    except PortInUseError as exc:
        return _fail(exc)
    with writer:
        if writer.url:
            print(f"vdl-stream demo: dashboard at {writer.url}/  (run {writer.run})", flush=True)
        started = time.perf_counter()
        try:
            accuracy = train(writer, args.steps, delay=args.delay)
        except KeyboardInterrupt:  # Ctrl-C while training: the run is closed, kept, not a crash
            writer.flush()
            print(
                f"interrupted after {time.perf_counter() - started:.1f} s; what was logged is in "
                f"{args.logdir}/{writer.run}",
                file=sys.stderr,
                flush=True,
            )
            return 130
        writer.flush()
        print(
            f"trained {args.steps} steps in {time.perf_counter() - started:.1f} s, "
            f"eval accuracy {accuracy:.3f}; logged to {args.logdir}/{writer.run}",
            flush=True,
        )
        if writer.url:
            print("still serving the dashboard; press Ctrl-C to stop", flush=True)
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
    return 0


#: ``serve --cache-mb`` default (the broker's default budget).
DEFAULT_CACHE_MB = 128


#: Commands whose arguments are defined by the module that runs them: (module, the function that
#: adds the arguments, the function that runs the command, help).
_MODULE_COMMANDS = {
    "import": (
        "interop",
        "add_import_arguments",
        "run_import",
        "import TensorBoard / VisualDL logs as runs",
    ),
    "export": (
        "interop",
        "add_export_arguments",
        "run_export",
        "write a run's scalars as CSV or JSON",
    ),
    "replay": (
        "replay",
        "add_replay_arguments",
        "run_replay",
        "replay recorded runs through the live dashboard",
    ),
}


def _chosen_command(argv: Sequence[str]) -> str | None:
    """The command named in ``argv`` (its first argument that is not an option), if any."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """Return the argument parser of the ``vdl-stream`` command.

    Args:
        argv: the arguments it will parse, if known: then only the chosen command's own modules
            are imported to define its arguments (``vdl-stream serve`` does not load the
            importers; ``vdl-stream --help`` loads none). None: every command in full.
    """
    chosen = None if argv is None else _chosen_command(argv)
    parser = argparse.ArgumentParser(
        prog="vdl-stream", description="A streaming training dashboard."
    )
    parser.add_argument("--version", action="version", version=f"vdl-stream {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the broker and dashboard over a log directory")
    serve.add_argument(
        "--logdir",
        default="vdl_logs",
        help="directory of runs, or s3://bucket/prefix, gs://..., az://... (default: vdl_logs)",
    )
    serve.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="where runs' local heads are kept with a --logdir in an object store, and the "
        "mirrors of TensorBoard/VisualDL runs (default: $VDL_STREAM_CACHE or ~/.cache/vdl-stream)",
    )
    serve.add_argument(
        "--no-foreign",
        action="store_true",
        help="do not show the TensorBoard event files and VisualDL record files under --logdir "
        "as live, read-only runs (docs/interop.md)",
    )
    serve.add_argument(
        "--head-interval",
        type=_positive_float,
        metavar="S",
        help="with a --logdir in an object store: seconds between two uploads of a live run's "
        "newest records (default: 10; fewer PUTs, staler remote readers)",
    )
    serve.add_argument(
        "--store-cache-mb",
        type=_positive_int,
        metavar="MB",
        help="with a --logdir in an object store: block bytes fetched from the store kept on "
        "local disk for reading, all runs together (default: 256)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8040, help="port (default: 8040; 0: any free)")
    serve.add_argument("--token", help="require this token from writers and browsers (not empty)")
    serve.add_argument(
        "--insecure", action="store_true", help="allow a non-loopback --host without --token"
    )
    serve.add_argument(
        "--cache-mb",
        type=_positive_int,
        default=DEFAULT_CACHE_MB,
        metavar="MB",
        help=f"memory for decoded data kept between reads, all runs together (default: "
        f"{DEFAULT_CACHE_MB})",
    )
    serve.add_argument(
        "--allow-host",
        action="append",
        default=[],
        type=_allowed_host,
        metavar="NAME",
        help="also answer requests for this Host name (repeatable; loopback names always are)",
    )
    serve.add_argument(
        "--max-connections",
        type=_positive_int,
        metavar="N",
        help="open WebSockets at most, browsers and writers together "
        "(default: half the open-file limit, at most 1024)",
    )
    serve.add_argument(
        "--max-browsers",
        type=_positive_int,
        default=128,
        metavar="N",
        help="open dashboard pages at most (default: 128, and at most half of --max-connections)",
    )
    serve.add_argument(
        "--bus",
        metavar="URL",
        help="join the other brokers on this Redis (redis://host:6379/0): one dashboard, "
        "writers fail over between brokers (docs/deploy.md; needs the 'bus' extra)",
    )
    serve.add_argument(
        "--bus-lease",
        type=_positive_float,
        default=None,
        metavar="S",
        help="with --bus: seconds a broker's lease on a run lasts without renewal, so how long "
        "the runs of a killed broker wait for another (default: 3)",
    )
    serve.add_argument(
        "--alerts",
        metavar="RULES.toml",
        help="tune or disable the alert detectors per tag pattern (docs/alerts.md); "
        "'off': run no detectors at all",
    )
    serve.add_argument(
        "--webhook",
        action="append",
        default=[],
        metavar="URL",
        help="POST every alert as JSON to this URL (repeatable; Slack, Feishu and DingTalk "
        "incoming webhooks are recognised by their host)",
    )
    serve.add_argument(
        "--webhook-format",
        default="auto",
        choices=["auto", "json", "slack", "feishu", "dingtalk"],
        help="payload shape of every --webhook (default: auto, by the URL's host)",
    )
    serve.set_defaults(func=_serve)

    demo = commands.add_parser("demo", help="train a small numpy MLP, streaming to a dashboard")
    demo.add_argument("--steps", type=int, default=2000, help="training steps (default: 2000)")
    demo.add_argument("--logdir", default="vdl_logs", help="directory of runs (default: vdl_logs)")
    demo.add_argument("--port", type=int, default=8040, help="dashboard port (default: 8040)")
    demo.add_argument("--no-serve", action="store_true", help="train and record, serve nothing")
    demo.add_argument(
        "--delay", type=float, default=0.005, help="seconds to pause per step (default: 0.005)"
    )
    demo.set_defaults(func=_demo)

    for name, (module_name, add_arguments, run, help_text) in _MODULE_COMMANDS.items():
        sub = commands.add_parser(name, help=help_text)
        if argv is not None and chosen != name:
            continue  # not the command that runs: its module (and its imports) is not needed
        module = importlib.import_module(f".{module_name}", __package__)
        getattr(module, add_arguments)(sub)
        sub.set_defaults(func=getattr(module, run))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``vdl-stream`` command line; return the exit status."""
    if argv is None:
        argv = sys.argv[1:]
    args = build_parser(argv).parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
