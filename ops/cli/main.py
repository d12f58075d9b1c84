"""The ``resontech`` command line.

Every command reads the settings once (environment over ``<data dir>/dev.env``), prints errors as one
line on stderr with a non-zero exit status, and never a traceback unless ``--debug`` is given.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent.cli import add_arguments as add_agent_arguments
from core.errors import ResontechError
from core.settings import Settings, load
from gateway.client import ApiError

Handler = Callable[[argparse.Namespace, Settings], int]
AddCommand = Callable[[str, Handler, str], argparse.ArgumentParser]
"""``command(name, handler, help)``: adds one command to the parser and returns its own parser."""


def _data_dir(args: argparse.Namespace) -> Path:
    return Path(args.data_dir or os.environ.get("RESONTECH_DATA_DIR") or ".resontech")


def _run(coro: Any) -> Any:
    import uvloop

    return uvloop.run(coro)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True, default=str))


def cmd_up(args: argparse.Namespace, settings: Settings) -> int:
    from ops import devstack

    return devstack.up(
        _data_dir(args),
        nats_port=args.nats_port,
        s3_port=args.s3_port,
        gateway_port=args.gateway_port,
        cluster=args.cluster,
    )


def cmd_down(args: argparse.Namespace, settings: Settings) -> int:
    from ops import devstack

    return devstack.down(_data_dir(args))


def cmd_streams(args: argparse.Namespace, settings: Settings) -> int:
    from core.log import EventLog
    from core.streams import STREAMS

    async def ensure() -> None:
        async with await EventLog.connect(settings) as event_log:
            await event_log.ensure_streams()

    _run(ensure())
    if args.json:
        _print_json([{"stream": s.name, "subjects": s.layout, "holds": s.holds} for s in STREAMS])
    else:
        for spec in STREAMS:
            print(f"{spec.name:<18} {spec.layout:<40} {spec.retention}")
    return 0


def cmd_tail(args: argparse.Namespace, settings: Settings) -> int:
    from ops.cli.tail import tail

    return int(_run(tail(settings, args.subject, start_seq=args.from_seq, follow=not args.no_follow)))


def cmd_projector(args: argparse.Namespace, settings: Settings) -> int:
    from ops.services import projector

    _run(projector.run(settings))
    return 0


def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    from core.log import EventLog
    from projections import ALL, BY_NAME
    from projections.verify import verify_all

    chosen = [BY_NAME[name] for name in args.projection] if args.projection else list(ALL)

    async def check() -> list[Any]:
        async with await EventLog.connect(settings) as event_log:
            return await verify_all(event_log, chosen)

    verdicts = _run(check())
    if args.json:
        _print_json([{f: getattr(v, f) for f in v.__struct_fields__} for v in verdicts])
    else:
        print(f"{'projection':<10} {'stream':<11} {'at seq':>9}  {'status':<11} rebuilt hash")
        for v in verdicts:
            print(f"{v.projection:<10} {v.stream:<11} {v.seq:>9}  {v.status:<11} {v.rebuilt_hash[:16]}")
            if v.status == "differ":
                print(f"{'':<33}live snapshot hash {v.live_hash}")
    differ = [v.projection for v in verdicts if v.status == "differ"]
    if differ:
        print(f"DIFFERENCE in {', '.join(differ)}: the live state is not what the log says", file=sys.stderr)
        return 1
    if not args.json:
        print("no difference: every live snapshot is what the log rebuilds to")
    return 0


def cmd_audit_export(args: argparse.Namespace, settings: Settings) -> int:
    from core.log import EventLog
    from projections import audit

    def progress(stream: str, rows: int) -> None:
        print(f"  {stream:<18} {rows:>10} rows", file=sys.stderr)

    async def export() -> dict[str, int]:
        async with await EventLog.connect(settings) as event_log:
            return await audit.export(event_log, Path(args.dir), progress=progress)

    counts = _run(export())
    if args.json:
        _print_json(counts)
    else:
        print(f"exported {sum(counts.values())} events from {len(counts)} streams to {args.dir}")
    return 0


def cmd_audit_sql(args: argparse.Namespace, settings: Settings) -> int:
    from projections import audit

    directory = Path(args.dir or _data_dir(args) / "audit")
    columns, rows = audit.sql(directory, args.query)
    if args.json:
        _print_json([dict(zip(columns, row, strict=True)) for row in rows])
        return 0
    widths = [max([len(c)] + [len(_cell(r[i])) for r in rows]) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(_cell(v).ljust(w) for v, w in zip(row, widths, strict=True)))
    print(f"({len(rows)} rows)", file=sys.stderr)
    return 0


def _cell(value: Any) -> str:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    return "NULL" if value is None else str(value)


def cmd_audit_queries(args: argparse.Namespace, settings: Settings) -> int:
    from projections import audit

    if args.json:
        _print_json(audit.EXAMPLE_QUERIES)
    for name, query in audit.EXAMPLE_QUERIES.items():
        if not args.json:
            print(f"-- {name}\n{query.strip()}\n")
    return 0


def cmd_schemas_export(args: argparse.Namespace, settings: Settings) -> int:
    from schemas.catalog import export_json_schemas

    written = export_json_schemas(Path(args.dir))
    print(f"wrote {len(written)} JSON Schemas to {args.dir}")
    return 0


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from ops.cli.demo import append_demo

    counts = _run(append_demo(settings, tenant=args.tenant))
    print(f"appended {sum(counts.values())} events: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0


def cmd_agent(args: argparse.Namespace, settings: Settings) -> int:
    from agent.cli import run

    return int(_run(run(args, settings, _data_dir(args))))


def cmd_coordinator(args: argparse.Namespace, settings: Settings) -> int:
    from ops import coordinator

    _run(coordinator.serve(settings, name=args.name))
    return 0


def cmd_intake(args: argparse.Namespace, settings: Settings) -> int:
    from core import addresses
    from gateway.settings import load_gateway_settings
    from ops.services import intake

    gateway = load_gateway_settings()
    # every gateway of the deployment (the dev stack's cluster runs two), not only this host's
    gateways = [url for url in os.environ.get("RESONTECH_GATEWAY_URL", "").split(",") if url.strip()]
    kernel = addresses.kernel_endpoints(settings, f"http://{gateway.host}:{gateway.port}", *gateways)
    _run(intake.serve(settings, name=args.name, kernel_addresses=kernel))
    return 0


def cmd_quarantine(args: argparse.Namespace, settings: Settings) -> int:
    from ops.cli.quarantine import show

    return int(_run(show(settings, after_seq=args.from_seq - 1, limit=args.limit, as_json=args.json)))


def cmd_federation(args: argparse.Namespace, settings: Settings) -> int:
    from ops import federation

    _run(federation.serve(settings, _data_dir(args).absolute() / "federations", instance=args.instance))
    return 0


def cmd_gateway(args: argparse.Namespace, settings: Settings) -> int:
    from gateway.serve import serve

    serve(settings)
    return 0


def cmd_nats_auth(args: argparse.Namespace, settings: Settings) -> int:
    from ops.services.natsauth import serve

    data_dir = _data_dir(args)
    agents_file = Path(args.agents_file) if args.agents_file else data_dir / "nats.agents.conf"
    pid_file = Path(args.pid_file) if args.pid_file else data_dir / "nats.pid"
    _run(serve(settings, agents_file.absolute(), pid_file.absolute()))
    return 0


def cmd_cordon(args: argparse.Namespace, settings: Settings) -> int:
    from ops.cli.workers import cordon

    print(_run(cordon(settings, args.worker, args.reason, uncordon=args.command == "uncordon")))
    return 0


def cmd_dispatcher_run(args: argparse.Namespace, settings: Settings) -> int:
    from ops.dispatcher import run

    _run(run.run(args, settings))
    return 0


def cmd_dispatcher_enroll(args: argparse.Namespace, settings: Settings) -> int:
    from ops.dispatcher import run

    print(_run(run.enroll(args, settings)))
    return 0


def cmd_dispatcher_revoke(args: argparse.Namespace, settings: Settings) -> int:
    from ops.dispatcher import run

    print(_run(run.revoke(args, settings)))
    return 0


def cmd_dispatcher_render(args: argparse.Namespace, settings: Settings) -> int:
    from ops.dispatcher.render import command

    sys.stdout.write(command(args))
    return 0


def _common(parser: argparse.ArgumentParser) -> None:
    """Options every command takes, after the command name as well as before it."""
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--data-dir", default=argparse.SUPPRESS, help="local state directory")
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")


def _subcommands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> AddCommand:
    """``command(name, handler, help)``: adds one command with the common options to ``sub``."""

    def command(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        _common(p)
        p.set_defaults(handler=handler)
        return p

    return command


def _add_stack_commands(command: AddCommand) -> None:
    """The local stack (``up``, ``down``) and the log's streams (``streams``, ``tail``)."""
    p = command("up", cmd_up, "start the local stack (NATS, object store, services) in the foreground")
    p.add_argument("--nats-port", type=int, default=4222)
    p.add_argument("--s3-port", type=int, default=9000)
    p.add_argument("--gateway-port", type=int, default=8080)
    p.add_argument(
        "--cluster",
        type=int,
        choices=(3, 5),
        default=0,
        metavar="N",
        help="NATS as a JetStream cluster of N nodes (3 or 5; client ports --nats-port + 0..N-1) with R3 "
        "streams, and two of every service (the second gateway on --gateway-port + 1)",
    )
    command("down", cmd_down, "stop a stack started with `up` in another terminal")
    command("streams", cmd_streams, "create or update every stream, and list them")
    p = command("tail", cmd_tail, "print events on SUBJECT as JSON lines (then follow new ones)")
    p.add_argument("subject", help="subject filter, e.g. 'job.>' or 'job.acme.*.progress'")
    p.add_argument(
        "--from", dest="from_seq", type=int, default=1, metavar="SEQ", help="first stream sequence"
    )
    p.add_argument("--no-follow", action="store_true", help="stop at the end of the stream")


