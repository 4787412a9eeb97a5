"""The short way through a batched decode step (kvbench.models.batch_step) for rows that all pack
every token as it comes into room kept for it (kvbench.methods.core.codec_cache.CodecCache with
window 0, reserved by the server) and are read by the CPU batched kernel: one encode for every
row's token, written where each row's block ends by one call for every row
(kvbench.kernels.cpu.row_copy), and one table of addresses for the kernel, each row's packed
places kept from step to step (its rooms do not move).

It does what the general way (kvbench.models.host.append_batch, then each row's read) does to the
same bits: the same encode of the joined rows, the same bytes stored, the same segments read
(the packed tokens before the step and, for prefill_reads "exact", the step's keys and values as
the model made them; else every packed token). It only skips the per-row objects; a step any
row of which does not fit goes the general way.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kvbench.kernels.formats import is_channel
from kvbench.methods.core.codec_cache import CodecCache, encode_rows

# A room's packed places and where each head's token 0 lies, made once: its arrays stay put.
_PLACES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass
class LaneRead:
    """Every row's line of the address table and the layouts: what the kernel reads."""

    lines: list[list[int]]
    formats: Any  # kvbench.kernels.cpu.batched.RowFormats
    kv_heads: int
    step: tuple  # the step's keys and values, which the lines may point into: held till read

    def attend(self, query: torch.Tensor, scaling: float | None) -> torch.Tensor:
        from kvbench.kernels.cpu.batched import attend_lines

        return attend_lines(query, self.lines, self.formats, self.kv_heads, scaling)


def lane_step(hosts: list, keys: torch.Tensor, values: torch.Tensor) -> LaneRead | None:
    """Append row i of keys and values (rows, kv_heads, 1, head_dim) to hosts[i] and say what the
    kernel reads, when every row takes the lane; None (nothing appended) when any does not."""
    policies = [host.policy for host in hosts]
    first = policies[0]
    rooms = [policy.step_rooms() if isinstance(policy, CodecCache) else None
             for policy in policies]
    if None in rooms or keys.dtype != torch.float32 or any(
            host.pending is not None or not host.started or host.exact_step != hosts[0].exact_step
            or policy.value_skip_threshold or policy.observes_queries
            or policy.key_codec is not first.key_codec
            or policy.value_codec is not first.value_codec
            for host, policy in zip(hosts, policies)):
        return None
    found = first.fused_read()
    if found is None or found[0] != "cpu" or is_channel(found[1]) or is_channel(found[2]):
        return None
    # numba is imported only when a row is read by the CPU kernel
    from kvbench.kernels.cpu.batched import RowFormats, finished_line, raw_places, scale_dtype

    _, key_fmt, value_fmt = found
    pk, pv, value_row = encode_rows(first.key_codec, first.value_codec, [keys], [values],
                                    first.ops)
    _write_tokens(pk, pv, value_row, rooms, key_fmt, value_fmt)
    exact = hosts[0].exact_step
    lines = []
    for row, (policy, (key_room, value_room)) in enumerate(zip(policies, rooms)):
        policy.stepped()
        places = [*_places(key_room, key_fmt)[0], *_places(value_room, value_fmt)[0]]
        if exact:  # the step's own keys and values, after the tokens packed before it
            places += [*raw_places(keys, row), *raw_places(values, row)]
        lines.append(finished_line(places, key_room.tokens - exact, int(exact)))
    formats = RowFormats(key_fmt, value_fmt, scale_dtype(pk.tensors, key_fmt),
                         scale_dtype(pv.tensors, value_fmt))
    return LaneRead(lines, formats, keys.shape[1], (keys, values))


def _write_tokens(pk, pv, value_row: int, rooms: list, key_fmt, value_fmt) -> None:
    """Row i's token of the batched encodes pk and pv (values from row value_row on) written
    where rooms[i]'s key and value rooms end, in one call (the caches then count it)."""
    from kvbench.kernels.cpu.row_copy import copy_runs, head_starts, run_size, token_stride

    rows, (key_room, value_room) = len(rooms), rooms[0]
    # every (side, array), in the rooms' order of their arrays (_places' starts)
    runs = [(pk.tensors[name], 0, held) for name, held in key_room.tensors.items()]
    runs += [(pv.tensors[name], value_row, held) for name, held in value_room.tensors.items()]
    heads = key_room.tensors["codes"].shape[1]
    sources = np.concatenate([head_starts(packed, start, rows) for packed, start, _ in runs],
                             axis=1)
    sizes = np.repeat([run_size(packed) for packed, _, _ in runs], heads)
    strides = np.repeat([token_stride(held) for _, _, held in runs], heads)
    starts = np.stack([np.concatenate([_places(keys, key_fmt)[1], _places(values, value_fmt)[1]])
                       for keys, values in rooms])
    filled = np.array([keys.tokens for keys, _ in rooms], np.int64)
    targets = starts + filled[:, None] * strides[None, :]
    copy_runs(sources.ravel(), targets.ravel(), np.tile(sizes, rows).astype(np.int64))


def _places(room: Any, fmt) -> tuple[list[int], np.ndarray]:
    """A room's packed places for the kernel's line (packed_places, in `fmt`'s order) and the
    address of token 0 of every head of every array (in the room's order), made once per room:
    its arrays stay where they are."""
    places = _PLACES.get(room)
    if places is None:
        from kvbench.kernels.cpu.batched import packed_places
        from kvbench.kernels.cpu.row_copy import head_starts

        starts = np.concatenate([head_starts(t, 0, 1)[0] for t in room.tensors.values()])
        places = _PLACES[room] = (packed_places(room.tensors, fmt), starts)
    return places
