"""The store's Lua scripts as package resources, and the arguments the client encodes for them."""

from __future__ import annotations

import json
import re

import numpy as np

from services.feature.store.scripts import (
    INGEST_LUA,
    READ_CHUNK_ROWS,
    READ_LUA,
    id_table,
    ingest_args,
    read_args,
    row_args,
    source,
)
from tests.unit.feature.specs import agg_plan

KEYS = "p:agg_v1:"


def test_sources_are_the_package_files() -> None:
    assert source("ingest.lua") == INGEST_LUA and source("read.lua") == READ_LUA
    for text in (INGEST_LUA, READ_LUA):
        assert "cjson.decode(ARGV[1])" in text  # the plan travels as an argument: one script for every set
        assert not re.search(r"\$\w+|\{\{|__\w+__", text), "no template placeholders left in the Lua"


def test_ingest_args_carry_every_event_in_one_call() -> None:
    """One script call per request, so that ingest.lua can check every event before it writes any."""
    plan = agg_plan()
    n = 300
    columns = {
        "ts": np.arange(n, dtype=np.int64) + 1_700_000_000,
        "user": np.array([f"u{i % 3}" for i in range(n)], dtype=object),
        "merchant": np.array([f"m{i % 2}" for i in range(n)], dtype=object),
        "amount": np.linspace(0.1, 99.9, n),
    }
    events = json.loads(ingest_args(plan, columns, "ts"))
    assert len(events) == n
    first = events[1]
    # [t, ids in the plan's entity order (merchant, user), {field: text}]: amounts as repr, distinct values as text
    assert first == [1_700_000_001, "m1", "u1", {"amount": repr(float(columns["amount"][1])), "merchant": "m1"}]
    assert float(first[3]["amount"]) == columns["amount"][1]


def test_read_args_carry_the_plan_and_the_rows() -> None:
    plan = agg_plan()
    columns = {
        "ts": np.array([5, 17, 200], dtype=np.int64),
        "user": np.array(["ü,1", "", "u"], dtype=object),
        "merchant": np.array(["m", "商户", "m:0"], dtype=object),
    }
    ids = id_table(plan, columns, 3)
    assert ids.tolist() == [["m", "ü,1"], ["商户", ""], ["m:0", "u"]]  # merchant first: the plan's order
    [args] = read_args(plan, KEYS, columns["ts"], ids)
    assert args[0] == plan.read_plan(KEYS)
    assert args[1:] == row_args(columns["ts"], ids)
    times, lengths, blob = args[1:]
    assert times == b"5,17,200"
    assert lengths == b"1,4,6,0,3,1"  # byte lengths: ids may hold commas, non-ASCII or nothing
    assert blob == "mü,1商户m:0u".encode()
    many = np.arange(READ_CHUNK_ROWS * 2 + 1, dtype=np.int64)
    chunks = read_args(plan, KEYS, many, np.full((len(many), 2), "x", dtype=object))
    assert [c[1].count(b",") + 1 for c in chunks] == [READ_CHUNK_ROWS, READ_CHUNK_ROWS, 1]
