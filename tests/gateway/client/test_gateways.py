"""The SDK's list of gateways (:mod:`gateway.client.gateways`), pure: URLs parsed, the deadline, round robin
with a backoff, each tried once past the deadline, only what may be repeated sent again, the idempotency key
each attempt repeats."""

from __future__ import annotations

import httpx
import pytest

from core.errors import ConfigError
from gateway import Client
from gateway.client import ApiError, resolve
from gateway.client.feed import follow_feed
from gateway.client.gateways import Gateways, parse_urls, replayable, retry_seconds

SPEC = {"kind": "process", "command": ["true"]}


def test_urls_are_parsed_from_a_comma_separated_list() -> None:
    assert parse_urls("http://a:8080") == ("http://a:8080",)
    assert parse_urls(" http://a:8080/ , https://b ,, http://a:8080,") == ("http://a:8080", "https://b")
    assert parse_urls(["http://a", "http://b,http://c"]) == ("http://a", "http://b", "http://c")
    assert parse_urls("https://gw.example/resontech/") == ("https://gw.example/resontech",)


NOT_HTTP = "is not an http:// or https:// URL with a host"


NONE_GIVEN = "no gateway URL given: set RESONTECH_GATEWAY_URL, e.g. http://127.0.0.1:8080"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", NONE_GIVEN),
        (" , ", NONE_GIVEN),
        (
            "http://a,127.0.0.1:8080",
            f"gateway URL '127.0.0.1:8080' {NOT_HTTP}",
        ),
        ("http://a:99999", f"gateway URL 'http://a:99999' {NOT_HTTP}"),
        ("http://", f"gateway URL 'http://' {NOT_HTTP}"),
        (
            "http://a;http://b",
            f"gateway URL 'http://a;http://b' {NOT_HTTP}",
        ),
        ("http://a/?x=1", "gateway URL 'http://a/?x=1' may not carry a query, a fragment or spaces"),
    ],
)
def test_a_bad_url_is_one_clear_line(value: str, message: str) -> None:
    with pytest.raises(ConfigError) as bad:
        parse_urls(value)
    assert bad.value.message == message and "\n" not in message


def test_the_config_takes_the_list_and_the_deadline() -> None:
    env = {"RESONTECH_GATEWAY_URL": "http://a,http://b", "RESONTECH_API_KEY": "k"}
    config = resolve(env=env)
    assert (config.urls, config.url, config.key, config.retry_s) == (
        ("http://a", "http://b"),
        "http://a,http://b",
        "k",
        30.0,
    )
    assert resolve("http://only", env={}).retry_s == 0.0  # one gateway down: said at once
    assert resolve("http://a,http://b", env={"RESONTECH_GATEWAY_RETRY_S": "5"}).retry_s == 5.0
    assert resolve("http://a", env={}, retry_s=12.5).retry_s == 12.5
    for bad in ("soon", "-1", "nan", "inf"):
        with pytest.raises(ConfigError) as refused:
            retry_seconds(None, {"RESONTECH_GATEWAY_RETRY_S": bad}, ["http://a"])
        assert (
            refused.value.message
            == f"RESONTECH_GATEWAY_RETRY_S must be a number of seconds >= 0, got {bad!r}"
        )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


REFUSED = httpx.ConnectError("[Errno 111] Connection refused")


RESET = httpx.ReadError("[Errno 104] Connection reset by peer")


def test_attempts_go_round_robin_with_a_backoff_after_each_round_until_the_deadline() -> None:
    clock = Clock()
    gateways = Gateways(["http://a", "http://b", "http://c"])
    attempts = gateways.attempts(10.0, clock)
    tried, waits = [], []
    while True:
        tried.append(attempts.url)
        wait = attempts.after_error(REFUSED, replayable=False)
        if wait is None:
            break
        waits.append(wait)
        clock.now += wait + 1.0  # each attempt takes a second
    assert tried[:7] == ["http://a", "http://b", "http://c", "http://a", "http://b", "http://c", "http://a"]
    assert waits[:6] == [0.0, 0.0, 0.1, 0.0, 0.0, 0.2]  # the next gateway at once; a pause per round
    assert clock.now >= 10.0 and len(tried) == 11


