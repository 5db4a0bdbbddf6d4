"""Human and machine renderings of profiling results."""

from __future__ import annotations

import math


def _fmt(x: float, digits: int = 2) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def json_safe(x):
    """NaN (not measured) becomes null: JSON has no NaN."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_safe(v) for v in x]
    return x


def profile_table(profiles, choice, front_ids: set[str]) -> str:
    """The profile table: one row per variant, failures explained below it."""
    head = ("", "variant", "p50 ms", "p95 ms", "p99 ms", "mJ/inf", "energy src", "cpu ms",
            "acc", "device", "status")
    rows = []
    for p in profiles:
        mark = "*" if choice and p.variant_id == choice.profile.variant_id else (
            "f" if p.variant_id in front_ids else "")
        rows.append((mark, p.variant_id, _fmt(p.p50_ms), _fmt(p.p95_ms), _fmt(p.p99_ms),
                     _fmt(p.energy_mj, 3), p.energy_source or "-", _fmt(p.cpu_ms),
                     _fmt(p.accuracy, 3) if p.accuracy is not None else "-",
                     p.actual_device or "-", "ok" if p.ok else "failed"))
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in [head, *rows]]
    for p in profiles:
        if not p.ok:
            lines.append(f"  failed {p.variant_id}: {p.error}")
    lines.append("* = choice, f = on the accuracy/energy frontier (the governor's ladder)")
    return "\n".join(lines)
