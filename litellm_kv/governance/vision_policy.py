"""Visual-token policy: the vision section's settings, the key ▸ team ▸ config limits, and the
downscale plan (the largest ``max_pixels`` at which every image still fits the limits).

Pure: no I/O, nothing from LiteLLM. :mod:`litellm_kv.integration.vision_hooks` finds and measures the
images of a request, calls these functions and enforces what they decide. Schema: ``docs/vision.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from litellm_kv.config import doc
from litellm_kv.errors import PolicyViolation
from litellm_kv.governance.budgets import Period
from litellm_kv.governance.images import DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_IMAGE_PIXELS, ImageError
from litellm_kv.governance.policy import (
    FieldSpec,
    Limit,
    PeriodLimit,
    PolicyLayer,
    period_limits,
    strictest_choice,
    strictest_min,
)
from litellm_kv.governance.vision import ENGINE_RESIZABLE, FAMILIES, QWEN_GRIDS, max_visual_tokens, visual_tokens

OVER_LIMIT_ORDER: tuple[str, ...] = ("downscale", "reject")  # loosest → strictest
#: Fields of the policy object (key metadata, team metadata, or the group's config section).
POLICY_SPECS: tuple[FieldSpec, ...] = (
    FieldSpec("max_images_per_request", "integer", "Images per request; more → 400 (never downscaled)."),
    FieldSpec("max_visual_tokens_per_request", "integer", "Counted visual tokens of one request."),
    FieldSpec("max_pixels_per_image", "integer", "Width × height of each image.", minimum=1),
    FieldSpec("tokens_per_day", "integer", "Visual tokens per UTC day (key metadata: the key; team "
              "metadata: the whole team). Spent: 429 with Retry-After."),
    FieldSpec("tokens_per_week", "integer", "Visual tokens per UTC week, from Monday 00:00."),
    FieldSpec("tokens_per_month", "integer", "Visual tokens per UTC month, from the 1st 00:00."),
    FieldSpec("over_limit", "choice", "Over a token or pixel limit: 'reject' (400; default) or 'downscale' "
              "(lower max_pixels until the images fit).", choices=OVER_LIMIT_ORDER),
)
POLICY_FIELDS = tuple(spec.name for spec in POLICY_SPECS)
_SPEC = {spec.name: spec for spec in POLICY_SPECS}
PERIOD_FIELDS: dict[Period, str] = {
    Period.DAY: "tokens_per_day", Period.WEEK: "tokens_per_week", Period.MONTH: "tokens_per_month",
}


@dataclass(slots=True)
class FetchSettings:
    """Optional fetching of remote images to read their size (off unless hosts are listed)."""

    allow_hosts: list[str] = doc(
        "Exact host names whose images may be fetched to measure them; empty = never fetch.", default_factory=list
    )
    timeout_s: float = doc("Total time allowed per fetch; on timeout the ceiling is counted.", default=2.0)
    max_bytes: int = doc("Largest image fetched; bigger answers are a 400 (image.too_large).", default=5 * 2**20)


@dataclass(slots=True)
class GroupVisionSettings:
    """Model-group settings of the vision section (beside the policy fields)."""

    family: str = doc(f"Visual-token formula of the group's model: one of {list(FAMILIES)}.", default="qwen2_5_vl")
    min_pixels: int | None = doc(
        "The engine's min_pixels (Qwen families) when the deployment overrides the model default (vLLM "
        "--mm-processor-kwargs): must equal it, or counts differ from the engine's.", default=None
    )
    max_pixels: int | None = doc(
        "The engine's max_pixels (Qwen families) when the deployment overrides the model default (vLLM "
        "--mm-processor-kwargs): must equal it, or counts differ from the engine's and a KV-routed group "
        "routes image requests by load after repeated mismatches; also the ceiling at which unfetched remote images "
        "are counted.", default=None,
    )
    detail: str | None = doc("Default detail level (openai/anthropic/gemini) when the request gives none.",
                             default=None)
    tokens_per_image: int | None = doc("Tokens per image for family 'fixed'.", default=None)
    remote_image_tokens: int | None = doc(
        "Tokens counted for an unfetched remote image when the family has no ceiling (gemini tiles).", default=None
    )
    max_image_bytes: int = doc("Largest decoded image payload accepted (400 image.too_large).",
                               default=DEFAULT_MAX_IMAGE_BYTES)
    max_image_pixels: int = doc(
        "Largest width x height an image header may declare (400 image.too_many_pixels; decompression bombs).",
        default=DEFAULT_MAX_IMAGE_PIXELS,
    )
    videos: Literal["reject", "allow"] = doc(
        "Video parts: 'reject' (400 vision.videos) or 'allow' (passed through, not counted).", default="reject"
    )
    engine_resize: bool = doc(
        "Whether vLLM deployments (hosted_vllm/) get mm_processor_kwargs.max_pixels when downscaling.",
        default=True,
    )
    prompt_includes_images: bool = doc(
        "Whether the engine's prompt_tokens already include visual tokens (vLLM: yes). If false, they are added.",
        default=True,
    )
    invalid_metadata: Literal["reject", "ignore"] = doc(
        "Malformed vision metadata on a key/team: 'reject' (400 naming the field) or 'ignore' (log, use config).",
        default="reject",
    )
    fetch: FetchSettings = doc("Optional fetching of remote images.", default_factory=FetchSettings)

    def validate(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {list(FAMILIES)}, got {self.family!r}")
        if self.family == "fixed" and self.tokens_per_image is None:
            raise ValueError("family 'fixed' needs tokens_per_image")


GROUP_FIELDS = tuple(GroupVisionSettings.__dataclass_fields__)


@dataclass(frozen=True, slots=True)
class VisionPolicy:
    max_images: Limit[int] | None = None
    max_tokens: Limit[int] | None = None
    max_pixels: Limit[int] | None = None
    over_limit: Limit[str] | None = None
    periods: tuple[PeriodLimit, ...] = ()

    @property
    def downscale(self) -> bool:
        return self.over_limit is not None and self.over_limit.value == "downscale"


def resolve_policy(
    key: PolicyLayer, team: PolicyLayer | None, config: PolicyLayer, *, key_scope: str, team_scope: str | None
) -> VisionPolicy:
    """Strictest of key, team and config for each limit; ``over_limit`` defaults to reject."""
    layers = [lay for lay in (key, team, config) if lay is not None]
    for lay in layers:
        lay.check_known(POLICY_FIELDS + (GROUP_FIELDS if not lay.from_metadata else ()))
    periods = period_limits(key, team, config, PERIOD_FIELDS, key_scope=key_scope, team_scope=team_scope)
    return VisionPolicy(
        max_images=strictest_min(*(lay.read(_SPEC["max_images_per_request"]) for lay in layers)),
        max_tokens=strictest_min(*(lay.read(_SPEC["max_visual_tokens_per_request"]) for lay in layers)),
        max_pixels=strictest_min(*(lay.read(_SPEC["max_pixels_per_image"]) for lay in layers)),
        over_limit=strictest_choice(OVER_LIMIT_ORDER, *(lay.read(_SPEC["over_limit"]) for lay in layers)),
        periods=tuple(periods),
    )



@dataclass(slots=True)
class Counted:
    """One image as counted before the call."""

    where: str
    tokens: int
    width: int | None = None  # None: remote image of unknown size (counted at the ceiling)
    height: int | None = None
    how: str = "header"  # header | fetched | ceiling
    detail: str | None = None
    #: ``sha256:<hex>`` of the image's encoded bytes (litellm_kv.vllm.multimodal.image_identifier): the
    #: ``uuid`` the proxy gives the engine; None for a remote image that was not fetched.
    identifier: str | None = None
    #: A fetched remote image as a ``data:`` URL of the bytes that were counted (never in the spend log): the
    #: engine is sent these bytes, so that what it processes is what was counted and identified.
    inline_url: str | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {"where": self.where, "tokens": self.tokens, "width": self.width, "height": self.height,
                "how": self.how, "identifier": self.identifier}


@dataclass(frozen=True, slots=True)
class PixelBounds:
    """The ``min_pixels``/``max_pixels`` an engine resizes each image into (``None``: the model default)."""

    min_pixels: int | None
    max_pixels: int | None


@dataclass(frozen=True, slots=True)
class TokenCap:
    """One limit on the request's visual tokens: per request, or what is left of a period budget."""

    tokens: int  # the most the request may use under this limit
    limit_name: str
    limit: Limit[int]
    status: int  # 400 for a per-request limit, 429 for a period budget
    headers: Mapping[str, str]
    what: str  # how a refusal names the limit

    @classmethod
    def per_request(cls, limit: Limit[int], who: str) -> TokenCap:
        return cls(limit.value, "vision.max_visual_tokens_per_request", limit, 400, {},
                   f"the limit of {limit.value} visual tokens per request for {who}")


