"""``litellm-kv doctor``: the checks in order (config, Redis and indexers, each KV-routed group's engines)."""

from __future__ import annotations

import asyncio
import logging
import sys
from dataclasses import dataclass, field
from typing import TextIO

from litellm_kv.doctor.deployment import DeploymentPlan, names_over_guarded_engines, read_deployment
from litellm_kv.doctor.engines import GroupCheck
from litellm_kv.doctor.report import Report, Status
from litellm_kv.doctor.shared import check_eviction, check_indexers, check_redis
from litellm_kv.errors import ConfigError


@dataclass(slots=True)
class DoctorOptions:
    """What to check and how long to wait."""

    config: str
    """The LiteLLM config file (with its ``litellm_kv`` section), as the proxy is started with it."""
    indexers: list[str] = field(default_factory=list)
    """Indexer base URLs whose ``/health`` to read (shared mode)."""
    timeout_s: float = 20.0
    """Longest wait for one step (a connection, events to arrive, a probe answer)."""
    proxy_url: str | None = None
    """The running proxy's base URL, for ``key``."""
    key: str | None = None
    """A virtual key whose litellm-kv metadata to check (read from the proxy's ``/key/info``)."""
    admin_key: str | None = None
    """A proxy admin key to read the key's and its team's info with (default: the key itself)."""


async def diagnose(opts: DoctorOptions, report: Report) -> None:
    report.section(f"config {opts.config}")
    try:
        plan: DeploymentPlan = read_deployment(opts.config)
    except ConfigError as exc:
        report.add("config.parse", opts.config, Status.ERROR, str(exc), "fix the option the message names "
                   "(docs/configuration.md); the proxy refuses to start with it too")
        return
    groups = ", ".join(f"{g.name} ({len(g.deployments)} replica(s))" for g in plan.groups) or "none"
    report.add("config.parse", opts.config, Status.OK, f"litellm_kv section valid; mode {plan.settings.mode}; "
               f"KV-routed groups: {groups}")
    for name in plan.unrouted:
        report.add("config.deployments", name, Status.ERROR,
                   "routing: kv but no model_list entry of this model_name has an api_base",
                   "add the group's vLLM replicas to model_list (model_name, litellm_params.api_base)")
    for name, guarded in (await names_over_guarded_engines(plan)).items():
        named = "; ".join(f"'{g}' ({' and '.join(sections)})" for g, sections in guarded.items())
        report.add("config.names", name, Status.ERROR,
                   f"model_name '{name}' is served by the same vLLM server as {named}, but has no "
                   "litellm_kv.model_groups entry: the proxy refuses its requests (governance.model_name), since "
                   "those settings would not follow it",
                   f"give '{name}' an entry under litellm_kv.model_groups ({{}} for none), make it a "
                   "router_settings.model_group_alias of the group, or remove it (docs/security/alias.md)")
    if any(p.use == "budgets" and p.redis is None for p in plan.settings.stores()):
        report.add("config.budgets", "budgets", Status.WARN,
                   "period budgets are kept in the proxy process's memory (no Redis): right for one proxy with one "
                   "worker; with --num_workers > 1 the proxy refuses them, and several proxies would each grant "
                   "the whole budget", "configure litellm_kv.redis (or redis_url, budgets.redis) before running "
                   "several workers or proxies (docs/operations.md, \"Several workers\")")
    if plan.settings.redis_for("index") is not None or plan.settings.mode == "shared" or opts.indexers:
        report.section("redis and indexers")
        await check_redis(plan, report, timeout_s=opts.timeout_s)
        await check_indexers(opts.indexers, report, timeout_s=opts.timeout_s)
    if any(p.redis is not None for p in plan.settings.stores()):
        report.section("redis eviction")
        await check_eviction(plan, report)
    for group in plan.groups:
        await GroupCheck(group, report, timeout_s=opts.timeout_s).run()
    if opts.key:
        report.section("key metadata")
        if not opts.proxy_url:
            report.add("key.found", "key", Status.ERROR, "--key needs --proxy (the proxy's base URL)")
            return
        from litellm_kv.doctor.keys import check_key

        await check_key(plan.settings, opts.proxy_url, opts.key, report, admin_key=opts.admin_key,
                        timeout_s=opts.timeout_s)


def run_doctor(opts: DoctorOptions, *, as_json: bool = False, out: TextIO | None = None) -> int:
    """Run every check; progress goes to ``out`` (stderr with ``as_json``, where stdout carries the JSON).
    Returns the exit code: 0 when nothing is wrong (warnings allowed), 1 otherwise."""
    from litellm_kv.doctor.report import write_json

    stream = out if out is not None else (sys.stderr if as_json else sys.stdout)
    # What the checked code logs on its own (a replica not exact, a subscriber reconnecting) is in the findings.
    logger = logging.getLogger("litellm_kv")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    report = Report(progress=stream)
    try:
        asyncio.run(diagnose(opts, report))
    finally:
        logger.setLevel(level)
    print(f"\n{report.summary()}", file=stream, flush=True)
    if as_json:
        write_json(report)
    return report.exit_code
