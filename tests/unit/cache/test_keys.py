"""The cache key: equal requests map to one key; version, pipeline, any input byte, dtype or shape change it."""

from __future__ import annotations

import numpy as np

from services.cache.keys import KEY_BYTES, request_key


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
