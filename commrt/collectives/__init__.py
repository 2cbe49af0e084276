"""The public collectives, built on schedules.

:mod:`commrt.collectives.core` (``all_reduce``, ``broadcast``: the one
entrance every collective call goes through), :mod:`commrt.collectives.shards`
(``reduce_scatter``, ``all_gather``), :mod:`commrt.collectives.rows` (every
rank's small row of numbers, for agreeing), :mod:`commrt.collectives.consensus`
(``average_parameters``), :mod:`commrt.collectives.coalesce` (many tensors
through one flat buffer) and :mod:`commrt.collectives.memo` (the settled-call
memo).
"""
