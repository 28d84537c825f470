"""A strict parser of the Prometheus text exposition format 0.0.4 (what prometheus_client's parser accepts, and
stricter: every family has HELP and TYPE before its samples, families are contiguous, no duplicate series)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
VALUE = r'"(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE_RE = re.compile(rf"^({NAME})(\{{(?:{LABEL}={VALUE}(?:,{LABEL}={VALUE})*,?)?\}})? (\S+)(?: (-?\d+))?$")
PAIR_RE = re.compile(rf"({LABEL})=({VALUE})")
HELP_RE = re.compile(rf"^# HELP ({NAME}) (.*)$")
TYPE_RE = re.compile(rf"^# TYPE ({NAME}) (counter|gauge|histogram|summary|untyped)$")


class ParseError(ValueError):
    pass


@dataclass
class Family:
    name: str
    type: str = ""
    help: str = ""
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)


def _unescape(v: str) -> str:
    return v[1:-1].replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")


def parse(text: str) -> dict[str, Family]:
    if not text.endswith("\n"):
        raise ParseError("exposition must end with a newline")
    families: dict[str, Family] = {}
    current: str | None = None
    closed: set[str] = set()
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for n, line in enumerate(text.split("\n")[:-1], 1):
        if m := HELP_RE.match(line):
            name = m.group(1)
            if name in families or name in closed:
                raise ParseError(f"line {n}: second HELP for {name}")
            if current:
                closed.add(current)
            families[name] = Family(name, help=m.group(2))
            current = name
        elif m := TYPE_RE.match(line):
            if m.group(1) != current or families[current].type or families[current].samples:
                raise ParseError(f"line {n}: TYPE must follow its HELP, once, before samples")
            families[current].type = m.group(2)
        elif line.startswith("#"):
            raise ParseError(f"line {n}: unexpected comment {line!r}")
        elif m := SAMPLE_RE.match(line):
            name = m.group(1)
            base = re.sub(r"_(total|sum|count|bucket)$", "", name)
            if current not in (name, base) or not families[current].type:
                raise ParseError(f"line {n}: sample of {name} outside its family")
            labels: dict[str, str] = {}
            for key, value in PAIR_RE.findall(m.group(2) or ""):
                if key in labels:
                    raise ParseError(f"line {n}: label {key} twice")
                labels[key] = _unescape(value)
            raw = m.group(3)
            try:
                value = float(raw) if raw not in ("+Inf", "-Inf", "NaN") else float(raw.replace("Inf", "inf"))
            except ValueError as exc:
                raise ParseError(f"line {n}: bad value {raw!r}") from exc
            if math.isnan(value) and raw != "NaN":
                raise ParseError(f"line {n}: bad value {raw!r}")
            key = (name, tuple(sorted(labels.items())))
            if key in seen:
                raise ParseError(f"line {n}: duplicate series {key}")
            seen.add(key)
            families[current].samples.append((labels, value))
        else:
            raise ParseError(f"line {n}: not exposition format: {line!r}")
    return families