#: The only processor arguments a client may set on a vision group: the ones the count follows.
CLIENT_PROCESSOR_FIELDS = ("min_pixels", "max_pixels")


def take_processor_kwargs(data: MutableMapping[str, Any]) -> dict[str, Any] | None:
    """Remove the client's ``mm_processor_kwargs`` from the request, at top level and inside ``extra_body``
    (LiteLLM sends both to the engine); their union, or ``None`` when the client sent none.

    Removed so that the engine only ever gets the bounds the proxy counted with (written back by the
    caller); the same field in both places with two values is a 400, as the engine would see only one.
    """
    extra = data.get("extra_body")
    places = [("", data)] + ([("extra_body.", extra)] if isinstance(extra, MutableMapping) else [])
    # Every copy is removed before any is checked, so a refused request leaves none behind either.
    taken = [(prefix, place.pop("mm_processor_kwargs")) for prefix, place in places if "mm_processor_kwargs" in place]
    found: dict[str, Any] = {}
    for prefix, given in taken:
        if given is None:
            continue
        if not isinstance(given, Mapping):
            raise _processor_error(f"{prefix}mm_processor_kwargs must be an object, got {type(given).__name__}",
                                   "mm_processor_kwargs", None)
        for name, value in given.items():
            if name in found and found[name] != value:
                raise _processor_error(
                    f"mm_processor_kwargs.{name} is given twice with different values ({_shown(found[name])} and "
                    f"{_shown(value)} in {prefix}mm_processor_kwargs)", _field_label(name), value,
                )
            found[name] = value
    return found if taken else None


