"""MkDocs hook (mkdocs.yml): the site's home page is the repository's README.md, its links to
`docs/` pages made relative to the site, so the README and the site never drift apart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parents[1] / "README.md"


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    page = README.read_text().replace("](docs/", "](")
    files.append(File.generated(config, "index.md", content=page))
    return files
