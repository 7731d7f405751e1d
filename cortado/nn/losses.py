"""Losses as PyTorch's ``torch.nn.functional`` computes them (mean over the batch), written stably: a loss never
takes the log of a softmax or a sigmoid it has rounded to 0."""

from ..errors import CortadoError, DTypeError, ShapeError
from ..exprgraph import constructors as ct
from ..exprgraph.dtypes import is_float
from ..exprgraph.term import describe_operands
from ..settings import real
from .module import gathered_from_zero


REDUCTIONS = ("mean", "sum", "none")  # PyTorch's reduction= of a loss: the mean, the sum, or each position's loss


def cross_entropy(logits, labels, ignore_index=None, label_smoothing=0.0, reduction="mean"):
    """The mean over every position of ``logsumexp(logits) - logits[label]``: ``logits`` ``(..., classes)`` (the
    classes last, where PyTorch's ``(N, C, ...)`` has them second), ``labels``
    integers in ``[0, classes)`` of ``logits``' leading shape. With ``ignore_index`` (PyTorch's padding label, -100),
    positions of that label count for nothing, the mean taken over the others (0 where there are none). Any other
    label outside the classes, a negative one too, is an error on the CPU; the GPU clamps it into them. With
    ``label_smoothing`` ``e``, PyTorch's: the target is ``1 - e`` on the label and ``e`` spread over every class, so a
    position's loss is ``logsumexp(logits) - (1 - e) logits[label] - e mean(logits)``. ``labels`` of ``logits``'
    shape and a floating dtype are each position's probabilities of the classes instead (PyTorch's soft targets):
    a position's loss is ``-sum(p log_softmax(logits))``, ``p`` smoothed as ``(1 - e) p + e / classes``.
    ``reduction``: "mean", "sum" (over the positions counted) or "none" (each position's loss, 0 where ignored)."""
    logits, labels = ct.as_term(logits), ct.as_term(labels)
    smoothing = real("cross_entropy", "label_smoothing", label_smoothing, 0, 1)
    _check_reduction("cross_entropy", reduction)
    if is_float(labels.dtype) and labels.shape == logits.shape:
        return _reduced(_soft_target_losses(logits, labels, ignore_index, smoothing), reduction)
    if is_float(labels.dtype):
        error = DTypeError if labels.shape == logits.shape[:-1] else ShapeError
        raise error(f"cross_entropy: labels of shape {labels.shape} for logits of shape {logits.shape}: class indices "
                    f"are integer labels of shape {logits.shape[:-1]}, floating labels are probabilities of the "
                    f"classes, of the logits' shape")
    if labels.dtype.kind not in "iu":
        raise DTypeError(f"cross_entropy takes integer labels (class indices) or floating probabilities, not "
                         f"{labels.dtype}")
    if labels.shape != logits.shape[:-1]:
        pytorchs = logits.ndim > 2 and labels.shape == logits.shape[:1] + logits.shape[2:]
        raise ShapeError(f"cross_entropy: labels of shape {labels.shape} for logits of shape {logits.shape}: one "
                         f"label for each row of logits, shape {logits.shape[:-1]}"
                         + (" (probabilities of the classes, of the logits' shape, are floating)"
                            if labels.shape == logits.shape else "")
                         + (": the classes are the logits' last axis, where PyTorch's (N, C, ...) has them second "
                            "(ct.moveaxis(logits, 1, -1))" if pytorchs else ""))
    call = f"nn.cross_entropy({describe_operands((logits, labels))})"
    counted = None if ignore_index is None else ct.not_equal(labels, ignore_index)
    places = labels if counted is None else ct.where(counted, labels, 0)
    picked = gathered_from_zero(call, ct.take_along_axis, logits, places[..., None], -1)[..., 0]
    if smoothing:
        picked = (1 - smoothing) * picked + smoothing * ct.mean(logits, axis=-1)
    losses = ct.logsumexp(logits, axis=-1) - picked
    if counted is None:
        return _reduced(losses, reduction)
    losses = ct.where(counted, losses, 0)
    if reduction == "mean":
        return ct.sum(losses) / ct.maximum(ct.sum(ct.cast(counted, losses.dtype)), 1)
    return _reduced(losses, reduction)


def _soft_target_losses(logits, probabilities, ignore_index, smoothing):
    """Each position's ``-sum(p log_softmax(logits))`` for probability targets ``p`` (smoothed as PyTorch smooths
    them), log_softmax taken stably."""
    if ignore_index is not None:
        raise CortadoError("cross_entropy: ignore_index is for integer labels; with probability targets every "
                           "position counts in the mean")
    if smoothing:
        probabilities = (1 - smoothing) * probabilities + smoothing / logits.shape[-1]
    return -ct.sum(probabilities * ct.log_softmax(logits, axis=-1), axis=-1)


def binary_cross_entropy_with_logits(logits, targets, reduction="mean"):
    """The mean of ``-(t log sigmoid(x) + (1 - t) log(1 - sigmoid(x)))``, as ``t softplus(-x) + (1 - t) softplus(x)``,
    which neither overflows nor rounds to log(0), and keeps a small loss's digits: ``softplus(x) - t x`` (PyTorch's
    form, rearranged) cancels to 0 at a confident right answer (logit 20, target 1: 2.1e-9). Its gradient is
    ``sigmoid(x) - t`` with no kink. ``reduction`` as ``cross_entropy``'s."""
    _same_shape("binary_cross_entropy_with_logits", logits, targets)
    _check_reduction("binary_cross_entropy_with_logits", reduction)
    return _reduced(targets * ct.softplus(-logits) + (1 - targets) * ct.softplus(logits), reduction)


def mse_loss(predictions, targets, reduction="mean"):
    """The mean of ``(predictions - targets)^2``; ``reduction`` as ``cross_entropy``'s."""
    _same_shape("mse_loss", predictions, targets)
    _check_reduction("mse_loss", reduction)
    difference = predictions - targets
    return _reduced(difference * difference, reduction)


def _check_reduction(loss, reduction):
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise CortadoError(f"{loss}: reduction is one of {', '.join(map(repr, REDUCTIONS))}, not {reduction!r}")


def _reduced(losses, reduction):
    if reduction == "none":
        return losses
    return ct.sum(losses) if reduction == "sum" else ct.mean(losses)


def _same_shape(loss, a, b):
    if a.shape != b.shape:
        raise ShapeError(f"{loss}: predictions of shape {a.shape} and targets of shape {b.shape} (they must match)")
