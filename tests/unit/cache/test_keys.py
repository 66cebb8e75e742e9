"""The cache key: equal requests map to one key; version, pipeline, any input byte, dtype or shape change it."""

from __future__ import annotations

import numpy as np

from services.cache.keys import KEY_BYTES, request_key, wire_digest


def inputs() -> dict[str, np.ndarray]:
    return {"x": np.arange(12, dtype=np.float32).reshape(3, 4), "ids": np.array([b"a", b"bc"], dtype=object)}


def key(**kw: object) -> bytes:
    args = {"pipeline": "fraud", "model_name": "fraud_mlp", "model_version": "1", "inputs": inputs(), **kw}
    return request_key(args["pipeline"], args["model_name"], args["model_version"], args["inputs"])  # type: ignore[arg-type]


def test_equal_requests_equal_keys_regardless_of_input_order() -> None:
    a = inputs()
    b = {"ids": a["ids"].copy(), "x": np.asfortranarray(a["x"]).copy()}
    assert key(inputs=a) == key(inputs=b)
    assert len(key()) == KEY_BYTES


def test_big_endian_input_equals_little_endian() -> None:
    a = inputs()
    b = {**a, "x": a["x"].astype(">f4")}
    assert key(inputs=a) == key(inputs=b)


def test_everything_in_the_request_changes_the_key() -> None:
    base = key()
    flipped = inputs()
    flipped["x"][2, 3] = np.nextafter(flipped["x"][2, 3], np.float32(100))
    variants = [
        key(model_version="2"),
        key(model_name="other"),
        key(pipeline="other"),
        key(inputs=flipped),
        key(inputs={**inputs(), "x": inputs()["x"].reshape(4, 3)}),
        key(inputs={**inputs(), "x": inputs()["x"].astype(np.int32)}),
        key(inputs={**inputs(), "ids": np.array([b"ab", b"c"], dtype=object)}),
        key(inputs={"y": inputs()["x"], "ids": inputs()["ids"]}),
        key(inputs={"x": inputs()["x"]}),
    ]
    assert len({base, *variants}) == len(variants) + 1


def test_the_wire_digest_tells_any_difference_of_name_type_shape_or_bytes() -> None:
    base = [("a", "FP32", (1, 1), b"\x00\x00\x80?"), ("b", "BYTES", (1, 1), b"\x01\x00\x00\x00x")]
    same = [(n, d, tuple(s), bytes(r)) for n, d, s, r in base]
    assert wire_digest(base) == wire_digest(same)
    variants = [
        [("c", *base[0][1:]), base[1]],
        [("a", "INT32", *base[0][2:]), base[1]],
        [("a", "FP32", (1,), base[0][3]), base[1]],
        [("a", "FP32", (1, 1), b"\x00\x00\x80@"), base[1]],
        [base[1], base[0]],  # the order sent
        [("a", "FP32", (1, 1), b"\x00\x00\x80?\x01"), ("b", "BYTES", (1, 1), b"\x00\x00\x00x")],  # a byte moved
    ]
    digests = {wire_digest(v) for v in variants}
    assert wire_digest(base) not in digests and len(digests) == len(variants)
