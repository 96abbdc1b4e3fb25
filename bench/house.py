"""The house in figures: each package's modules and lines, the largest modules, the longest functions.

A report, not a limit: a module's size follows its concept. Read it to see where a concept has
grown past one module, or where a module holds two. Run: ``python bench/house.py``.
"""

from __future__ import annotations

import ast
import json
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "metaroles"


def main() -> None:
    lines: dict[str, int] = {}
    functions: list[tuple[str, str, int]] = []
    for path in sorted(ROOT.rglob("*.py")):
        text = path.read_text()
        name = str(path.relative_to(ROOT.parent))
        lines[name] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                functions.append((name, node.name, node.end_lineno - node.body[0].lineno + 1))
    packages: Counter[str] = Counter()
    modules: Counter[str] = Counter()
    for name, count in lines.items():
        package = str(Path(name).parent)
        packages[package] += count
        modules[package] += 1
    for package, count in sorted(packages.items()):
        print(json.dumps({"figure": "package_lines", "package": package, "modules": modules[package], "value": count}))
    for name, count in sorted(lines.items(), key=lambda item: -item[1])[:10]:
        print(json.dumps({"figure": "module_lines", "module": name, "value": count}))
    for name, function, count in sorted(functions, key=lambda item: -item[2])[:10]:
        print(json.dumps({"figure": "function_lines", "module": name, "function": function, "value": count}))


if __name__ == "__main__":
    main()
