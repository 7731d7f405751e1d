"""The copies that write a step's update values into their state variables."""

from .blocks import Block


def staged_updates(final, pointers, viewed):
    """``(stage block, phases)`` writing each ``(state variable, value)`` of ``final``: two lists of ``(value, source,
    destination)`` triples, ``source`` None to read the value where it is, else the address holding it packed; no
    copy of a phase reads what another of it writes, and the second runs after the first. A value that another
    update overwrites (a state variable, or a view of one: a slice starts inside it) is first copied into the stage
    block, and from there into its variable, once every value has been read."""
    destinations = {pointers[var] for var, _ in final}
    staged = [value for _, value in final if {pointers.get(value), pointers.get(viewed(value))} & destinations]
    block = Block([v.size * v.dtype.itemsize for v in staged])
    stage = {value: block.pointer(k) for k, value in enumerate(staged)}
    return block, ([(value, None, stage[value]) for value in staged],
                   [(value, stage.get(value), pointers[var]) for var, value in final])
