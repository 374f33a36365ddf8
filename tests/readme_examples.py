"""The runnable examples of README.md and docs/*.md, each marked by an ``<!-- example: NAME -->`` line before its
code block."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))


def _examples(name: str) -> list[tuple[Path, str]]:
    pattern = rf"<!-- example: {re.escape(name)} -->\s*```python\n(.*?)```"
    return [(doc, code) for doc in DOCUMENTS for code in re.findall(pattern, doc.read_text(), flags=re.S)]


def example_file(name: str) -> str:
    """The document that holds example ``name``, relative to the repository (for tracebacks)."""
    found = _examples(name)
    assert len(found) == 1, f"README.md and docs/*.md have {len(found)} examples named {name!r}"
    return found[0][0].relative_to(ROOT).as_posix()


def readme_example(name: str) -> str:
    """The Python code of example ``name``, wherever it is in README.md and docs/*.md."""
    found = _examples(name)
    assert len(found) == 1, f"README.md and docs/*.md have {len(found)} examples named {name!r}"
    return found[0][1]
