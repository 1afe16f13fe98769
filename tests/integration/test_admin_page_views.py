"""What the admin page's JSON routes compute, without a proxy: the refusals kept, the checks of an edit, the
period budgets that bound a key or team and their usage (the in-memory store the request path uses)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from litellm_kv.config import Settings, parse_section
from litellm_kv.governance.budgets import MemoryPeriodBudgets, Period
from litellm_kv.integration.admin_page import Owner, field_errors, form_fields, owner_view
from litellm_kv.integration.hooks import Caller
from litellm_kv.integration.refusals import RecentRefusals

SETTINGS = parse_section(Settings, {"model_groups": {
    "qwen": {"reasoning": {"style": "vllm", "tokens_per_day": 500}},
    "qwen-small": {"reasoning": {"style": "vllm"}},
    "qwen-vl": {"vision": {"family": "qwen2_5_vl"}},
}}, "litellm_kv")

KEY = Caller(key_hash="abc123", key_alias="bot-a", team_id="t1", team_alias="research",
             key_metadata={"owner": "x", "litellm_kv": {"reasoning": {"tokens_per_day": 100, "max_budget": 8}}},
             team_metadata={"litellm_kv": '{"reasoning": {"tokens_per_week": 1000}}'})


def test_refusals_are_bounded_and_filtered_newest_first() -> None:
    kept = RecentRefusals(kept=3)
    for i in range(5):
        kept.add(key_hash="a" if i % 2 else "b", key_label="k", team_id="t", team_label="team 't'", model="m",
                 limit="reasoning.tokens_per_day", status=429, message=f"refusal {i}", at=float(i))
    assert len(kept) == 3  # the oldest two were dropped
    assert [r.message for r in kept.latest()] == ["refusal 4", "refusal 3", "refusal 2"]
    assert [r.message for r in kept.latest(key_hash="a")] == ["refusal 3"]
    assert [r.message for r in kept.latest(team_id="t", limit=2)] == ["refusal 4", "refusal 3"]
    assert kept.latest(team_id="other") == []


def test_an_edit_is_checked_field_by_field_with_the_owner_named() -> None:
    errors = field_errors({"reasoning": {"max_budget": "lots", "over_max": "sometimes"},
                           "vision": {"max_images_per_request": -1}, "reasonig": {}},
                          where="key 'bot-a'", metadata_key="litellm_kv")
    fields = {e["field"] for e in errors}
    assert fields == {"metadata.litellm_kv.reasoning.max_budget", "metadata.litellm_kv.reasoning.over_max",
                      "metadata.litellm_kv.vision.max_images_per_request", "metadata.litellm_kv.reasonig"}
    assert all(e["message"].startswith("key 'bot-a': ") for e in errors)
    assert field_errors({"reasoning": {"max_budget": 12}}, where="key 'bot-a'", metadata_key="litellm_kv") == []


def test_form_fields_are_the_declared_ones() -> None:
    fields = form_fields()
    kinds = {f["name"]: f["kind"] for f in fields["reasoning"]}
    assert kinds["allowed"] == "boolean" and kinds["max_budget"] == "integer" and kinds["over_max"] == "choice"
    assert next(f for f in fields["vision"] if f["name"] == "over_limit")["choices"] == ["downscale", "reject"]


async def test_owner_view_lists_each_budget_that_bounds_a_key_with_its_usage() -> None:
    budgets = MemoryPeriodBudgets()
    await budgets.charge("key:abc123", "reasoning_tokens", Period.DAY, 42)
    await budgets.charge("team:t1", "reasoning_tokens", Period.WEEK, 77)
    refusals = RecentRefusals()
    refusals.add(key_hash="abc123", key_label="key 'bot-a'", team_id="t1", team_label="team 'research'",
                 model="qwen", limit="reasoning.tokens_per_day", status=429, message="spent")
    refusals.add(key_hash="other", key_label="key 'x'", team_id=None, team_label=None, model="qwen",
                 limit="reasoning.max_budget", status=400, message="not this key's")
    handlers: dict[str, Any] = {"reasoning": SimpleNamespace(budgets=budgets), "vision": None}
    view = await owner_view(SETTINGS, handlers, refusals, Owner("key", KEY))
    rows = {(u["scope"], u["period"], u["limit"], u["source"]): u.get("used") for u in view["usage"]}
    assert rows == {
        ("key:abc123", "day", 100, "key 'bot-a'"): 42,  # the key's own: stricter than qwen's 500 per key
        ("team:t1", "week", 1000, "team 'research'"): 77,
    }
    assert view["errors"] == [] and view["litellm_kv"] == {"reasoning": {"tokens_per_day": 100, "max_budget": 8}}
    assert view["team"]["litellm_kv"] == {"reasoning": {"tokens_per_week": 1000}}  # a JSON string, read as stored
    assert view["applies_to"] == {"reasoning": ["qwen", "qwen-small"], "vision": ["qwen-vl"]}
    assert view["enabled"] == {"reasoning": True, "vision": False}
    assert [r["message"] for r in view["refusals"]] == ["spent"]

    plain = Caller(key_hash="abc123", key_alias="bot-a")  # no limit of its own: the group's per-key default bounds it
    view = await owner_view(SETTINGS, handlers, refusals, Owner("key", plain))
    assert [(u["limit"], u["source"], u["used"]) for u in view["usage"]] == [
        (500, "config model_groups.qwen.reasoning", 42)]


async def test_owner_view_of_a_team_shows_only_the_teams_budgets_and_its_stored_problems() -> None:
    team = Caller(team_id="t1", team_alias="research",
                  team_metadata={"litellm_kv": {"reasoning": {"tokens_per_week": 1000, "max_budget": "lots"}}})
    view = await owner_view(SETTINGS, {"reasoning": SimpleNamespace(budgets=MemoryPeriodBudgets())},
                            RecentRefusals(), Owner("team", team))
    assert [(u["scope"], u["period"], u["used"]) for u in view["usage"]] == [("team:t1", "week", 0)]
    assert [e["field"] for e in view["errors"]] == ["metadata.litellm_kv.reasoning.max_budget"]
