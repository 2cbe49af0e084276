"""The ``commrt`` command line: tools built on the runtime, never imported by it.

* :mod:`commrt.cli.commands`: the parser, the backend, starting the ranks; ``main``;
* :mod:`commrt.cli.flags`, :mod:`commrt.cli.units`: flags several commands share, and
  the argparse types (sizes, files);
* :mod:`commrt.cli.extras`: the optional packages a command needs (the ``train`` extra);
* :mod:`commrt.cli.launch`: starting N local ranks (mpiexec or subprocesses),
  :mod:`commrt.cli.tolerance`, what such a job may lose (ranks that linger,
  replacements of dead ones), and :mod:`commrt.cli.ctrl_c`, how its ranks meet a Ctrl-C;
* :mod:`commrt.cli.output`: a command whose reader leaves (``| head``) ends quietly;
* ``commrt train``: :mod:`~commrt.cli.train_args` (its flags, checked before any rank
  starts), :mod:`~commrt.cli.train` (one rank of it), :mod:`~commrt.cli.train_data`,
  :mod:`~commrt.cli.train_faults`, :mod:`~commrt.cli.train_output`,
  :mod:`~commrt.cli.train_options` (its checked options: no torch, for the launcher),
  :mod:`~commrt.cli.startup` (its start-up's phases);
* ``commrt bench``: :mod:`~commrt.cli.bench_command`; its measurements,
  :mod:`commrt.cli.bench`, are shared with ``bench/``;
* ``commrt simulate``: :mod:`~commrt.cli.simulate`, its sections and figures
  (``simulate_sections``, ``simulate_plots``), its control-plane section
  (``simulate_control``) and its gossip-deadline section (``simulate_deadline``);
* ``commrt trace merge``: :mod:`~commrt.cli.traces`; ``commrt probe``: :mod:`~commrt.cli.probe`;
* ``commrt diagnose``: :mod:`~commrt.cli.diagnose` (the stall verdict again, from the
  files a stalled job left);
* :mod:`commrt.cli.plotting`: the plots' shared steps.
"""

from commrt.cli.commands import main

__all__ = ["main"]
