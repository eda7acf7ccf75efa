"""The prefix cache's index, compiled: which cached block holds a key (``sim.kernels.prefix``, whose docstring says
what is cached). An open-addressing table over the keys of blocks of shared segments, a request's own blocks found
through the request (``own``), and each key's further cached copies in the order they were cached (``DUP``), the first
of which a lookup finds."""

from __future__ import annotations

from sim.kernels.jit import kernel
from sim.kernels.kvstate import DUP, EMPTY, FREE_ENTRY, KEY, MASK, NEXT, OWNER, PREV, REFS

# ---- the index: key -> entry (open addressing, linear probing, deletion by backward shift) ------------------------
# Slot i is table[2i] (the key, or EMPTY) and table[2i + 1] (its entry): a probe reads one line. Keys are hashes
# already: a key's home slot is its low bits.


@kernel
def slot(kv, key: int) -> int:  # noqa: ANN001
    """The slot of ``key`` in the index, or the empty slot where it would go."""
    table, mask = kv[2], kv[1][MASK]
    i = key & mask
    while table[2 * i] != EMPTY and table[2 * i] != key:
        i = (i + 1) & mask
    return i


@kernel
def find(kv, key: int) -> int:  # noqa: ANN001
    """The entry of the cached block with ``key``, or EMPTY."""
    i = slot(kv, key)
    return kv[2][2 * i + 1] if kv[2][2 * i] == key else EMPTY


@kernel
def insert(kv, i: int, key: int) -> int:  # noqa: ANN001
    """A new entry for ``key`` at its empty slot ``i`` (``slot``), unreferenced and on no list; returns it."""
    ks, table, entries = kv[1], kv[2], kv[3]
    e = ks[FREE_ENTRY]
    ks[FREE_ENTRY] = entries[NEXT, e]
    entries[KEY, e] = key
    entries[REFS, e] = 0
    entries[PREV, e] = entries[NEXT, e] = entries[OWNER, e] = entries[DUP, e] = EMPTY
    table[2 * i] = key
    table[2 * i + 1] = e
    return e


@kernel
def insert_own(kv, pos: int, key: int) -> int:  # noqa: ANN001
    """A new entry for the copy of a request's own block ``key`` at ``pos`` (its ``REFS_AT + j``), outside the index,
    unreferenced and on no list; returns it."""
    ks, entries = kv[1], kv[3]
    e = ks[FREE_ENTRY]
    ks[FREE_ENTRY] = entries[NEXT, e]
    entries[KEY, e] = key
    entries[REFS, e] = 0
    entries[PREV, e] = entries[NEXT, e] = entries[DUP, e] = EMPTY
    entries[OWNER, e] = pos
    kv[9][pos] = e
    return e


@kernel
def insert_copy(kv, first: int, key: int, owner: int) -> int:  # noqa: ANN001
    """A new entry for a further cached copy of ``key`` (``first``: its first copy, which a lookup keeps finding),
    last of its copies, unreferenced and on no list; ``owner`` as ``first``'s (EMPTY: in the index). Returns it."""
    ks, entries = kv[1], kv[3]
    e = ks[FREE_ENTRY]
    ks[FREE_ENTRY] = entries[NEXT, e]
    entries[KEY, e] = key
    entries[REFS, e] = 0
    entries[PREV, e] = entries[NEXT, e] = entries[DUP, e] = EMPTY
    entries[OWNER, e] = owner
    last = first
    while entries[DUP, last] != EMPTY:
        last = entries[DUP, last]
    entries[DUP, last] = e
    return e


@kernel
def _unlink_copy(kv, first: int, e: int) -> None:  # noqa: ANN001
    """Take ``e`` out of the copies that follow ``first`` (``e`` is not ``first``)."""
    entries = kv[3]
    before = first
    while entries[DUP, before] != e:
        before = entries[DUP, before]
    entries[DUP, before] = entries[DUP, e]


@kernel
def _free_entry(kv, e: int) -> None:  # noqa: ANN001
    ks, entries = kv[1], kv[3]
    entries[KEY, e] = entries[OWNER, e] = entries[DUP, e] = EMPTY
    entries[NEXT, e] = ks[FREE_ENTRY]
    ks[FREE_ENTRY] = e


@kernel
def own_copy(kv, pos: int, key: int) -> int:  # noqa: ANN001
    """The entry of the cached copy of the own block ``key`` at ``pos``, or EMPTY (none, or evicted)."""
    e = kv[9][pos]
    if e == EMPTY:
        return EMPTY
    entries = kv[3]
    return e if entries[KEY, e] == key and entries[OWNER, e] == pos else EMPTY


@kernel
def remove(kv, e: int) -> None:  # noqa: ANN001
    """Forget entry ``e`` (its block is evicted): out of its key's copies, the next copy (if any) taking its place in
    the index or as its request's own copy, the key out of the index with the last copy; back on the free list."""
    ks, table, entries = kv[1], kv[2], kv[3]
    owner = entries[OWNER, e]
    if owner != EMPTY:
        first = kv[9][owner]
        if first == e:
            kv[9][owner] = entries[DUP, e]
        else:
            _unlink_copy(kv, first, e)
        _free_entry(kv, e)
        return
    mask = ks[MASK]
    i = slot(kv, entries[KEY, e])
    first = table[2 * i + 1]
    if first != e or entries[DUP, e] != EMPTY:  # a later copy, or the first of several
        if first == e:
            table[2 * i + 1] = entries[DUP, e]
        else:
            _unlink_copy(kv, first, e)
        _free_entry(kv, e)
        return
    j = i
    while True:  # move back every entry of the run after i that may live at i
        j = (j + 1) & mask
        if table[2 * j] == EMPTY:
            break
        home = table[2 * j] & mask
        if (j > i and (home <= i or home > j)) or (j < i and home <= i and home > j):
            table[2 * i] = table[2 * j]
            table[2 * i + 1] = table[2 * j + 1]
            i = j
    table[2 * i] = EMPTY
    _free_entry(kv, e)