def _processor_error(message: str, field: str, value: object) -> PolicyViolation:
    return PolicyViolation(400, message, limit_name=f"vision.{field}", value=value, source="request")


def _field_label(name: object) -> str:
    """The limit a refusal names: the field when it is one we know, never a client's own key (metric label)."""
    return f"mm_processor_kwargs.{name}" if name in CLIENT_PROCESSOR_FIELDS else "mm_processor_kwargs"


def _shown(value: object) -> str:
    """A client value as a refusal quotes it: short, whatever the client sent."""
    text = repr(value)
    return text if len(text) <= 64 else text[:61] + "..."


def engine_bounds(client: Mapping[str, Any] | None, gs: GroupVisionSettings) -> PixelBounds:
    """The pixel bounds the engine will use: the group's, or the client's own (from
    :func:`take_processor_kwargs`), checked so that what is counted is what the engine does.

    Refused (400 ``vision.mm_processor_kwargs``): any other processor argument (``size``, patch sizes...
    change the count in ways not modelled), any on a family the engine does not resize, values that are
    not positive integers, ``min_pixels`` above ``max_pixels``, and ``min_pixels`` above
    ``max_image_pixels`` (the engine would enlarge every image into a decompression bomb).
    """
    lo, hi = gs.min_pixels, gs.max_pixels
    if not client:
        return PixelBounds(lo, hi)
    if gs.family not in ENGINE_RESIZABLE:
        raise _processor_error(
            f"mm_processor_kwargs cannot be set on a {gs.family} vision group: its visual tokens would not be "
            "counted as the engine spends them", "mm_processor_kwargs", sorted(client),
        )
    unknown = sorted(str(k) for k in client if k not in CLIENT_PROCESSOR_FIELDS)
    if unknown:
        raise _processor_error(
            f"mm_processor_kwargs.{unknown[0]} is not accepted on a vision group (only "
            f"{', '.join(CLIENT_PROCESSOR_FIELDS)} are, so that visual tokens are counted as the engine spends them)",
            "mm_processor_kwargs", unknown,
        )
    for name in CLIENT_PROCESSOR_FIELDS:
        v = client.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
            raise _processor_error(f"mm_processor_kwargs.{name} must be a positive integer, got {_shown(v)}",
                                   f"mm_processor_kwargs.{name}", v)
    grid = QWEN_GRIDS[gs.family]
    lo = client.get("min_pixels") or lo
    hi = client.get("max_pixels") or hi
    lo_eff = grid.min_pixels if lo is None else lo
    hi_eff = grid.max_pixels if hi is None else hi
    if lo_eff > hi_eff:
        raise _processor_error(f"mm_processor_kwargs.min_pixels ({lo_eff}) is above max_pixels ({hi_eff})",
                               "mm_processor_kwargs.min_pixels", lo_eff)
    if lo_eff > gs.max_image_pixels:
        raise _processor_error(
            f"mm_processor_kwargs.min_pixels ({lo_eff}) is above the group's max_image_pixels "
            f"({gs.max_image_pixels}): every image would be enlarged past the decompression-bomb cap",
            "mm_processor_kwargs.min_pixels", lo_eff,
        )
    # Both bounds explicit: the engine is then told exactly these, whatever it was started with.
    return PixelBounds(lo_eff, hi_eff)


