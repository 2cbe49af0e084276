"""``commrt bench``: its flags and its two commands.

* ``commrt bench allreduce`` (every rank): all-reduce per algorithm next to
  what a user would otherwise run (gloo's all-reduce, and MPI_Allreduce where
  mpi4py is installed: the ranks start under mpiexec then), an nccl-tests style
  table, optional plot, CSV and JSON;
* ``commrt bench kernels`` (one process): pack/unpack GB/s.

The measurements, tables and plots are :mod:`commrt.cli.bench`'s, which
``bench/`` shares.
"""

from __future__ import annotations

import sys

from commrt.cli.flags import dtype_flag, file_flags, plot_flag, rank_flags
from commrt.cli.units import cuda_available, kernel_device, positive_int, size_list, torch_dtype


def register(sub) -> None:
    """Add ``bench`` (with ``allreduce`` and ``kernels``) to ``commrt``'s sub-commands."""
    bench = sub.add_parser("bench", help="measure collectives")
    bsub = bench.add_subparsers(dest="what")
    ar = bsub.add_parser("allreduce", help="all-reduce: commrt algorithms vs gloo's and MPI's")
    rank_flags(ar)
    ar.add_argument(
        "--algorithms",
        default="auto,ring,halving_doubling,recursive_doubling,torus2d",
        help="comma-separated algorithm names "
        "(default auto,ring,halving_doubling,recursive_doubling,torus2d)",
    )
    ar.add_argument(
        "--sizes",
        type=size_list,
        default=None,
        help="comma-separated sizes (default 8,4K,64K,1M,16M: seconds)",
    )
    dtype_flag(ar, "--dtype", "element type")
    ar.add_argument(
        "--repeats",
        type=positive_int,
        default=3,
        help="timed runs per point, in rounds alternated across the rows of a size; the median is shown (default: %(default)s)",
    )
    ar.add_argument(
        "--iters",
        type=positive_int,
        default=None,
        help="calls per timed run (default: from the size, 3..50, ~16 MB moved per run)",
    )
    plot_flag(ar, "busbw vs size")
    file_flags(ar, "every point with its element count")
    ar.set_defaults(run=cmd_bench_allreduce, parser=ar, mpi_anchor=True)
    kb = bsub.add_parser(
        "kernels", help="pack/unpack GB/s vs a plain copy and cat+scale (one process)"
    )
    kb.add_argument(
        "--sizes", type=size_list, default=None, help="bucket sizes (default 1M,4M,16M,64M,100M)"
    )
    dtype_flag(kb, "--wire", "bucket (wire) dtype")
    kb.add_argument("--device", type=kernel_device, help="cpu or cuda (default: cuda if available)")
    plot_flag(kb, "GB/s vs size")
    file_flags(kb, "every point with its element count, bytes moved and time")
    kb.set_defaults(run=cmd_bench_kernels, single_process=True, parser=kb)
    bench.set_defaults(parser=bench, subcommands=tuple(bsub.choices))


def mpi_anchor(backend) -> bool:
    """Whether ``commrt bench allreduce`` on ``backend`` (a
    :class:`~commrt.runtime.choice.Backend`) starts its ranks under mpiexec, so that its
    table has MPI_Allreduce beside gloo's: on CPU transports, where mpiexec and mpi4py are
    installed."""
    import importlib.util

    from commrt.cli.launch import mpiexec_path

    found = mpiexec_path() is not None and importlib.util.find_spec("mpi4py") is not None
    return not backend.moves_cuda and found


def cmd_bench_kernels(args) -> int:
    from commrt.cli import bench

    device = args.device or ("cuda" if cuda_available() else "cpu")
    if device.startswith("cuda") and not cuda_available():
        print(
            "commrt bench kernels: --device cuda needs a CUDA GPU; none is available here",
            file=sys.stderr,
        )
        return 2
    sizes = args.sizes or [1 << 20, 4 << 20, 16 << 20, 64 << 20, 100 << 20]
    title = (
        f"commrt bench kernels · {device} · fp32 → {args.wire} bucket · "
        f"{'Triton' if device != 'cpu' else 'torch reference'}"
    )
    rows = bench.measure_kernels(sizes, torch_dtype(args.wire), device)
    print(bench.kernel_table(rows, title))
    for path in bench.write_records(bench.kernel_records(rows), args.csv, args.json):
        print(f"# wrote {path}")
    if args.plot:
        print(f"# plot written to {bench.plot_kernels(rows, args.plot, title)}")
    return 0


def cmd_bench_allreduce(args) -> int:
    """One rank of ``commrt bench allreduce``; rank 0 prints the table row by row."""
    import commrt
    from commrt.cli import bench

    comm = commrt.init(args.backend, timeout=args.timeout)
    algorithms = [a for a in args.algorithms.split(",") if a]
    title = (
        f"commrt bench allreduce · backend {comm.backend.value} · {comm.world_size} ranks · "
        f"{args.dtype} · op sum"
    )
    if comm.rank == 0:
        print(bench.table_header(algorithms, comm.world_size, title), flush=True)

    def show(row):
        if comm.rank == 0:
            print(bench.table_row(row, comm.world_size), flush=True)

    rows = bench.measure_allreduce(
        comm,
        args.sizes or bench.DEFAULT_SIZES,
        algorithms,
        torch_dtype(args.dtype),
        repeats=args.repeats,
        iters=args.iters,
        on_row=show,
    )
    if comm.rank == 0 and args.plot:
        print(f"# plot written to {bench.plot_rows(rows, comm.world_size, args.plot, title)}")
    if comm.rank == 0:
        for path in bench.write_records(bench.records(rows, comm.world_size), args.csv, args.json):
            print(f"# wrote {path}")
    comm.close()
    return 0
