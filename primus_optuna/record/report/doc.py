"""A tiny document model, :class:`Doc` (headings, numbered sections, paragraphs, bullets, code, tables, PNG
images), rendered to Markdown and to a self-contained HTML page, and the number formats the report uses
(``fmt_tok``, ``fmt_gib``, ``fmt_pct``; the tests compare the report with storage through them). May import
only the standard library: it knows nothing of studies.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from typing import Any

# --- number formatting (the test compares the report with storage through these) ----------------------------


def fmt_tok(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def fmt_gib(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def fmt_pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:+.1f}%"


# --- a tiny document model rendered to Markdown and HTML ----------------------------------------------------


@dataclass
class Doc:
    """Blocks in order (``(kind, data)``) and the PNG images they show, by name."""

    blocks: list[tuple[str, Any]] = field(default_factory=list)
    images: dict[str, bytes] = field(default_factory=dict)
    sections: int = 0
    """how many numbered sections :meth:`section` has opened"""

    def h(self, level: int, text: str) -> None:
        self.blocks.append(("h", (level, text)))

    def section(self, title: str) -> None:
        """A level-2 heading numbered by its position: ``## 3. Planner phase``."""
        self.sections += 1
        self.h(2, f"{self.sections}. {title}")

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def bullets(self, items: list[str]) -> None:
        self.blocks.append(("ul", items))

    def code(self, text: str) -> None:
        self.blocks.append(("code", text))

    def table(self, headers: list[str], rows: list[list[Any]]) -> None:
        self.blocks.append(("table", (headers, [[str(c) for c in r] for r in rows])))

    def image(self, name: str, png: bytes | None, alt: str) -> None:
        if png:
            self.images[name] = png
            self.blocks.append(("img", (name, alt)))

    def markdown(self) -> str:
        out: list[str] = []
        for kind, data in self.blocks:
            if kind == "h":
                out.append("#" * data[0] + " " + data[1])
            elif kind == "p":
                out.append(data)
            elif kind == "ul":
                out.append("\n".join(f"- {i}" for i in data))
            elif kind == "code":
                out.append(f"```\n{data}\n```")
            elif kind == "table":
                headers, rows = data
                cell = lambda s: s.replace("|", "\\|").replace("\n", " ")  # noqa: E731
                lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
                lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
                out.append("\n".join(lines))
            elif kind == "img":
                out.append(f"![{data[1]}](plots/{data[0]}.png)")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        e = html.escape
        out = [
            "<!doctype html><html><head><meta charset='utf-8'>",
            f"<title>{e(title)}</title><style>{_CSS}</style></head><body>",
        ]
        for kind, data in self.blocks:
            if kind == "h":
                out.append(f"<h{data[0]}>{e(data[1])}</h{data[0]}>")
            elif kind == "p":
                out.append(f"<p>{_inline(data)}</p>")
            elif kind == "ul":
                out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in data) + "</ul>")
            elif kind == "code":
                out.append(f"<pre>{e(data)}</pre>")
            elif kind == "table":
                headers, rows = data
                out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in headers) + "</tr>")
                out += ["<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in rows]
                out.append("</table>")
            elif kind == "img":
                b64 = base64.b64encode(self.images[data[0]]).decode()
                out.append(f"<figure><img alt='{e(data[1])}' src='data:image/png;base64,{b64}'></figure>")
        out.append("</body></html>")
        return "\n".join(out) + "\n"


_CSS = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:.5em 0;font-size:.9em}td,th{border:1px solid #ccc;padding:.25em .5em;"
    "text-align:left;vertical-align:top}th{background:#f3f3f3}pre,code{background:#f6f6f6}pre{padding:.5em;"
    "overflow-x:auto}img{max-width:100%}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}"
)


def _inline(text: str) -> str:
    """HTML-escape, then render Markdown ``code`` and **bold** spans."""
    s = html.escape(text)
    s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", s)
