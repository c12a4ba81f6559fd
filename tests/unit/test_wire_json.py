"""The wire's JSON rules: orjson reads and writes, and what a request sees is what the
stdlib decoder gas used before gave, except where that was lax (a body that is not UTF-8,
a lone surrogate) and where the nesting limit now lies.

`stdlib_decode` below is that earlier decoder, kept as the reference: random documents,
valid and broken, must be read the same or refused with the same message.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gas.serving import wire
from gas.serving.wire import BadRequest

POD = {"metadata": {"name": "p", "namespace": "default", "uid": "u1"}, "spec": {}}


def stdlib_decode(body: bytes) -> dict[str, Any]:
    """How gas decoded a body with the stdlib, before orjson."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not valid JSON")

    def finite(text: str) -> float:
        number = float(text)
        if math.isinf(number):
            raise ValueError(f"number {text[:40]} is out of range")
        return number

    try:
        value = json.loads(body, parse_constant=refuse, parse_float=finite)
    except RecursionError:
        raise BadRequest("JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadRequest("body must be a JSON object")
    return wire._fold(value)


def outcome(decode: Any, body: bytes) -> tuple[str, str]:
    """("ok", a type-exact rendering of the value) or ("refused", the message)."""
    try:
        return "ok", repr(decode(body))
    except BadRequest as exc:
        return "refused", str(exc)


def refusal(body: bytes) -> str:
    with pytest.raises(BadRequest) as caught:
        wire.decode_object(body)
    return str(caught.value)


# ------------------------------------------------------------------ the same as before

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**30])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([1e308, -1e308, 5e-324, 1e18, -1e18, 1.5e19, 0.0, -0.0])
    | st.text(max_size=12)
    | st.sampled_from(["", "é", "名前", "\x00", "\u2028", "😀", "a\\b", '"'])
)
KEYS = st.sampled_from(["Pod", "pod", "NodeNames", "x", "é"])
documents = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(
            st.sampled_from(["Pod", "pod", "NodeNames", "x", "é"]) | st.text(max_size=6),
            inner,
            max_size=5,
        )
    ),
    max_leaves=30,
)
EXAMPLES = settings(
    max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), database=None
)


@EXAMPLES
@given(document=documents, ascii_only=st.booleans(), spaced=st.booleans())
def test_documents_read_as_the_stdlib_read_them(
    document: Any, ascii_only: bool, spaced: bool
) -> None:
    separators = (", ", ": ") if spaced else (",", ":")
    body = json.dumps(document, ensure_ascii=ascii_only, separators=separators).encode()
    assert outcome(wire.decode_object, body) == outcome(stdlib_decode, body)


@EXAMPLES
@given(
    document=documents,
    cut=st.integers(min_value=0, max_value=400),
    insert=st.sampled_from(
        [b"", b",", b"]", b"}", b"NaN", b"-Infinity", b"1e400", b"\xff", b"\x00", b"\\", b'"']
    ),
)
def test_broken_documents_are_refused_with_the_stdlib_message(
    document: Any, cut: int, insert: bytes
) -> None:
    body = json.dumps(document, ensure_ascii=False).encode()
    body = body[:cut] + insert + body[cut:]
    new, old = outcome(wire.decode_object, body), outcome(stdlib_decode, body)
    if body[:1] == b"\x00" or body[1:2] == b"\x00":
        # The stdlib decoder took these for UTF-16 or UTF-32: now they are read as UTF-8.
        assert new[0] == "refused"
        return
    assert new == old


@pytest.mark.parametrize(
    "body",
    [
        b'{"Pod": {}, "NodeNames": [NaN]}',
        b'{"Pod": Infinity}',
        b'{"Pod": -Infinity}',
        b'{"Pod": {"x": 1e400}}',
        b'{"Pod": {"x": -1E400}}',
        b'{"Pod": {"x": ' + b"9" * 5000 + b"}}",
        b'{"Pod": {"x": ' + b"9" * 400 + b".5}}",
        b"",
        b"   ",
        b"[]",
        b"1e400",
        b'{"Pod": {}} x',
        b"{Pod: 1}",
        b'{"a": "\x01"}',
        b'{"a": "\xff\xfe"}',
        b'{"a": "\xe9"}',
    ],
)
def test_refusals_keep_their_messages(body: bytes) -> None:
    assert outcome(wire.decode_object, body) == outcome(stdlib_decode, body)
    assert outcome(wire.decode_object, body)[0] == "refused"