def _add_projection_commands(command: AddCommand) -> None:
    """What is kept in step with the log (``projector``, ``nats-auth``), and its check (``replay``)."""
    command("projector", cmd_projector, "run the projector service (keeps projections live and snapshotted)")
    p = command(
        "nats-auth",
        cmd_nats_auth,
        "keep a NATS server's enrolled-agent users in step with the log (beside it)",
    )
    p.add_argument(
        "--agents-file", help="the agents file the server includes (default <data dir>/nats.agents.conf)"
    )
    p.add_argument(
        "--pid-file", help="the server's pid file, to signal a reload (default <data dir>/nats.pid)"
    )
    p = command(
        "replay", cmd_replay, "rebuild every projection from sequence 1 and compare with its live snapshot"
    )
    p.add_argument("projection", nargs="*", help="only these projections")


def _add_audit_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The two command groups over the log's contents: ``audit ...`` and ``schemas export``."""
    audit = sub.add_parser("audit", help="export the log to Parquet and query it with SQL")
    audit_sub = audit.add_subparsers(dest="audit_command", required=True, metavar="AUDIT_COMMAND")
    for name, handler, help_text in (
        ("export", cmd_audit_export, "write every stream to DIR/<stream>.parquet"),
        ("sql", cmd_audit_sql, "run DuckDB SQL over an export"),
        ("queries", cmd_audit_queries, "print example audit queries"),
    ):
        p = audit_sub.add_parser(name, help=help_text, description=help_text)
        _common(p)
        p.set_defaults(handler=handler)
        if name == "export":
            p.add_argument("dir")
        elif name == "sql":
            p.add_argument("query")
            p.add_argument("--dir", help="export directory (default <data dir>/audit)")
    schemas = sub.add_parser("schemas", help="event catalog tools")
    schemas_sub = schemas.add_subparsers(dest="schemas_command", required=True, metavar="SCHEMAS_COMMAND")
    p = schemas_sub.add_parser("export", help="write a JSON Schema per event to DIR")
    _common(p)
    p.add_argument("dir")
    p.set_defaults(handler=cmd_schemas_export)


