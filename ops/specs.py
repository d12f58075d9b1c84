"""Spec files: a job's or an endpoint's spec as the tenant writes it, in YAML, TOML or JSON, read into
the mapping the API takes (``resontech submit`` and ``deploy`` send it; ``resontech dispatcher render``
renders it). The API checks the fields; this only reads the file."""

from __future__ import annotations

import json
from pathlib import Path

from core.errors import InvalidInput


def read_spec(path: str | Path) -> dict[str, object]:
    """A job or endpoint spec from a YAML (``.yaml``/``.yml``), TOML (``.toml``) or JSON file.

    Raises:
        InvalidInput: no such file, not parseable (the parser's words, on one line), or not a mapping.
    """
    source = Path(path)
    if not source.is_file():
        raise InvalidInput(f"no spec file {source}")
    try:
        text = source.read_text()
        if source.suffix == ".toml":
            import tomllib

            spec: object = tomllib.loads(text)
        elif source.suffix in (".yaml", ".yml"):
            import yaml

            spec = yaml.safe_load(text)
        else:
            spec = json.loads(text)
    except Exception as exc:  # the parsers' own errors name the line
        words = (
            "; ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
        )
        raise InvalidInput(f"{source} is not valid {source.suffix.lstrip('.') or 'JSON'}: {words}") from None
    if not isinstance(spec, dict):
        raise InvalidInput(f"{source} must hold a mapping of spec fields, got {type(spec).__name__}")
    return spec
