"""``fastbert serve`` with a forward pass the tests can slow down or break, as a real process:
python tests/serve_faulty.py serve --model ... (the same arguments as the command).

FASTBERT_TEST_DELAY: seconds every forward pass sleeps first (a slow model, so that requests
queue). FASTBERT_TEST_FAIL_FILE: while that file exists, every forward pass raises.
"""

import os
import sys
import time
from pathlib import Path

from fastbert.cli import main
from fastbert.embedding.text_model import TextModel

_real = TextModel.embed_tokens


def _embed_tokens(self, tokens, prompting=None):
    time.sleep(float(os.environ.get("FASTBERT_TEST_DELAY", "0")))
    fail = os.environ.get("FASTBERT_TEST_FAIL_FILE")
    if fail and Path(fail).exists():
        raise RuntimeError("injected failure")
    return _real(self, tokens, prompting)


TextModel.embed_tokens = _embed_tokens

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
