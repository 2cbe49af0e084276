"""Transports: nccl (cupy.cuda.nccl), mpi (mpi4py), gloo (torch.distributed)."""
