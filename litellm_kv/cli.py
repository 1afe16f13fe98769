"""The ``litellm-kv`` command: one subcommand per function, registered in :data:`SUBCOMMANDS`."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence

from litellm_kv.errors import ConfigError


def _indexer(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("indexer", help="Feed the shared Redis KV index from vLLM replicas' KV events.")
    p.add_argument("--config", required=True, help="indexer YAML file (see docs/indexer.md)")
    p.add_argument("--host", default=None, help="override the config's host")
    p.add_argument("--port", type=int, default=None, help="override the config's port")
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=run_indexer)


def run_indexer(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from litellm_kv.services.indexer.app import create_app
    except ModuleNotFoundError as exc:  # the HTTP API's packages are the `indexer` extra
        print(f"litellm-kv indexer: {exc}; install litellm-kv with its `indexer` extra (the indexer's HTTP API): "
              "pip install '<checkout or wheel>[indexer]', docs/install.md", file=sys.stderr)
        return 2
    from litellm_kv.services.indexer.config import load_indexer_config
    from litellm_kv.services.indexer.service import Indexer

    cfg = load_indexer_config(args.config)
    if args.host:
        cfg.host = args.host
    if args.port:
        cfg.port = args.port
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(Indexer(cfg))
    # Requests still open at SIGTERM are waited for a bounded time: the stop (and the leases' release) follows.
    # uvicorn types the wait as int seconds; it is a wait_for timeout, which takes a float.
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level=args.log_level.lower(),
                timeout_graceful_shutdown=cfg.shutdown_grace_s)  # type: ignore[arg-type]
    return 0


def _bench(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("bench", help="Trace-replay simulator: litellm-kv vs the field's routing strategies "
                                     "(replay, sweep-load, sweep-fleet, knee; see docs/benchmarks.md).",
                       add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=run_bench)


def run_bench(args: argparse.Namespace) -> int:  # reached only through main()'s early dispatch
    from litellm_kv.simulator import cli_main

    return int(cli_main(list(args.rest)) or 0)


def _doctor(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("doctor", help="Check a running deployment end to end from its LiteLLM config: engines' "
                                      "flags and cache settings, event streams, tokenizer, Redis and indexers "
                                      "(see docs/troubleshooting.md).")
    p.add_argument("--config", required=True, help="the LiteLLM config file the proxy runs with")
    p.add_argument("--indexer", action="append", default=[], metavar="URL",
                   help="an indexer's base URL whose /health to check (repeatable; shared mode)")
    p.add_argument("--timeout", type=float, default=20.0, help="longest wait for one step, seconds")
    p.add_argument("--json", action="store_true", help="print the findings as JSON on stdout (progress on stderr)")
    p.add_argument("--proxy", default=None, metavar="URL", help="the running proxy's base URL (for --key)")
    p.add_argument("--key", default=None, help="a virtual key whose litellm_kv metadata and limits to check; "
                                               "default from LITELLM_KV_DOCTOR_KEY")
    p.add_argument("--admin-key", default=None, help="proxy admin key to read key and team info with; default "
                                                     "from LITELLM_MASTER_KEY, else the key itself")
    p.set_defaults(func=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    from litellm_kv.doctor import DoctorOptions
    from litellm_kv.doctor import run_doctor as doctor

    return doctor(DoctorOptions(config=args.config, indexers=list(args.indexer), timeout_s=args.timeout,
                                proxy_url=args.proxy, key=args.key or os.environ.get("LITELLM_KV_DOCTOR_KEY"),
                                admin_key=args.admin_key or os.environ.get("LITELLM_MASTER_KEY")),
                  as_json=args.json)


# Each entry adds one subparser and sets ``func``; other subcommands (demo, bench) register here
# the same way.
SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [  # type: ignore[type-arg]
    _indexer, _bench, _doctor,
]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="litellm-kv", description="litellm-kv tools")
    sub = ap.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        # The simulator has its own sub-commands and options; hand everything after 'bench' to it.
        from litellm_kv.simulator import cli_main

        return int(cli_main(argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"litellm-kv: configuration error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
