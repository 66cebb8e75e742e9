"""The store's Lua scripts: their sources (ingest.lua, read.lua, package resources), and the arguments they take."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

import numpy as np
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from services.feature.store.plan import AggregatePlan

READ_CHUNK_ROWS = 128  # rows per read-script call: bounds how long one call holds Redis


def source(name: str) -> str:
    """The text of one of the package's Lua scripts."""
    return resources.files("services.feature.store").joinpath(name).read_text(encoding="utf-8")


INGEST_LUA = source("ingest.lua")
READ_LUA = source("read.lua")


@dataclass
class Scripts:
    """Both scripts registered on one client (EVALSHA by `.sha`; `load` puts them on the server)."""

    ingest: AsyncScript
    read: AsyncScript

    @classmethod
    def register(cls, client: aioredis.Redis) -> Scripts:
        return cls(client.register_script(INGEST_LUA), client.register_script(READ_LUA))

    async def load(self, client: aioredis.Redis) -> None:
        """SCRIPT LOAD both (so the first call is one round trip too)."""
        for script in (self.read, self.ingest):
            script.sha = await client.script_load(script.script)


def ingest_args(plan: AggregatePlan, columns: Mapping[str, np.ndarray], ts_field: str) -> str:
    """ARGV[2] of ingest.lua: every event of the request, [[t, ids..., {field: value as text}], ...].

    One script call takes them all, so that it can check every event before it writes any (ingest.lua). Numbers
    travel as Python's repr of the float (Lua's tonumber reads it back exactly); distinct values as text.
    """
    ts = columns[ts_field].astype(np.int64).tolist()
    id_columns = [[str(v) for v in columns[plan.entities[e]].tolist()] for e in plan.entity_order]
    numeric = sorted({f for g in plan.groups for f in (*g.sum_fields, *g.max_fields)})
    texts = {f: [repr(float(v)) for v in columns[f].tolist()] for f in numeric}
    for d in plan.distinct:
        texts.setdefault(d.field, [str(v) for v in columns[d.field].tolist()])
    events = [
        [t, *ids, {f: texts[f][i] for f in texts}] for i, (t, *ids) in enumerate(zip(ts, *id_columns, strict=True))
    ]
    return json.dumps(events)


def id_table(plan: AggregatePlan, columns: Mapping[str, np.ndarray], rows: int) -> np.ndarray:
    """(rows, entities) the rows' ids as str, entities in the plan's (sorted) order."""
    table = np.empty((rows, len(plan.entities)), dtype=object)
    for i, e in enumerate(plan.entity_order):
        ids = columns[plan.entities[e]]
        table[:, i] = ids if ids.dtype == object else ids.astype(str)
    return table


def row_args(ts: np.ndarray, ids: np.ndarray) -> list[bytes]:
    """ARGV[2:] of read.lua for some rows: their times, their ids' byte lengths (both ','-joined) and the ids."""
    encoded = list(map(str.encode, ids.ravel().tolist()))
    return [
        ",".join(map(str, ts.tolist())).encode(),
        ",".join(map(str, map(len, encoded))).encode(),
        b"".join(encoded),
    ]


def read_args(plan: AggregatePlan, base: str, ts: np.ndarray, ids: np.ndarray) -> list[list[bytes]]:
    """The ARGV of each read.lua call, one per chunk of READ_CHUNK_ROWS rows: the plan, then the rows."""
    read_plan = plan.read_plan(base)
    return [
        [read_plan, *row_args(ts[i : i + READ_CHUNK_ROWS], ids[i : i + READ_CHUNK_ROWS])]
        for i in range(0, len(ts), READ_CHUNK_ROWS)
    ]
