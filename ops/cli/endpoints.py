"""``resontech endpoints``, ``deploy``, ``scale``, ``undeploy``, ``infer``: a tenant's inference
endpoints. In the CLI an endpoint view is read here only: :func:`endpoint_line`,
:func:`endpoint_detail` and the one-line answers of the commands.
"""

from __future__ import annotations

import argparse
import json
import sys

from ops.cli.session import UserCommand, client, show
from ops.specs import read_spec
from schemas.api.endpoints import Endpoint, Traffic


def traffic_text(t: Traffic) -> str:
    """An endpoint's traffic through the gateway (its last 60 s) in one phrase: requests, RPS, error
    rate and P50/P95/P99 latency, or that nothing was served; then its line (:func:`line_text`)."""
    served = "no requests"
    if t.requests:
        served = (
            f"{t.requests} req, {t.rps:.2f} rps, {t.error_rate:.1%} errors, "
            f"p50/p95/p99 {t.p50_ms:.1f}/{t.p95_ms:.1f}/{t.p99_ms:.1f} ms"
        )
    line = line_text(t)
    return f"{served}; {line}" if line else served


def line_text(t: Traffic) -> str:
    """The endpoint's line in one phrase (empty when nothing waits, waited or was refused): waiting
    and held requests now, time in line P50/P99, requests refused with 429."""
    if not (t.queue_depth or t.in_flight or t.wait_p99_ms or t.rejected):
        return ""
    return (
        f"{t.queue_depth} waiting, {t.in_flight} in flight, wait p50/p99 "
        f"{t.wait_p50_ms:.0f}/{t.wait_p99_ms:.0f} ms, {t.rejected} refused (429)"
    )


def endpoint_line(e: Endpoint) -> str:
    """One line per endpoint; a failed one adds why on the next line."""
    replicas = f"{e.ready_replicas}/{e.desired_replicas} ready"
    line = (
        f"{e.endpoint_id:<28} {e.spec.name:<20} {e.state:<15} {replicas:<11} {e.spec.model}\n"
        f"{'':<28} last 60 s: {traffic_text(e.traffic)}"
    )
    return line + (f"\n{'':<28} failed: {e.scale_reason}" if e.state == "failed" else "")


def endpoint_detail(e: Endpoint) -> str:
    """An endpoint, its replicas, its traffic, and the latest replica failure with the engine's last
    lines."""
    zero = (
        "never to zero"
        if e.spec.scale_to_zero_after_s is None
        else f"to zero after {e.spec.scale_to_zero_after_s} s idle"
    )
    lines = [
        f"endpoint {e.endpoint_id} ({e.spec.name}, {e.spec.model}) of {e.tenant}: {e.state}",
        f"  replicas: {e.ready_replicas}/{e.desired_replicas} ready (min {e.spec.min_replicas}, max "
        f"{e.spec.max_replicas}, target {e.spec.target_rps_per_replica:g} rps per replica, {zero})",
        f"  serving: {e.spec.max_concurrency} requests per replica, then a line of {e.spec.max_queue} "
        f"(up to {e.spec.queue_timeout_s:g} s each); routing {e.spec.routing}",
    ]
    if e.scale_reason:
        lines.append(f"  {'failed' if e.state == 'failed' else 'last scaled'}: {e.scale_reason}")
    for r in e.replicas:
        where = f" at {r.address}" if r.address else ""
        why = f": {r.reason}" if r.reason else ""
        lines.append(f"  replica {r.slot}: {r.state} on {r.worker_id}{where} (epoch {r.epoch}){why}")
    lines.append(f"  traffic, last 60 s: {traffic_text(e.traffic)}")
    if e.last_failure:
        lines.append(f"  last replica failure ({e.start_failures} in a row): {e.last_failure}")
        lines += [f"    | {line}" for line in e.last_failure_log_tail.splitlines()]
    return "\n".join(lines)


def cmd_endpoints(args: argparse.Namespace) -> int:
    with client(args) as rt:
        page = rt.endpoints(limit=args.limit)
    show(args, page.items, lambda items: "\n".join(endpoint_line(e) for e in items) or "(no endpoints)")
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    spec = read_spec(args.spec)
    for field in ("routing", "max_concurrency", "max_queue"):
        if (value := getattr(args, field)) is not None:
            spec[field] = value  # the command line over the file
    with client(args) as rt:
        endpoint = rt.deploy(spec)
    show(args, endpoint, lambda e: f"deployed {e.endpoint_id} ({e.spec.name}): {e.state}")
    return 0


def cmd_scale(args: argparse.Namespace) -> int:
    with client(args) as rt:
        endpoint = rt.scale(args.endpoint, min_replicas=args.min, max_replicas=args.max)
    show(args, endpoint, endpoint_line)
    return 0


def cmd_undeploy(args: argparse.Namespace) -> int:
    with client(args) as rt:
        rt.delete_endpoint(args.endpoint)
    print(f"deleted {args.endpoint}")
    return 0


def cmd_infer(args: argparse.Namespace) -> int:
    """Ask an endpoint through the gateway's OpenAI-compatible routes, with the official client."""
    import openai
    from openai.types.chat import ChatCompletionMessageParam

    with client(args) as rt:
        rt.health()  # the OpenAI client speaks to one gateway: one that answers now
        url, key = rt.gateways.current, rt.config.key
    api = openai.OpenAI(base_url=f"{url}/v1", api_key=key or "", timeout=180.0)
    try:
        if args.embed:
            vector = api.embeddings.create(model=args.endpoint, input=args.prompt).data[0].embedding
            print(json.dumps(vector) if args.json else f"{len(vector)} dimensions: {vector[:4]}...")
            return 0
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": args.prompt}]
        stream = api.chat.completions.create(
            model=args.endpoint, messages=messages, max_tokens=args.max_tokens, stream=True
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                print(chunk.choices[0].delta.content, end="", flush=True)
        print()
    except openai.APIStatusError as exc:
        print(f"error: {exc.status_code} {exc.message}", file=sys.stderr)
        return 1
    return 0


def register(user: UserCommand) -> None:
    """Add ``endpoints``, ``deploy``, ``scale``, ``undeploy`` and ``infer``."""
    p = user("endpoints", cmd_endpoints, "list your inference endpoints, with their traffic (last 60 s)")
    p.add_argument("--limit", type=int, default=50)
    p = user("deploy", cmd_deploy, "deploy an endpoint from a YAML, TOML or JSON spec file")
    p.add_argument("spec", help="the endpoint spec file (fields of POST /v1/endpoints)")
    p.add_argument(
        "--routing",
        choices=["round_robin", "session", "prefix"],
        help="how a replica is chosen: in turn (default), by the caller's session, by the prompt's prefix",
    )
    p.add_argument("--max-concurrency", type=int, help="requests one replica holds at once (default 8)")
    p.add_argument("--max-queue", type=int, help="requests that may wait in line (default 64)")
    p = user("scale", cmd_scale, "change an endpoint's replica bounds")
    p.add_argument("endpoint")
    p.add_argument("--min", type=int, help="minimum replicas (0 allows scale to zero)")
    p.add_argument("--max", type=int, help="maximum replicas")
    p = user("undeploy", cmd_undeploy, "delete an endpoint (its replicas stop)")
    p.add_argument("endpoint")
    p = user("infer", cmd_infer, "ask an endpoint a question (chat, streamed) or embed a text")
    p.add_argument("endpoint", help="the endpoint's name")
    p.add_argument("prompt")
    p.add_argument("--embed", action="store_true", help="embed the text instead of chatting")
    p.add_argument("--max-tokens", type=int, default=128)
