"""Build expressions, look at them, evaluate them, and see what a mistake looks like.

    python examples/expressions.py
"""

import numpy as np

import cortado as ct

rng = np.random.default_rng(0)

# A batch of 3-d points, a rotation-and-scale, and a softmax attention over them.
points = ct.var("points", (8, 3))
transform = ct.var("transform", (3, 3))
query = ct.var("query", (3,))

moved = points @ transform                                # (8, 3)
scores = ct.einsum("nd,d->n", moved, query) / 3 ** 0.5    # a Python float keeps float32
weights = ct.softmax(scores)                              # never overflows
summary = ct.sum(moved * ct.reshape(weights, (8, 1)), axis=0)

print(ct.Graph([summary, weights]))
print()
print("one line:", repr(summary))

feeds = {
    "points": rng.standard_normal((8, 3)).astype(np.float32),
    "transform": np.eye(3, dtype=np.float32) * 2,
    "query": np.array([1.0, 0.0, 0.0], dtype=np.float32),
}
summary_value, weights_value = ct.evaluate([summary, weights], feeds)
print("summary:", summary_value, "weights sum to", weights_value.sum())

# The same expression built twice is the same object: shared work is shared for free.
assert ct.softmax(ct.einsum("nd,d->n", points @ transform, query) / 3 ** 0.5) is weights

# Types follow NumPy 2: a Python scalar does not widen float32, an array of float64 does.
print((points * 2.0).dtype, (points * np.float64(2.0)).dtype)

# Positions, masks and counts: sin and cos, // and %, logical ops on bools, and rows added back with add_at.
position = ct.var("position", (8,), "int32")
angle = ct.cast(position, "float32") / 10.0
encoding = ct.sin(angle) * ct.cos(angle)
every_third = ct.equal(position % 3, 0) & (position // 3 < 2)   # bools combine with & | ^ ~
counts = ct.add_at(ct.const(np.zeros(3, np.float32)), position % 3, 1.0)
values = ct.evaluate([encoding, every_third, counts], {"position": np.arange(8, dtype=np.int32)})
print("\nsin * cos:", values[0].round(3), "\nevery third, below 6:", values[1], "\ncounts by position % 3:", values[2])

# Mistakes are caught where they are made, with the line that made them.
try:
    points @ ct.var("wrong", (4, 3))
except ct.ShapeError as error:
    print("\nShapeError:", error)
try:
    ct.evaluate(summary, {"points": feeds["points"], "transform": feeds["transform"]})
except ct.FeedError as error:
    print("\nFeedError:", error)

with open("attention.dot", "w") as out:
    out.write(ct.to_dot([summary, weights]))
print("\nwrote attention.dot (render with: dot -Tpng attention.dot -o attention.png)")
