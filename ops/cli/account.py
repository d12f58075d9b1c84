"""``resontech login``, ``logout``, ``whoami``: the key the user commands speak with; and ``workers``,
``billing``, ``usage``: what a provider's nodes earn and what a tenant's work costs.
"""

from __future__ import annotations

import argparse
import json

from core.files import write_private
from gateway.client import CREDENTIALS
from ops.cli.session import UserCommand, client, show
from schemas.api.billing import Usage
from schemas.api.workers import Worker


def cmd_login(args: argparse.Namespace) -> int:
    with client(args) as rt:
        if not rt.config.key:
            raise SystemExit("error: give the key: resontech login --key rt_... [--url URL]")
        me = rt.me()
    CREDENTIALS.parent.mkdir(parents=True, exist_ok=True)
    write_private(CREDENTIALS, json.dumps({"url": rt.config.url, "key": rt.config.key}))
    show(
        args,
        me,
        lambda m: f"logged in to {rt.config.url} as {m.principal} ({m.role}); saved to {CREDENTIALS}",
    )
    return 0


def cmd_logout(args: argparse.Namespace) -> int:
    CREDENTIALS.unlink(missing_ok=True)
    print(f"removed {CREDENTIALS}")
    return 0


def cmd_whoami(args: argparse.Namespace) -> int:
    with client(args) as rt:
        me = rt.me()
        show(args, me, lambda m: f"{m.principal} ({m.role}) at {rt.gateways.current}")
    return 0


def cmd_workers(args: argparse.Namespace) -> int:
    with client(args) as rt:
        page = rt.workers(limit=args.limit)

    def human(items: list[Worker]) -> str:
        rows = []
        for w in items:
            gpus = f"{len(w.gpus)}x {w.gpus[0].model}" if w.gpus else f"no GPU, {w.cpus} CPUs"
            rows.append(
                f"{w.worker_id:<18} {w.hostname:<16} {w.state:<11} {w.tier:<10} "
                f"{w.uptime_30d:.1%} up  {gpus}  earned {w.earnings.payout.usd} USD"
            )
        return "\n".join(rows) or "(no workers)"

    show(args, page.items, human)
    return 0


def cmd_billing(args: argparse.Namespace) -> int:
    with client(args) as rt:
        me = rt.me()
        if me.kind == "provider":
            payouts = rt.payouts(args.period)
            show(
                args,
                payouts,
                lambda p: (
                    "\n".join(
                        f"{period.period}: {t.tier} {t.payout.usd} USD"
                        for period in p.periods
                        for t in period.tiers
                    )
                    or "(no payouts)"
                ),
            )
            return 0
        if args.period:
            invoice = rt.invoice(args.period)
            show(
                args,
                invoice,
                lambda i: "\n".join(
                    [f"invoice {i.period}: {i.total.usd} USD ({'open' if i.open else 'closed'})"]
                    + [
                        f"  {line.work_kind} {line.work_id} on {line.gpu_type} ({line.pool}): "
                        f"{line.gpu_seconds:,.0f} GPU-s, {line.cpu_seconds:,.0f} CPU-s"
                        + (f", {line.tokens:,} tokens" if line.tokens else "")
                        + f": {line.charge.usd} USD"
                        for line in i.lines
                    ]
                ),
            )
        else:
            invoices = rt.invoices()
            show(
                args,
                invoices,
                lambda items: (
                    "\n".join(
                        f"{i.period}: {i.total.usd} USD ({'open' if i.open else 'closed'}, {i.lines} lines)"
                        for i in items
                    )
                    or "(no invoices yet)"
                ),
            )
    return 0


def cmd_usage(args: argparse.Namespace) -> int:
    """A tenant's usage by period and by job or endpoint: GPU- and CPU-seconds, tokens, charges."""
    with client(args) as rt:
        usage = rt.usage(args.period)

    def human(u: Usage) -> str:
        rows = []
        for p in u.periods:
            rows.append(
                f"{p.period}: {p.gpu_seconds:,.0f} GPU-s, {p.cpu_seconds:,.0f} CPU-s, "
                f"{p.tokens:,} tokens: {p.charge.usd} USD"
            )
            rows += [
                f"  {w.work_kind} {w.work_id}: {w.gpu_seconds:,.0f} GPU-s, {w.cpu_seconds:,.0f} CPU-s, "
                f"{w.tokens:,} tokens: {w.charge.usd} USD"
                for w in p.work
            ]
        return "\n".join(rows) or "(no usage yet)"

    show(args, usage, human)
    return 0


def register_keys(user: UserCommand) -> None:
    """Add ``login``, ``logout`` and ``whoami``."""
    user("login", cmd_login, "check a gateway URL and key, and remember them for later commands")
    user("logout", cmd_logout, "forget what login remembered")
    user("whoami", cmd_whoami, "who the current key is")


def register_billing(user: UserCommand) -> None:
    """Add ``workers``, ``billing`` and ``usage``."""
    p = user("workers", cmd_workers, "a provider's nodes: health, tier, uptime, earnings")
    p.add_argument("--limit", type=int, default=50)
    p = user("billing", cmd_billing, "invoices (tenants) or payouts (providers)")
    p.add_argument("--period", help="one month, YYYY-MM")
    p = user("usage", cmd_usage, "your usage by month and by job or endpoint, tokens included")
    p.add_argument("--period", help="one month, YYYY-MM")
