"""The ``commrt`` command line: tools built on the runtime, never imported by it.

* :mod:`commrt.cli.commands`: the parser and the subcommands' entry points;
* :mod:`commrt.cli.train_args`: ``commrt train``'s flags, checked before any rank starts;
* :mod:`commrt.cli.train`: ``commrt train`` (one rank of it);
* :mod:`commrt.cli.bench`: ``commrt bench`` measurements, shared with ``bench/``;
* :mod:`commrt.cli.simulate`: ``commrt simulate``;
* :mod:`commrt.cli.launch`: starting N local ranks (mpiexec or subprocesses);
* :mod:`commrt.cli.plotting`, :mod:`commrt.cli.units`: plots and size arguments.
"""

from commrt.cli.commands import main

__all__ = ["main"]