def _add_kernel_commands(command: AddCommand) -> None:
    """The kernel's services, and what its intake refused (``quarantine``)."""
    command("gateway", cmd_gateway, "serve the API gateway (RESONTECH_GATEWAY_HOST/PORT)")
    p = command("coordinator", cmd_coordinator, "run a coordinator (places work, detects lost workers)")
    p.add_argument("--name", default="coordinator", help="instance name, recorded on its events")
    p = command("intake", cmd_intake, "run the intake (checks what agents claim, appends what holds)")
    p.add_argument("--name", default="intake", help="instance name, recorded on its events")
    p = command("quarantine", cmd_quarantine, "list what the kernel refused: forged claims, bad events")
    p.add_argument("--from", dest="from_seq", type=int, default=1, metavar="SEQ", help="first sequence")
    p.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    p = command("federation", cmd_federation, "run the federation service (the FL servers of federated jobs)")
    p.add_argument(
        "--instance",
        help="this instance's name, when several run (default <host>-<pid>); a named one works in "
        "<data dir>/federations/<instance>/",
    )


def _add_operator_commands(command: AddCommand) -> None:
    """What an operator does by hand: ``cordon`` and ``uncordon`` a worker, append the ``demo``."""
    p = command("cordon", cmd_cordon, "stop placing new work on a worker")
    p.add_argument("worker")
    p.add_argument("--reason", default="cordoned by an operator")
    p = command("uncordon", cmd_cordon, "let a cordoned worker take work again")
    p.add_argument("worker")
    p.set_defaults(reason="")
    p = command("demo", cmd_demo, "append a small, realistic history (a job's lifecycle with metering)")
    p.add_argument("--tenant", default="demo")


