"""Updates beside the step: the generated kernels that only write state run on a stream of their own.

An optimizer's step for one parameter (AdamW's reads of the gradient, the moments and the weight, and its writes of
them; a layer norm's gain and bias gradients summed with their update) is read by nothing later in the training
step: the backward pass need not wait for it. Run on the program's stream, each such kernel is short and the
kernels after it wait for it; run on a second stream, each after what the program's stream has queued before it, it
overlaps the products and attention that follow. On the large GPT step on an H200: 13.32 ms to 13.06 in bfloat16,
12.63 to 12.29 in float8, the arenas unchanged (``benchmarks/results/h200/experiments/updates_beside/``).

Which kernels: generated ones whose every result is an update written over its state variable (``sinks``). Where
each is waited for, and so how long what it reads and its workspace keep their places in the arena, is
``memplan.beside_joins``: where a later step reads what it writes or writes what it reads, else at the step's end;
and it runs beside only where that hold adds nothing to the most bytes the step has live (``memplan.affordable``).
The values are the program's: a kernel beside starts after every kernel before it, and everything it reads stays in
place until it is done. ``compile(..., backend="cupy", overlap_updates=False)`` runs every kernel in order.
"""

from ....exprgraph.ops import FUSED_OP


def chosen(kernels, steps, sinks, options):
    """The indices of the kernels to run beside the step (see the module)."""
    if not options.get("overlap_updates", True):
        return []
    return [i for i, (k, s) in enumerate(zip(kernels, steps))
            if k.term.op is FUSED_OP and s.view_of is None and s.defines and all(d in sinks for d in s.defines)]


class Beside:
    """The calls of the kernels beside the step on ``stream``: each after what the program's stream (``main``) has
    queued, its end an event the step that joins it waits for. ``in_order`` (a profile's) runs them on ``main``
    like any other kernel."""

    def __init__(self, main, stream):
        self.main, self.stream, self.in_order = main, stream, False

    def call(self, on_main, on_side, finished):
        """The call of one kernel beside: ``on_main``/``on_side``, its calls bound to either stream; its end's event
        goes in ``finished[0]`` (None where it ran in order)."""
        main, side = self.main, self.stream

        def call():
            if self.in_order:
                on_main()
                finished[0] = None
                return
            side.wait_event(main.record())
            with side:
                on_side()
            finished[0] = side.record()

        return call
