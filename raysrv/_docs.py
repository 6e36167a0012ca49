"""``GET /docs``: the REST API's reference as one self-contained HTML page, drawn from the
OpenAPI schema that ``GET /openapi.json`` serves.

FastAPI's own page loads its scripts and styles from a CDN, so on a machine without the
internet, or behind a proxy that blocks it, it shows nothing; this one has no script and loads
nothing else.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

__all__ = ["docs_page"]

_STYLE = (
    "body{font-family:sans-serif;max-width:64em;margin:2em auto;padding:0 1em;line-height:1.4}"
    "pre{background:#f4f4f4;padding:.6em;overflow:auto}code{background:#f4f4f4}"
    "h2{border-top:1px solid #ccc;padding-top:.8em}"
)


def docs_page(schema: dict[str, Any]) -> str:
    """The page of ``schema`` (an OpenAPI document): every operation with its parameters,
    body and answers, then every named schema."""
    info = schema.get("info", {})
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{escape(info.get('title', 'API'))}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{escape(info.get('title', 'API'))} {escape(str(info.get('version', '')))}</h1>",
        f"<p>{escape(info.get('description', ''))}</p>",
        "<p>The same as a machine reads it: <a href='openapi.json'>openapi.json</a>.</p>",
    ]
    for path, operations in schema.get("paths", {}).items():
        for method, op in operations.items():
            parts.append(_operation(method, path, op))
    named = schema.get("components", {}).get("schemas", {})
    if named:
        parts.append("<h2>Schemas</h2>")
        for name, body in named.items():
            parts.append(f"<h3 id='{escape(name)}'>{escape(name)}</h3>{_json(body)}")
    parts.append("</body></html>")
    return "".join(parts)


def _operation(method: str, path: str, op: dict[str, Any]) -> str:
    out = [f"<h2><code>{escape(method.upper())} {escape(path)}</code></h2>"]
    for key in ("summary", "description"):
        if op.get(key):
            out.append(f"<p>{escape(op[key])}</p>")
    parameters = op.get("parameters", [])
    if parameters:
        items = "".join(
            f"<li><code>{escape(p['name'])}</code> ({escape(p.get('in', ''))}"
            f"{', required' if p.get('required') else ''}) "
            f"{escape(p.get('description', ''))}</li>"
            for p in parameters
        )
        out.append(f"<p>Parameters:</p><ul>{items}</ul>")
    body = op.get("requestBody", {}).get("content", {})
    for media, content in body.items():
        out.append(f"<p>Body ({escape(media)}):</p>{_json(content.get('schema', {}))}")
    answers = "".join(
        f"<li><b>{escape(status)}</b> {escape(answer.get('description', ''))}</li>"
        for status, answer in op.get("responses", {}).items()
    )
    if answers:
        out.append(f"<p>Answers:</p><ul>{answers}</ul>")
    return "".join(out)


def _json(value: Any) -> str:
    return f"<pre>{escape(json.dumps(value, indent=2))}</pre>"