def _add_dispatcher_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``dispatcher ...``: the Kubernetes dispatcher (a cluster as a pool, :mod:`ops.dispatcher`)."""
    from ops.dispatcher import run
    from ops.dispatcher.render import add_arguments

    dispatcher = sub.add_parser("dispatcher", help="the Kubernetes dispatcher: a cluster as a pool")
    commands = dispatcher.add_subparsers(
        dest="dispatcher_command", required=True, metavar="DISPATCHER_COMMAND"
    )
    help_text = "serve one Kubernetes cluster: its nodes become workers, assignments become objects"
    p = commands.add_parser("run", help=help_text, description=help_text)
    _common(p)
    run.add_arguments(p)
    p.set_defaults(handler=cmd_dispatcher_run)
    help_text = "enroll a cluster (operator): write its dispatcher's own NATS credentials"
    p = commands.add_parser("enroll", help=help_text, description=help_text)
    _common(p)
    run.add_identity_arguments(p, required=True)
    p.add_argument("--out", type=Path, required=True, help="where to write the credentials (mode 0600)")
    p.set_defaults(handler=cmd_dispatcher_enroll)
    help_text = "revoke a cluster's dispatcher credentials (operator)"
    p = commands.add_parser("revoke", help=help_text, description=help_text)
    _common(p)
    p.add_argument("--cluster", required=True)
    p.set_defaults(handler=cmd_dispatcher_revoke)
    help_text = "print the Kubernetes objects a job or endpoint spec becomes, as YAML (nothing is applied)"
    p = commands.add_parser("render", help=help_text, description=help_text)
    _common(p)
    add_arguments(p)
    p.set_defaults(handler=cmd_dispatcher_render)


def build_parser() -> argparse.ArgumentParser:
    """The ``resontech`` parser: every process the stack runs, the operator's commands, and the user
    commands (:mod:`ops.cli.user`), in that order in ``--help``."""
    parser = argparse.ArgumentParser(
        prog="resontech", description="An event-sourced control plane for GPU compute."
    )
    parser.add_argument(
        "--data-dir", help="local state directory (default .resontech, or RESONTECH_DATA_DIR)"
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    command = _subcommands(sub)
    _add_stack_commands(command)
    _add_projection_commands(command)
    _add_audit_commands(sub)
    _add_kernel_commands(command)
    _add_operator_commands(command)
    _add_dispatcher_commands(sub)
    add_agent_arguments(command("agent", cmd_agent, "run the worker agent on this host (until SIGTERM)"))
    from ops.cli.user import register

    register(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``resontech`` console script."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    # one line per request is not news
    for chatty in ("httpx", "httpx2", "httpcore", "openai", "botocore", "boto3"):
        logging.getLogger(chatty).setLevel(logging.DEBUG if args.debug else logging.WARNING)
    try:
        settings = load(env_file=_data_dir(args) / "dev.env")
        return int(args.handler(args, settings))
    except (ResontechError, ApiError) as exc:
        if args.debug:
            raise
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug: say so in one line, keep the traceback behind --debug
        if args.debug:
            raise
        print(
            f"error: unexpected {type(exc).__name__}: {exc} (run with --debug for details)", file=sys.stderr
        )
        return 70


if __name__ == "__main__":
    raise SystemExit(main())