def test_every_gateway_is_tried_once_even_past_the_deadline_and_the_answering_one_is_kept() -> None:
    clock = Clock()
    gateways = Gateways(["http://a", "http://b"])
    attempts = gateways.attempts(0.0, clock)
    assert attempts.url == "http://a"
    clock.now = 30.0  # the first attempt hung until its own timeout
    assert attempts.after_error(httpx.ReadTimeout("timed out"), replayable=True) == 0.0
    assert attempts.url == "http://b"
    assert attempts.after_answer(200, replayable=True) is None
    assert gateways.current == "http://b" and gateways.rotated() == ("http://b", "http://a")
    assert gateways.attempts(0.0, clock).url == "http://b"  # the next call starts where one answered
    last = gateways.attempts(0.0, clock)
    assert last.after_answer(503, replayable=True) == 0.0  # 503: try the other...
    assert last.after_answer(503, replayable=True) is None  # ...then it is the answer (time is up)


def test_only_what_may_be_repeated_is_sent_again_after_it_may_have_arrived() -> None:
    assert replayable("GET", None) and replayable("PUT", None) and replayable("DELETE", None)
    assert replayable("POST", {"Idempotency-Key": "k"}) and not replayable("POST", None)
    gateways = Gateways(["http://a", "http://b"])
    unkeyed = gateways.attempts(30.0)
    assert unkeyed.after_error(REFUSED, replayable=False) == 0.0  # nothing was sent: any call moves on
    assert unkeyed.after_error(RESET, replayable=False) is None  # it may have arrived: not repeated
    assert "it may have been applied: check before repeating it" in unkeyed.unreachable_message(
        "POST", "/v1/tenants", RESET, False
    )
    assert unkeyed.after_answer(503, replayable=False) is None  # a 503 is its answer
    keyed = gateways.attempts(30.0)
    assert keyed.after_error(RESET, replayable=True) == 0.0
    assert keyed.after_error(httpx.ReadTimeout("timed out"), replayable=True) is not None
    for status in (502, 503, 504):
        assert keyed.after_answer(status, replayable=True) is not None
    for status in (200, 201, 202, 400, 409, 422, 500):
        assert gateways.attempts(30.0).after_answer(status, replayable=True) is None


def mocked(sent: list[tuple[str, str | None]]) -> Client:
    """A client given two gateways, answered by hand: ``a`` resets every connection; ``b`` answers
    503 the first time, then 418 (an answer that is final)."""
    seen_b = 0

    def answer(request: httpx.Request) -> httpx.Response:
        nonlocal seen_b
        sent.append((str(request.url), request.headers.get("Idempotency-Key")))
        if request.url.host == "a":
            raise httpx.ReadError("Connection reset by peer", request=request)
        seen_b += 1
        return httpx.Response(503 if seen_b == 1 else 418, json={"error": {"code": "x", "message": "m"}})

    rt = Client("http://a,http://b", "k")
    rt.http.close()
    rt.http = httpx.Client(transport=httpx.MockTransport(answer))
    return rt


def test_every_submit_and_deploy_carries_a_key_that_each_attempt_repeats() -> None:
    """The SDK names one key per logical call (the caller's, else a new one): a request described
    once is sent as often as needed with the same header."""
    sent: list[tuple[str, str | None]] = []
    with mocked(sent) as rt, pytest.raises(ApiError) as teapot:
        rt.submit_job({"name": "n", **SPEC})
    assert teapot.value.status == 418
    assert [url for url, _ in sent] == ["http://a/v1/jobs", "http://b/v1/jobs"] * 2
    keys = {key for _, key in sent}
    assert len(keys) == 1 and None not in keys
    sent.clear()
    with mocked(sent) as rt, pytest.raises(ApiError):
        rt.deploy({"name": "e", "model": "m"}, idempotency_key="mine")
    assert len(sent) == 4 and {key for _, key in sent} == {"mine"}
    sent.clear()
    with mocked(sent) as rt, pytest.raises(ApiError) as unkeyed:
        rt.issue_key("t", "viewer")  # a new API key each time it is sent: never repeated blindly
    assert len(sent) == 1 and unkeyed.value.code == "unreachable"
    assert unkeyed.value.message == (
        "cannot reach the gateway at http://a or http://b: Connection reset by peer during "
        "POST /v1/tenants/t/keys; it may have been applied: check before repeating it"
    )


async def test_the_feed_refuses_a_bad_url_list_before_connecting() -> None:
    feed = follow_feed("http://a,gopher://b", None)
    with pytest.raises(ConfigError):
        await anext(feed)
