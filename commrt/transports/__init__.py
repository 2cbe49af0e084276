"""Transports: how bytes move between ranks, each behind one interface.

* :mod:`~commrt.transports.base`: the interface every transport implements (grouped
  non-blocking point-to-point, wait, barrier);
* :mod:`~commrt.transports.traits`: what each engine is (its stream, its waits, what it
  survives), one frozen value each, read by the transports and the backend's choice alike;
* :mod:`~commrt.transports.nccl`: NCCL through ``cupy.cuda.nccl``, started by
  :mod:`~commrt.transports.nccl_bootstrap` (which GPU, how ranks learn the unique id),
  calling what :mod:`~commrt.transports.nccl_module` declares of cupy's module (which a
  CPU stand-in implements in the tests);
* :mod:`~commrt.transports.mpi`: MPI through mpi4py;
* :mod:`~commrt.transports.gloo`: torch.distributed's gloo process group;
* :mod:`~commrt.transports.shm`: shared memory between the ranks of one host, with
  its rings and message matching (:mod:`~commrt.transports.shm_rings`) and its
  making (:mod:`~commrt.transports.shm_connect`);
* :mod:`~commrt.transports.cuda_ipc`: device memory between the ranks of one host
  through CUDA IPC, made by :mod:`~commrt.transports.cuda_ipc_connect`, on the
  device of :mod:`~commrt.transports.cuda_ipc_device`, with a one-shot all-reduce
  through each rank's workspace (:mod:`~commrt.transports.cuda_ipc_direct`), summed
  on the host for small buffers (:mod:`~commrt.transports.cuda_ipc_host`);
* :mod:`~commrt.transports.counting`: a wrapper that counts the messages and bytes
  a rank sends;
* :mod:`~commrt.transports.watchdog` and :mod:`~commrt.transports.bounded`: calls
  that block in C code (NCCL's), given a timer or a bound;
* :mod:`~commrt.transports.processes`: what ``/proc`` says of a process on this host
  (a dead peer, a stopped rank);
* :mod:`~commrt.transports.stand_ins`: the engines under the NCCL and cuda_ipc
  transports, replaceable for tests (through :mod:`commrt.testing`).
"""