def test_non_finite_and_out_of_range_numbers_name_the_problem() -> None:
    assert refusal(b'{"x": NaN}') == "body is not valid JSON: NaN is not valid JSON"
    assert refusal(b'{"x": -1e400}') == "body is not valid JSON: number -1e400 is out of range"
    assert "4300 digits" in refusal(b'{"x": ' + b"1" * 5000 + b"}")


# ------------------------------------------------------------------ where orjson differs


@pytest.mark.parametrize(
    "number", [2**64, 2**64 + 1, -(2**63) - 1, 10**30, -(10**40), 10**400, 2**64 - 1]
)
def test_integers_beyond_64_bits_stay_exact(number: int) -> None:
    """orjson reads them as floats (or refuses them beyond a double's range); gas reads
    them exactly, as before: a node returned as it was sent keeps its digits."""
    body = json.dumps({"Pod": {"spec": {"priority": number}}, "Nodes": {"x": [number]}}).encode()
    args = wire.decode_object(body)
    assert args["pod"]["spec"]["priority"] == number
    assert type(args["pod"]["spec"]["priority"]) is int
    assert args["nodes"] == {"x": [number]}
    assert wire.encode(args["nodes"]) == json.dumps({"x": [number]}, separators=(",", ":")).encode()


def test_large_floats_are_not_mistaken_for_integers() -> None:
    args = wire.decode_object(b'{"a": 1.5e19, "b": -2e30, "c": 18446744073709551615}')
    assert args == {"a": 1.5e19, "b": -2e30, "c": 2**64 - 1}
    assert [type(v) for v in args.values()] == [float, float, int]


@pytest.mark.parametrize(
    "body",
    [
        b'{"Pod": {"metadata": {"name": "\\ud800"}}, "NodeNames": []}',
        b'{"Pod": {}, "NodeNames": ["\\udfff"]}',
        b'{"Pod": {}, "NodeNames": ["\\udc00\\ud800"]}',
        b'{"\\ud83d": 1}',
        # A long integer sends the body to the stdlib: surrogates are still refused.
        b'{"Pod": {"x": ' + b"9" * 400 + b'}, "NodeNames": ["\\ud800"]}',
    ],
)
def test_lone_surrogate_escapes_are_refused(body: bytes) -> None:
    """The stdlib read them (a name gas could not write back as UTF-8, and that Go reads
    as U+FFFD): refused now."""
    assert outcome(stdlib_decode, body)[0] == "ok"
    assert refusal(body) == "body is not valid JSON: a string holds a lone UTF-16 surrogate"


def test_surrogate_pairs_and_escaped_backslashes_are_not_lone_surrogates() -> None:
    args = wire.decode_object(
        b'{"a": "\\ud83d\\ude00", "b": "\\\\ud800", "c": ' + b"9" * 400 + b"}"
    )
    assert args["a"] == "😀"
    assert args["b"] == "\\ud800"


@pytest.mark.parametrize(
    "body",
    [
        json.dumps({"Pod": POD, "NodeNames": ["a"]}).encode("utf-16"),
        json.dumps({"Pod": POD, "NodeNames": ["a"]}).encode("utf-16-le"),
        json.dumps({"Pod": POD, "NodeNames": ["a"]}).encode("utf-32"),
        json.dumps({"Pod": POD, "NodeNames": ["a"]}).encode("utf-32-be"),
        # A surrogate encoded as if it were a character (CESU-8).
        b'{"Pod": {}, "NodeNames": ["\xed\xa0\x80"]}',
    ],
)
def test_bodies_that_are_not_utf8_are_refused(body: bytes) -> None:
    """The stdlib guessed UTF-16 and UTF-32 from the first bytes, and let encoded
    surrogates through: JSON on the wire is UTF-8 (RFC 8259), and Go sends nothing else."""
    assert outcome(stdlib_decode, body)[0] == "ok"
    assert refusal(body).startswith("body is not valid JSON: ")


def test_a_utf8_byte_order_mark_is_ignored_as_before() -> None:
    body = b"\xef\xbb\xbf" + json.dumps({"Pod": POD, "NodeNames": ["a", "b"]}).encode()
    assert wire.decode_object(body) == stdlib_decode(body)
    assert wire.decode_extender_args(body).names == ["a", "b"]


@pytest.mark.parametrize("depth", [1025, 5000, 100_000])
def test_nesting_deeper_than_1024_levels_is_refused(depth: int) -> None:
    """orjson's limit, whatever the call stack; the stdlib's was about 1000 levels less
    the depth of the stack it was called from."""
    body = b'{"Pod":' + b"[" * depth + b"]" * depth + b"}"
    assert refusal(body) == "JSON nested too deeply"


