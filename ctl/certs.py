"""`sluice ctl certs`: make a cluster's CA and its node and client certificates.

    sluice ctl certs [--certs-dir DIR] [--host HOST ...] [--renew]

Like `cockroach cert`, but in one idempotent step: what is missing in DIR is made (the CA, then
node.pem naming every --host plus localhost/127.0.0.1/::1, then client.pem); what exists is kept.
`--renew` re-issues the node and client certificates with the same CA (rotation: processes read
their certificates at start, so restart them one by one afterwards). The layout is
`sluice.core.pki`'s; `sluice cluster up` runs the same code into `<cluster dir>/certs`.

This command never contacts etcd or any process.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from sluice.core import pki

from .context import Ctx


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("certs", parents=[common],
                       help="make the cluster CA and node/client certificates (mutual TLS)")
    p.add_argument("--certs-dir", default="certs", metavar="DIR",
                   help="where the certificates go (default ./certs; created 0700)")
    p.add_argument("--host", dest="hosts", action="append", default=[], metavar="HOST",
                   help="a host name or IP the servers are dialled at (repeat; localhost, "
                        "127.0.0.1 and ::1 are always included)")
    p.add_argument("--renew", action="store_true",
                   help="re-issue node and client certificates with the existing CA")
    p.set_defaults(func=certs)


def certs(ctx: Ctx, args: argparse.Namespace) -> int:
    root = Path(args.certs_dir).resolve()
    written = pki.ensure(root, tuple(args.hosts), renew=args.renew)
    d = pki.CertsDir(root)
    if ctx.json:
        import json
        ctx.print(json.dumps({"certs_dir": str(root), "written": written,
                              "hosts": pki.node_hosts(d)}))
        return 0
    ctx.print(f"{root}: {'wrote ' + ', '.join(written) if written else 'nothing to do'}")
    ctx.print(f"  node certificate names: {', '.join(pki.node_hosts(d))}")
    ctx.print(f"  processes: [security] ssl-ca = \"{d.ca}\", ssl-cert = \"{d.node}\", "
              f"ssl-key = \"{d.node_key}\"")
    ctx.print(f"  clients:   sluice ctl --ssl-ca {d.ca} --ssl-cert {d.client} "
              f"--ssl-key {d.client_key} ...")
    ctx.print(f"  keep {d.ca_key} private: whoever holds it can issue certificates")
    return 0
