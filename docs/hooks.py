"""MkDocs hook (mkdocs.yml): the site's home page is the repository's README.md, its links to
`docs/` pages made relative to the site, so the README and the site never drift apart; and the
benchmarks' charts (bench/results/*.png) are the site's too, so that a page links a chart as
the repository holds it (`../bench/results/X.png`, which GitHub shows), checked by the strict
build."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CHARTS = ROOT / "bench" / "results"


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    page = README.read_text().replace("](docs/", "](")
    files.append(File.generated(config, "index.md", content=page))
    for chart in sorted(CHARTS.rglob("*.png")):
        uri = f"bench/results/{chart.relative_to(CHARTS).as_posix()}"
        files.append(File.generated(config, uri, abs_src_path=str(chart)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    # docs/ pages sit at the site's root: the repository's `../bench/` is the site's `bench/`.
    return markdown.replace("](../bench/results/", "](bench/results/")