def test_nesting_up_to_1024_levels_is_read() -> None:
    body = b'{"Pod":' + b"[" * 1023 + b"]" * 1023 + b"}"
    nested = wire.decode_object(body)["pod"]
    for _ in range(1022):
        (nested,) = nested
    assert nested == []


def test_duplicate_keys_keep_the_last_and_the_exact_case_wins() -> None:
    for body in (
        b'{"pod": 1, "Pod": {"a": 1, "a": 2}, "NodeNames": ["x"], "NodeNames": 7}',
        b'{"Pod": {"a": 1, "a": 2}, "pod": 1, "nodeNames": ["x"], "NodeNames": 7}',
    ):
        assert wire.decode_object(body) == {"pod": {"a": 2}, "nodenames": 7}
        assert wire.decode_object(body) == stdlib_decode(body)


# ------------------------------------------------------------------ NodeNames


def test_node_names_are_checked_and_deduplicated_in_order() -> None:
    names = [f"node-{i}" for i in range(100)]
    body = json.dumps({"Pod": POD, "NodeNames": names + names[:10]}).encode()
    assert wire.decode_extender_args(body).names == names
    for bad in ([*names, 1], [*names, None], [*names, ["x"]], "node-1", {"a": 1}):
        body = json.dumps({"Pod": POD, "NodeNames": bad}).encode()
        with pytest.raises(BadRequest, match=r"NodeNames must be a list of strings"):
            wire.decode_extender_args(body)


# ------------------------------------------------------------------ replies


def test_replies_are_compact_utf8_json() -> None:
    body = wire.filter_result(["a", "名"], {"b": "gpu: no card"}, {}, None, "")
    encoded = wire.encode(body)
    assert isinstance(encoded, bytes)
    assert encoded.decode("utf-8") == json.dumps(body, separators=(",", ":"), ensure_ascii=False)


def test_replies_beyond_orjson_are_written_by_the_stdlib() -> None:
    """orjson writes at most 254 levels: a Node object returned as sent may hold more."""
    deep: Any = []
    for _ in range(600):
        deep = [deep]
    node = {"metadata": {"name": "n"}, "x": deep}
    body = wire.filter_result(["n"], {}, {}, [node], "")
    assert json.loads(wire.encode(body)) == body


def test_a_reply_too_deep_to_write_is_a_bad_request() -> None:
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(BadRequest, match="nested too deeply"):
        wire.encode({"Nodes": {"items": [{"x": deep}]}})


# ------------------------------------------------------------------ the decision log

texts = st.text(max_size=12) | st.sampled_from(
    ["", "é", "名前", "\x00", "\x1f", "\x7f", "\u2028", "😀", "a\\b", '"', "/", "\t\n"]
)


@EXAMPLES
@given(
    uid=documents,
    names=st.lists(texts, max_size=4),
    reasons=st.dictionaries(texts, st.integers(), max_size=3),
    number=st.integers() | st.sampled_from([2**64, -(2**63) - 1, 10**30]),
)
def test_decision_lines_are_written_as_the_stdlib_wrote_them(
    uid: Any, names: list[str], reasons: dict[str, int], number: int
) -> None:
    """Whatever a request put in the pod's uid, names and reasons: the same line as
    `json.dumps` with compact separators (orjson or not)."""
    for record in (
        {"decision": "filter", "pod": "/".join(names), "uid": uid, "nodes": number},
        {"decision": "filter", "uid": uid, "reasons": reasons, "passed_nodes": names},
        {"decision": "bind", "pod": "ns/p", "uid": "u", "cards": "card0", "scores": reasons},
    ):
        assert wire.compact(record) == json.dumps(record, separators=(",", ":"))


def test_a_decision_too_deep_to_write_raises_recursion_error() -> None:
    deep: Any = "u"
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(RecursionError):
        wire.compact({"decision": "filter", "uid": deep})
    shallow: Any = "u"
    for _ in range(300):  # beyond orjson, within the stdlib
        shallow = {"x": shallow}
    record = {"decision": "filter", "pod": "a/b", "uid": "u", "extra": shallow}
    assert wire.compact(record) == json.dumps(record, separators=(",", ":"))


def test_a_host_priority_list_names_only_the_nodes_scored_other_than_zero() -> None:
    # kube-scheduler adds nothing for a node left out, as for a node scored 0.
    scores = {"a": 0, "b": 7, "c": 0, "d": 10, "e": -1}
    assert wire.encode(wire.host_priority_list(scores)) == (
        b'[{"Host":"b","Score":7},{"Host":"d","Score":10},{"Host":"e","Score":-1}]'
    )
    assert wire.encode(wire.host_priority_list(dict.fromkeys("abc", 0))) == b"[]"
