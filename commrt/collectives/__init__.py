"""The public collectives, built on schedules.

:mod:`commrt.collectives.core` (``all_reduce``, the one all-reduce path,
which the torch.distributed backend takes too, and ``broadcast``),
:mod:`commrt.collectives.reductions` (the ops an all-reduce takes and the
dtypes each reduces),
:mod:`commrt.collectives.shards` (``reduce_scatter``, ``all_gather``),
:mod:`commrt.collectives.consensus` (``average_parameters``),
:mod:`commrt.collectives.coalesce` (many tensors through one flat buffer) and
:mod:`commrt.collectives.memo` (the settled-call memo).

One path per collective
-----------------------
Every collective call, whoever makes it (``commrt.all_reduce`` at any op, the
torch.distributed ops, the row gather, broadcast, the shards, DDP's gossip
hook), enters through :meth:`commrt.Communicator.admit_collective` and runs its
schedules through :meth:`commrt.Communicator.run_schedule`, the only caller of
the executor's ``run`` (GradientSync's buckets too, from its progress thread).
A repeated call is fast because of the caches below, each inside that path,
not because of a way around it.

Caches
------
What is remembered between calls, all of it per communicator unless named
otherwise. Each entry says what it is keyed on, what it holds, when it is
dropped, and its bound.

``comm.slots.agreed_calls`` (:mod:`commrt.collectives.core`)
    Keyed on a call signature: kind, shape, dtype, op (an all-reduce's sum or avg:
    whether it averages) and algorithm name (a broadcast's root; a row gather's
    length). Holds the set of signatures all
    ranks agreed on, so a repeat skips the cross-rank call check. Dropped with
    the communicator; every call checks under ``COMMRT_DEBUG``. Unbounded: one
    small tuple per distinct signature the program uses.
``comm.executor.settled`` (:class:`~commrt.schedule.caches.SettledCalls`)
    The memo's one owner, which every caller asks (:mod:`commrt.collectives.memo`).
    Keyed on (resolved algorithm, parsed op, dtype, shape). Holds
    a :class:`~commrt.collectives.memo.SettledCall`: the schedule its
    algorithm keeps for that signature, how to reduce, and the algorithm's
    counter. Dropped when the counter wants the schedule timed again (``auto``'s
    rechecks), and all at once when a new signature would pass
    :data:`~commrt.schedule.caches.MAX_SETTLED` (256); never made under
    ``COMMRT_DEBUG``, and all forgotten when it is turned on. With them, the
    signatures whose learning algorithm settled on their last call, so that
    the next call keeps the schedule its own ``select`` gave (dropped by that
    call; at most one per signature).
``Executor.last`` (:mod:`commrt.schedule.executor`, ``comm.executor``)
    The one memo of the last call. Keyed on the schedule object, buffer
    address, element count, dtype, transport, piece size and reduction. Holds
    the cached binding run last (a ``Run`` record) and the call that ran it (a
    settled all-reduce's SettledCall), so a loop on one buffer skips the
    binding cache's key and lookup, and a settled all-reduce repeated on the
    same tensor with the same algorithm and op objects, dtype and shape finds
    both by identity tests alone. Replaced by each run on another cached
    binding; dropped whenever a dead owner's binding is freed, whenever a
    binding is made, and by ``release()``; its call is dropped with its table
    entry. One.
``Executor`` bindings (``comm.executor``)
    Keyed on (schedule id, buffer address, element count, dtype, piece
    elements, transport id, reduction). Holds a ``Bound``: the buffer's views
    per step and the transport's prepared requests (MPI persistent requests).
    Its views keep the buffer's memory alive, which is what makes the address
    in its key safe to reuse it by; so only a call that names the tensor
    bounding the buffer's life (``owner``: a GradientSync bucket, the tensor
    of an all-reduce) is cached. Dropped when that owner is collected (at the
    executor's next run), by ``release()``, or as the least recently used
    past 32. A call without an owner (the shards' fresh work buffers, a
    contiguous copy of the caller's tensor) is bound for its run alone and
    freed at its end: no binding outlives a buffer its caller dropped.
``Executor`` plans (``comm.executor``)
    Keyed on (schedule id, rank, element count, piece elements). Holds the
    schedule compiled for this rank and buffer length. Dropped as the least
    recently used past 64.
``Executor`` scratch (``comm.executor``)
    One receive buffer per (dtype, device), grown to the largest need and kept;
    dropped by ``release()``. Its bytes are ``Executor.scratch_bytes()``.
``comm.slots.auto_choices``, ``auto_tuning``, ``auto_tried`` (:mod:`commrt.algorithms.auto`)
    Keyed on (Auto instance, world size, bytes) (``auto_tried``: and a
    candidate's label). Hold ``auto``'s priced choice, what it learned from
    its timings, and the candidates it tried, identical on every rank. Dropped
    with the communicator. Unbounded: one entry per size ``auto`` was asked
    about (and per candidate tried).
``comm.slots.auto_memory``, ``auto_remembered`` (:mod:`commrt.tuning.memory`)
    Earlier jobs' verdicts by size class, as rank 0 read them from its file at
    ``auto``'s first call (one per communicator), and the sizes that started from
    one (the model's choice for each). Dropped with the communicator; the file
    itself is bounded (512 entries, 7 days).
``comm.slots.row_tables`` (:mod:`commrt.runtime.rows`)
    Keyed on (row length, dtype). Holds the p-row table a row gather reduces in
    (``auto``'s timings, the probe's, consensus reports), so that its executor
    binding is made once. Zeroed at each gather; dropped with the communicator,
    the least recently made past 8.
``comm.slots.probe``, ``comm.slots.node_layout`` (:mod:`commrt.tuning`)
    The measured network model and the agreed ranks per node, made by the first
    collective that asks; ``probe(comm, force=True)`` measures again. One each.
Schedules (:mod:`commrt.algorithms`, per process)
    Each algorithm's ``schedule()`` is an ``lru_cache`` keyed on (algorithm
    instance, world size, options), 256 entries each, and
    :func:`commrt.algorithms.resolve` keeps a name's instance (64 names), so a
    repeated call meets the same schedule object, which the executor's plan
    and binding caches key on.
"""
