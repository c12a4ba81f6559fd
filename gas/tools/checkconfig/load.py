"""Loading YAML or JSON documents that remember the line of every mapping and key, and the
keys given twice (strict decoding refuses those; PyYAML would keep the last one)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


class LocatedMap(dict[Any, Any]):
    """A mapping that remembers where it and its keys are, and keys given twice."""

    def __init__(self, line: int | None = None) -> None:
        super().__init__()
        self.line = line
        self.key_lines: dict[Any, int] = {}
        self.value_lines: dict[Any, tuple[int, str | None]] = {}
        self.duplicates: list[tuple[Any, int | None]] = []


class LocatedList(list[Any]):
    """A list that remembers its line."""

    def __init__(self, line: int | None = None) -> None:
        super().__init__()
        self.line = line


def _loader_class() -> type[Any]:
    import yaml

    class Loader(yaml.SafeLoader):
        line_offset = 0

        def line_of(self, node: yaml.Node) -> int:
            return int(node.start_mark.line) + 1 + self.line_offset

    def construct_map(loader: Loader, node: yaml.MappingNode) -> Iterator[LocatedMap]:
        result = LocatedMap(loader.line_of(node))
        yield result
        loader.flatten_mapping(node)
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                key = str(key)
            if key in result:
                result.duplicates.append((key, loader.line_of(key_node)))
            result[key] = loader.construct_object(value_node, deep=True)
            result.key_lines[key] = loader.line_of(key_node)
            style = value_node.style if isinstance(value_node, yaml.ScalarNode) else None
            result.value_lines[key] = (loader.line_of(value_node), style)

    def construct_seq(loader: Loader, node: yaml.SequenceNode) -> Iterator[LocatedList]:
        result = LocatedList(loader.line_of(node))
        yield result
        result.extend(loader.construct_object(child, deep=True) for child in node.value)

    Loader.add_constructor("tag:yaml.org,2002:map", construct_map)
    Loader.add_constructor("tag:yaml.org,2002:seq", construct_seq)
    return Loader


class ParseError(Exception):
    def __init__(self, message: str, line: int | None) -> None:
        super().__init__(message)
        self.line = line


def parse_documents(text: str, line_offset: int = 0) -> list[Any]:
    """All documents of a YAML (or JSON) text, mappings as ``LocatedMap`` with line numbers."""
    import yaml

    loader = _loader_class()(text)
    loader.line_offset = line_offset
    try:
        documents = []
        while loader.check_data():
            documents.append(loader.get_data())
        return documents
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 + line_offset if mark is not None else None
        problem = exc.problem or exc.context or "cannot parse"
        # JSON that YAML cannot read (tabs, for one) is still valid Policy JSON.
        try:
            return [_from_json(text)]
        except ValueError:
            raise ParseError(f"not valid YAML or JSON: {problem}", line) from None
    except yaml.YAMLError as exc:
        raise ParseError(f"not valid YAML or JSON: {exc}", None) from None
    finally:
        loader.dispose()


def _from_json(text: str) -> Any:
    def pairs(items: list[tuple[str, Any]]) -> LocatedMap:
        result = LocatedMap()
        for key, value in items:
            if key in result:
                result.duplicates.append((key, None))
            result[key] = value
        return result

    return json.loads(text, object_pairs_hook=pairs)


def line_of(obj: Any, key: Any = None) -> int | None:
    """The line of ``obj``, or of its ``key`` when the key is known there."""
    if isinstance(obj, LocatedMap):
        if key is not None and key in obj.key_lines:
            return obj.key_lines[key]
        return obj.line
    if isinstance(obj, LocatedList):
        return obj.line
    return None


def text_offset(data: LocatedMap, key: Any) -> int:
    """How many lines of the file come before the text held at ``data[key]``, so a
    document parsed from that text is placed at its lines in the file."""
    line, style = data.value_lines.get(key, (1, None))
    # A block scalar's text starts on the line after its indicator.
    return line if style in ("|", ">") else line - 1


def join_path(path: str, key: Any) -> str:
    """The path of a field as findings name it: ``extenders[0].tlsConfig``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


@dataclass
class Source:
    """One file given to the command: its name and its parsed documents."""

    label: str
    documents: list[Any]
