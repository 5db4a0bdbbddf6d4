"""Human and machine renderings of profiling results."""

from __future__ import annotations

import math
import shutil


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


_HEAD = ("", "variant", "p50 ms", "p95 ms", "p99 ms", "mJ/inf", "energy src", "cpu ms", "acc",
         "device", "status")
# Columns given up, in this order, when the table is wider than the terminal; after them the
# variant id is shortened (its end, the engine options, is what differs least often).
_DROP_ORDER = ("p99 ms", "cpu ms", "energy src", "device", "p50 ms")
DEFAULT_OTHERS = 10  # rows shown beyond the choice and the frontier without --all


def _energy(p) -> float:
    return p.energy_mj if p.ok and not math.isnan(p.energy_mj) else math.inf


def failure_kinds(profiles) -> list[tuple[str, str, list[str]]]:
    """Failed variants grouped by (engine, cause), most frequent first: the cause is the error
    without the "<engine> cannot run <file>: " prefix that differs only by file."""
    groups: dict[tuple[str, str], list[str]] = {}
    for p in profiles:
        if not p.ok:
            groups.setdefault((p.engine, _cause(p)), []).append(p.variant_id)
    return sorted(((e, c, ids) for (e, c), ids in groups.items()), key=lambda g: -len(g[2]))


def _cause(p) -> str:
    cause = (p.error or "unknown error").splitlines()[0]
    for marker in (" cannot run ", " failed while running "):
        head, sep, rest = cause.partition(marker)
        if sep and head == p.engine and ": " in rest:
            return rest.split(": ", 1)[1]
    return cause


def refused_devices(profiles) -> dict[tuple[str, str], str]:
    """(engine, device id) -> why, for each device that refused to run its engine (profile
    status `refused`: its driver would not build the engine's kernels)."""
    return {(p.engine, p.device): _cause(p) for p in profiles if p.status == "refused"}


def _row(p, mark: str) -> dict[str, str]:
    return dict(zip(_HEAD, (mark, p.variant_id, _fmt(p.p50_ms), _fmt(p.p95_ms), _fmt(p.p99_ms),
                            _fmt(p.energy_mj, 3), p.energy_source or "-", _fmt(p.cpu_ms),
                            _fmt(p.accuracy, 3) if p.accuracy is not None else "-",
                            p.actual_device or "-", p.status), strict=True))


def _render(rows: list[dict[str, str]], cols: list[str], width: int) -> list[str]:
    """Rows as aligned lines no wider than `width`: columns dropped, then ids shortened."""
    cols = list(cols)

    def widths() -> dict[str, int]:
        return {c: max(len(r[c]) for r in [dict(zip(_HEAD, _HEAD, strict=True)), *rows])
                for c in cols}

    def total(w: dict[str, int]) -> int:
        return sum(w.values()) + 2 * (len(w) - 1)

    for c in _DROP_ORDER:
        if total(widths()) <= width:
            break
        if c in cols:
            cols.remove(c)
    w = widths()
    over = total(w) - width
    if over > 0:
        w["variant"] = max(24, w["variant"] - over)
    out = []
    for r in [dict(zip(_HEAD, _HEAD, strict=True)), *rows]:
        cells = []
        for c in cols:
            v = r[c]
            if len(v) > w[c]:
                v = v[:w[c] - 1] + "~"
            cells.append(v.ljust(w[c]))
        out.append("  ".join(cells).rstrip())
    return out


def profile_table(profiles, choice, front_ids: set[str], all_rows: bool = False,
                  width: int | None = None) -> str:
    """The profile table, sorted: the choice, then the frontier (the governor's ladder) by
    energy, then the other variants by energy; without `all_rows` only the cheapest
    DEFAULT_OTHERS of those, and failures summarised one line per kind (engine and cause).
    `all_rows` lists every variant, failures as rows with their errors below. At most `width`
    characters wide (default: the terminal's)."""
    width = width or shutil.get_terminal_size((120, 24)).columns
    chosen = choice.profile.variant_id if choice else None
    ok = [p for p in profiles if p.ok]
    failed = [p for p in profiles if not p.ok]

    def rank(p) -> tuple:
        group = 0 if p.variant_id == chosen else 1 if p.variant_id in front_ids else 2
        return (group, _energy(p), p.p95_ms if not math.isnan(p.p95_ms) else math.inf,
                p.variant_id)

    ordered = sorted(ok, key=rank)
    head = [p for p in ordered if rank(p)[0] < 2]
    rest = [p for p in ordered if rank(p)[0] == 2]
    shown = head + (rest if all_rows else rest[:DEFAULT_OTHERS])
    if all_rows:
        shown += failed
    rows = [_row(p, "*" if p.variant_id == chosen else "f" if p.variant_id in front_ids
                 else "") for p in shown]
    cols = [c for c in _HEAD if c != "status" or all_rows]
    lines = _render(rows, cols, width)
    hidden = 0 if all_rows else len(ok) - len(shown)
    if hidden > 0:
        lines.append(f"  ... {hidden} more variants that ran, dearer than these (--all lists "
                     "them)")
    if all_rows:
        lines += [_clip(f"  {p.status} {p.variant_id}: {p.error}", width) for p in failed]
    else:
        known = {p.variant_id for p in failed if p.stage == "known-failure"}
        refused = {p.variant_id for p in failed if p.status == "refused"}
        for engine, cause, ids in failure_kinds(profiles):
            # a failure record from the cache was not tried again: say so, and how to retry
            again = " [known from the cache; --fresh tries again]" if set(ids) <= known else ""
            word = "refused" if set(ids) <= refused else "failed"
            lines.append(_clip(f"  {word}: {len(ids)} {engine} variant"
                               f"{'s' if len(ids) > 1 else ''} ({ids[0]}"
                               f"{', ...' if len(ids) > 1 else ''}){again}: {cause}", width))
    lines.append(f"{len(ok)} of {len(profiles)} variants ran"
                 + ("" if all_rows else "; --all lists every variant and failure"))
    lines.append("* = choice, f = on the accuracy/energy frontier (the governor's ladder)")
    return "\n".join(lines)


def _clip(line: str, width: int) -> str:
    return line if len(line) <= width else line[:width - 3] + "..."
