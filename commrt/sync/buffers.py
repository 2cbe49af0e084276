"""The bucket buffers: where gradients are packed before they travel and found after.

With ``grad_views`` a bucket whose parameters share one dtype keeps each
``.grad`` as a view of one flat buffer in that dtype (DDP's
``gradient_as_bucket_view``): backward accumulates straight into it. Where
the wire dtype is the parameters', that flat buffer is what travels:
packing is an in-place scale and unpacking nothing. Where it differs (a
bf16 wire for fp32 parameters), a separate wire buffer is filled by one
flat cast (scaled in the same pass) and cast back into the flat buffer
after the exchange. Buckets that cannot be views (``grad_views`` off, or
parameters of several dtypes) pack their gradients into the wire buffer
(scale and cast in one multi-tensor kernel pass) and unpack by copy.
"""

from __future__ import annotations

import torch

from commrt.kernels import pack, unpack
from commrt.kernels.lifetime import keep_alive
from commrt.sync.buckets import Bucket


def needs_tuning(device: torch.device) -> bool:
    """Whether kernels on ``device`` compile on their first launch (CUDA: Triton)."""
    return device.type == "cuda"


class BucketBuffers:
    """Flat wire buffers of ``buckets`` and the moves between them and ``.grad``."""

    def __init__(
        self, buckets: list[Bucket], dtype: torch.dtype, device: torch.device, grad_views: bool
    ):
        self.buckets = buckets
        #: per bucket: the flat buffer in its parameters' dtype that its gradients are views
        #: of, or None (pack/unpack path)
        self.flats: list[torch.Tensor | None] = [
            torch.zeros(b.numel, dtype=b.params[0].dtype, device=device)
            if grad_views and len({p.dtype for p in b.params}) == 1
            else None
            for b in buckets
        ]
        #: per bucket: its flat wire buffer (its flat buffer itself where the dtypes agree)
        self.buffers = [
            flat
            if flat is not None and flat.dtype == dtype
            else torch.zeros(b.numel, dtype=dtype, device=device)
            for b, flat in zip(buckets, self.flats)
        ]
        #: per bucket: views of its flat buffer shaped like its parameters, or None
        self.views: list[list[torch.Tensor] | None] = [
            None
            if flat is None
            else [flat[o : o + p.numel()].view_as(p) for o, p in zip(b.offsets, b.params)]
            for b, flat in zip(buckets, self.flats)
        ]
        #: the stream the moves run on when it is not a CUDA stream (tests' fake streams); None:
        #: the current CUDA stream (see :func:`commrt.kernels.lifetime.keep_alive`)
        self.stream = None
        # zero gradients standing in for parameters unused this step (pack path), made once
        self._zeros: dict[int, torch.Tensor] = {}
        with torch.no_grad():
            for b, views in zip(buckets, self.views):
                for p, v in zip(b.params, views or ()):
                    if p.grad is not None:
                        v.copy_(p.grad)
                    p.grad = v
        if needs_tuning(device):
            self.tune()

    def tune(self) -> None:
        """Run each pack/unpack bucket's kernels once, now: on CUDA the first launch of a
        launch configuration and dtype compiles the kernel, which must not happen on the
        progress thread while the first backward runs. Unpack goes into scratch copies, so no
        gradient changes."""
        with torch.no_grad():
            for b, (bucket, flat) in enumerate(zip(self.buckets, self.flats)):
                wire = self.buffers[b]
                if wire is flat:
                    continue  # in-place scale: no kernel to tune
                grads = [flat] if flat is not None else self._grads(bucket, create=False)
                pack(grads, wire, scale=1.0)
                unpack(wire, [torch.empty_like(g) for g in grads])

    @property
    def any_views(self) -> bool:
        """Some gradients live in the buffers (``zero_grad`` must then keep them there)."""
        return any(v is not None for v in self.views)

    @property
    def extra_bytes(self) -> int:
        """Memory beyond the gradients: buffers that hold the gradients themselves are not."""
        return sum(
            b.numel() * b.element_size() for b, f in zip(self.buffers, self.flats) if b is not f
        )

    def _grads(self, bucket: Bucket, create: bool) -> list[torch.Tensor]:
        out = []
        for name, p in zip(bucket.names, bucket.params):
            g = p.grad
            if g is None:
                if create:  # unpack target for a parameter unused here: it receives the average
                    p.grad = g = torch.zeros_like(p)
                else:
                    g = self._zeros.get(id(p))
                    if g is None:
                        g = self._zeros[id(p)] = torch.zeros_like(p)
            elif not g.is_contiguous():
                raise ValueError(
                    f"commrt: .grad of parameter {name} is not contiguous; "
                    f"GradientSync packs gradients in place and needs contiguous ones"
                )
            out.append(g)
        return out

    def pack(self, b: int, scale: float) -> None:
        """Bring bucket ``b``'s gradients into its buffer, times ``scale``."""
        views = self.views[b]
        if views is None:
            pack(self._grads(self.buckets[b], create=False), self.buffers[b], scale=scale)
            return
        # Gradients normally already sit in the buffer (autograd accumulated
        # into the views, and hands back the same tensor object: one identity
        # test per parameter); bring in any that were set to None or replaced.
        copied = []
        for p, v in zip(self.buckets[b].params, views):
            g = p.grad
            if g is v:
                continue
            if g is None:
                v.zero_()
            elif g.data_ptr() != v.data_ptr():
                v.copy_(g)
                copied.append(g)
        if copied:  # read on the communication stream: the caller may drop them meanwhile
            keep_alive(copied, self.stream)
        flat, wire = self.flats[b], self.buffers[b]
        if wire is not flat:
            pack([flat], wire, scale=scale)  # one flat cast, scaled in the same pass
        elif scale != 1.0:
            wire.mul_(scale)

    def unpack(self, b: int) -> None:
        """Make bucket ``b``'s ``.grad`` hold what its buffer holds."""
        views = self.views[b]
        if views is None:
            unpack(self.buffers[b], self._grads(self.buckets[b], create=True))
            return
        flat, wire = self.flats[b], self.buffers[b]
        if wire is not flat:
            unpack(wire, [flat])  # one flat cast back, where the gradients live
        for p, v in zip(self.buckets[b].params, views):
            g = p.grad
            if g is not v and (g is None or g.data_ptr() != v.data_ptr()):
                p.grad = v
