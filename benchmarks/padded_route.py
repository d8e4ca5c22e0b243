"""fastbert's commands on the padded route, for benchmarks that measure the packed path's gain
in the same run: every model folder's pipeline pads its token ids into a [n, longest] batch
with a mask and runs the model's padded entry (``FolderPipeline(packed=False)``, the route a
folder with a sentence-transformers module runs, and the one every folder ran before the
packed path); a cross-encoder's :class:`Classifier` keeps its padded route too (its load-time
probe, which would turn the packed path on, is skipped).

    python -m benchmarks.padded_route serve --model FOLDER ...   (any fastbert command)
"""

from __future__ import annotations

import sys

from fastbert.embedding.model import Classifier, FolderPipeline


def use_padded_route() -> None:
    """Make every FolderPipeline and Classifier built from now on in this process run the
    padded route."""
    built = FolderPipeline.__post_init__

    def padded(self: FolderPipeline) -> None:
        built(self)
        self.packed = False

    FolderPipeline.__post_init__ = padded
    Classifier.probe = lambda self, tokens, type_ids: None  # packed stays False


def main(argv: list[str] | None = None) -> int:
    from fastbert.cli import main as fastbert_main

    use_padded_route()
    return fastbert_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
