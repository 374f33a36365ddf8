"""The README's runnable examples, each marked by an ``<!-- example: NAME -->`` line before its code block."""
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example(name: str) -> str:
    """The Python code of the README's example ``name``."""
    found = re.findall(rf"<!-- example: {re.escape(name)} -->\s*```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(found) == 1, f"README.md has {len(found)} examples named {name!r}"
    return found[0]
