"""Durations as users and SLURM write them: `90s`, `45m`, `4h`, `1d`, `01:30:00`, `2-00:00:00`."""

import re

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds in `text`, more than 0; ValueError with the accepted forms otherwise."""
    seconds = _seconds(text)
    if seconds <= 0:
        # SLURM reads 0 as no limit at all; a time limit here is one the run must stop before
        raise ValueError(f"{text!r} is no time: give a limit above 0, e.g. 4h or 01:30:00")
    return seconds


def _seconds(text: str) -> float:
    value = text.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd]?)", value)
    if match:
        return float(match.group(1)) * UNITS[match.group(2) or "s"]
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", value)
    if match and ":" in value:
        day_text, first, second, third = match.groups()
        parts = [int(first), int(second or 0), int(third or 0)]
        if third is None:  # MM:SS, as SLURM reads two fields
            parts = [0, parts[0], parts[1]]
        hours, minutes, seconds = parts
        return int(day_text or 0) * 86400 + hours * 3600 + minutes * 60 + seconds
    if match and "-" in value:  # D-HH
        return int(match.group(1)) * 86400 + int(match.group(2)) * 3600
    raise ValueError(f"cannot read {text!r} as a duration: use 90m, 4h, 1d, HH:MM:SS or D-HH:MM:SS")


def format_duration(seconds: float) -> str:
    """`[D-]HH:MM:SS`, as SLURM writes a time limit."""
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text
