"""Losses as PyTorch's ``torch.nn.functional`` computes them (mean over the batch), written stably: a loss never
takes the log of a softmax or a sigmoid it has rounded to 0."""

from ..errors import DTypeError, ShapeError
from ..exprgraph import constructors as ct
from ..exprgraph.term import describe_operands
from ..settings import real
from .module import gathered_from_zero


def cross_entropy(logits, labels, ignore_index=None, label_smoothing=0.0):
    """The mean over every position of ``logsumexp(logits) - logits[label]``: ``logits`` ``(..., classes)``, ``labels``
    integers in ``[0, classes)`` of ``logits``' leading shape. With ``ignore_index`` (PyTorch's padding label, -100),
    positions of that label count for nothing, the mean taken over the others (0 where there are none). Any other
    label outside the classes, a negative one too, is an error on the CPU; the GPU clamps it into them. With
    ``label_smoothing`` ``e``, PyTorch's: the target is ``1 - e`` on the label and ``e`` spread over every class, so a
    position's loss is ``logsumexp(logits) - (1 - e) logits[label] - e mean(logits)``."""
    logits, labels = ct.as_term(logits), ct.as_term(labels)
    if labels.dtype.kind not in "iu":
        raise DTypeError(f"cross_entropy takes integer labels (class indices), not {labels.dtype}")
    if labels.shape != logits.shape[:-1]:
        raise ShapeError(f"cross_entropy: labels of shape {labels.shape} for logits of shape {logits.shape}: one "
                         f"label for each row of logits, shape {logits.shape[:-1]}")
    smoothing = real("cross_entropy", "label_smoothing", label_smoothing, 0, 1)
    call = f"nn.cross_entropy({describe_operands((logits, labels))})"
    counted = None if ignore_index is None else ct.not_equal(labels, ignore_index)
    places = labels if counted is None else ct.where(counted, labels, 0)
    picked = gathered_from_zero(call, ct.take_along_axis, logits, places[..., None], -1)[..., 0]
    if smoothing:
        picked = (1 - smoothing) * picked + smoothing * ct.mean(logits, axis=-1)
    losses = ct.logsumexp(logits, axis=-1) - picked
    if counted is None:
        return ct.mean(losses)
    losses = ct.where(counted, losses, 0)
    return ct.sum(losses) / ct.maximum(ct.sum(ct.cast(counted, losses.dtype)), 1)


def binary_cross_entropy_with_logits(logits, targets):
    """The mean of ``-(t log sigmoid(x) + (1 - t) log(1 - sigmoid(x)))``, as ``softplus(x) - t x``, which neither
    overflows nor rounds to log(0)."""
    _same_shape("binary_cross_entropy_with_logits", logits, targets)
    return ct.mean(ct.softplus(logits) - targets * logits)


def mse_loss(predictions, targets):
    """The mean of ``(predictions - targets)^2``."""
    _same_shape("mse_loss", predictions, targets)
    difference = predictions - targets
    return ct.mean(difference * difference)


def _same_shape(loss, a, b):
    if a.shape != b.shape:
        raise ShapeError(f"{loss}: predictions of shape {a.shape} and targets of shape {b.shape} (they must match)")
