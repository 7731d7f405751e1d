"""The plan as a picture: time across, address up, one labelled rectangle per buffer (matplotlib)."""

from ..errors import PlanError

COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise PlanError("MemoryPlan.plot needs matplotlib: python -m pip install matplotlib") from None
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def draw(plan, path, title=None):
    """Write the picture of ``plan`` to ``path`` (PNG); returns ``path``."""
    plt = _pyplot()
    scale, unit = (1024, "KiB") if plan.peak_bytes < 1 << 24 else (1 << 20, "MiB")
    figure, axes = plt.subplots(figsize=(min(4 + 0.25 * plan.steps, 16), 6))
    for i, b in enumerate(sorted(plan.buffers, key=lambda b: (b.start, b.offset))):
        x, width = b.start, b.end - b.start + 1
        y, height = b.offset / scale, b.size / scale
        axes.add_patch(plt.Rectangle((x, y), width, height, facecolor=COLORS[i % len(COLORS)],
                                     edgecolor="black", linewidth=0.5, alpha=0.85))
        if height > plan.peak_bytes / scale / 40 and width >= 1:
            axes.text(x + width / 2, y + height / 2, b.label, ha="center", va="center", fontsize=6, clip_on=True)
    axes.axhline(plan.lower_bound_bytes / scale, color="grey", linestyle="--", linewidth=0.8,
                 label=f"lower bound {plan.lower_bound_bytes / scale:.1f} {unit}")
    axes.set_xlim(0, plan.steps)
    axes.set_ylim(0, max(plan.peak_bytes, 1) / scale * 1.05)
    axes.set_xlabel("step of the schedule")
    axes.set_ylabel(f"offset in the arena ({unit})")
    axes.set_title(title or f"memory plan: peak {plan.peak_bytes / scale:.1f} {unit}, "
                            f"one buffer per value {plan.naive_bytes / scale:.1f} {unit}")
    axes.legend(loc="upper right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