def processor_kwargs_of(b: PixelBounds) -> dict[str, int]:
    """The ``mm_processor_kwargs`` that make the engine resize within ``b`` (the bounds that are set)."""
    return {name: v for name, v in (("min_pixels", b.min_pixels), ("max_pixels", b.max_pixels)) if v is not None}


def image_tokens(gs: GroupVisionSettings, w: int, h: int, detail: str | None, b: PixelBounds, where: str) -> int:
    """Visual tokens of one ``w`` x ``h`` image within the bounds ``b`` (400 image.corrupt if unusable)."""
    try:
        return visual_tokens(gs.family, w, h, min_pixels=b.min_pixels, max_pixels=b.max_pixels,
                             detail=detail or gs.detail, tokens_per_image=gs.tokens_per_image)
    except ValueError as exc:
        raise ImageError.of("corrupt", where, f"{w}x{h} image cannot be used with {gs.family}: {exc}") from None


def ceiling_tokens(gs: GroupVisionSettings, detail: str | None, b: PixelBounds, where: str) -> int:
    """The most visual tokens an image of unknown size can become (400 image.invalid_url if unbounded)."""
    top = max_visual_tokens(gs.family, min_pixels=b.min_pixels, max_pixels=b.max_pixels,
                            detail=detail or gs.detail, tokens_per_image=gs.tokens_per_image)
    if top is None:
        top = gs.remote_image_tokens
    if top is None:
        raise ImageError.of(
            "invalid_url", where,
            f"remote image URLs cannot be counted for family {gs.family} (no size ceiling); send the image "
            "inline as a data: URL, or set remote_image_tokens in the group's vision config",
        )
    return top


def tokens_of(c: Counted, gs: GroupVisionSettings, b: PixelBounds) -> int:
    """What one counted image becomes within ``b``: its size's count, or the ceiling when unmeasured."""
    if c.width is None or c.height is None:
        return ceiling_tokens(gs, c.detail, b, c.where)
    return image_tokens(gs, c.width, c.height, c.detail, b, c.where)


def total_at(counted: Sequence[Counted], gs: GroupVisionSettings, b: PixelBounds, max_pixels: int) -> int:
    """The request's visual tokens if the engine resized every image to at most ``max_pixels``."""
    at = PixelBounds(b.min_pixels, max_pixels)
    return sum(tokens_of(c, gs, at) for c in counted)


def fit_max_pixels(counted: Sequence[Counted], gs: GroupVisionSettings, b: PixelBounds, cap_tokens: int | None,
                   cap_pixels: int | None) -> int | None:
    """Largest max_pixels whose token total fits ``cap_tokens`` (and ≤ ``cap_pixels``), or None if none does."""
    grid = QWEN_GRIDS[gs.family]
    lo = b.min_pixels if b.min_pixels is not None else grid.min_pixels
    hi = b.max_pixels if b.max_pixels is not None else grid.max_pixels
    if cap_pixels is not None:
        hi = min(hi, cap_pixels)
    lo = max(lo, grid.factor * grid.factor)
    if hi < lo:
        return None
    if cap_tokens is None or total_at(counted, gs, b, hi) <= cap_tokens:
        return hi
    if total_at(counted, gs, b, lo) > cap_tokens:
        return None
    # Token totals grow with max_pixels: bisect for the largest value that fits.
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if total_at(counted, gs, b, mid) <= cap_tokens:
            lo = mid
        else:
            hi = mid - 1
    return lo


def recount(counted: Sequence[Counted], gs: GroupVisionSettings, b: PixelBounds, max_pixels: int) -> int:
    """Count every image again as the engine will see it at ``max_pixels``; the new total."""
    at = PixelBounds(b.min_pixels, max_pixels)
    for c in counted:
        c.tokens = tokens_of(c, gs, at)
    return sum(c.tokens for c in counted)
