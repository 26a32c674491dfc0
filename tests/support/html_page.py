"""Reading an HTML page as a browser's parser sees it: its elements and its text.

The run's page (slicekeeper.report_page) is checked through what a parser makes of it, not through
substrings of its source: text from the job shown escaped parses as text, and the same text left raw
parses as elements (a `<script>` in a job's name would be a script).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser


@dataclass(frozen=True)
class Element:
    tag: str
    attrs: dict[str, str]

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())


@dataclass
class ParsedPage:
    elements: list[Element] = field(default_factory=list)
    text: str = ""
    """Every text node, character references resolved, joined with spaces."""

    def having_class(self, name: str) -> list[Element]:
        return [element for element in self.elements if name in element.classes]

    def tags(self) -> set[str]:
        return {element.tag for element in self.elements}


class _Parser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page = ParsedPage()
        self._texts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.page.elements.append(Element(tag, {name: value or "" for name, value in attrs}))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)

    def handle_data(self, data: str) -> None:
        self._texts.append(data)


def parse_page(html: str) -> ParsedPage:
    parser = _Parser()
    parser.feed(html)
    parser.close()
    parser.page.text = " ".join(parser._texts)
    return parser.page


def shows_as_text(html: str, hostile: str) -> bool:
    """Whether `hostile` (text holding markup) appears on the page as text, and no script element does."""
    page = parse_page(html)
    return "script" not in page.tags() and hostile in page.text
