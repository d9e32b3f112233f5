"""How the report and the published tables write numbers: one place for missing values, digits, ratios and the
median latency of an artifact."""

from __future__ import annotations


def p50(item: dict | None, length: int, threads: int = 1) -> float | None:
    """An artifact's median latency at `length` tokens and `threads` threads, None where it was not timed."""
    cell = (((item or {}).get("latency_ms") or {}).get(f"seq{length}") or {}).get(f"threads{threads}")
    return cell["p50"] if cell else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator in (None, 0):
        return None
    return round(numerator / denominator, 3)



def fmt(value, digits: int = 2) -> str:
    """A report cell: "—" where there is no value, floats to `digits`, anything else as it is."""
    if value is None:
        return "—"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)



def number(value, digits: int = 2) -> str:
    """A published table's cell: "n/a" where there is no value."""
    return "n/a" if value is None else f"{value:.{digits}f}"


def minutes(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    whole_minutes, rest = divmod(round(seconds), 60)  # rounded first: 239.7 s is 4:00, not 3:60
    return f"{whole_minutes}:{rest:02d}"


def percent(value) -> str:
    return "n/a" if value is None else f"{value:.1%}"
