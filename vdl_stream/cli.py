"""The ``vdl-stream`` command: ``serve``, ``demo``, ``import``, ``export`` and ``replay``."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Sequence

import trio

from . import __version__
from .errors import InsecureBindError, PortInUseError, unwrap


def _serve(args: argparse.Namespace) -> int:
    from .server import run_server

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
                        shutdown_trigger=shutdown_trigger,
                        task_status=task_status,
                    )
                )
                suffix = f"/?token={args.token}" if args.token else "/"
                print(
                    f"vdl-stream {__version__}: serving {args.logdir} at {url}{suffix}", flush=True
                )

    try:
        trio.run(main)
    except BaseException as exc:
        error = unwrap(exc)
        if isinstance(error, (PortInUseError, InsecureBindError)):
            return _fail(error)
        raise
    return 0


def _fail(error: Exception) -> int:
    """Print a user-facing error as one line and return the exit status for it."""
    print(f"vdl-stream: {error.strerror if isinstance(error, OSError) else error}", file=sys.stderr)
    return 2


def _demo(args: argparse.Namespace) -> int:
    from .demo import train
    from .writer import attach

    try:
        writer = attach(args.logdir, serve=not args.no_serve, port=args.port)
    except PortInUseError as exc:
        return _fail(exc)
    with writer:
        if writer.url:
            print(f"vdl-stream demo: dashboard at {writer.url}/  (run {writer.run})", flush=True)
        started = time.perf_counter()
        accuracy = train(writer, args.steps, delay=args.delay)
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


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``vdl-stream`` command."""
    parser = argparse.ArgumentParser(
        prog="vdl-stream", description="A streaming training dashboard."
    )
    parser.add_argument("--version", action="version", version=f"vdl-stream {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the broker and dashboard over a log directory")
    serve.add_argument("--logdir", default="vdl_logs", help="directory of runs (default: vdl_logs)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8040, help="port (default: 8040; 0: any free)")
    serve.add_argument("--token", help="require this token from writers and browsers")
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

    from . import interop, replay

    imp = commands.add_parser("import", help="import TensorBoard / VisualDL logs as runs")
    interop.add_import_arguments(imp)
    imp.set_defaults(func=interop.run_import)

    export = commands.add_parser("export", help="write a run's scalars as CSV or JSON")
    interop.add_export_arguments(export)
    export.set_defaults(func=interop.run_export)

    rep = commands.add_parser("replay", help="replay recorded runs through the live dashboard")
    replay.add_replay_arguments(rep)
    rep.set_defaults(func=replay.run_replay)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``vdl-stream`` command line; return the exit status."""
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
