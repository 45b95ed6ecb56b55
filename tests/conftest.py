import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


def pytest_report_header(config) -> str:
    """Free disk at the start: the real-model tests write about 2 GB (mpnet-base alone 840 MB)."""
    import shutil
    import tempfile

    free = shutil.disk_usage(tempfile.gettempdir()).free / 2**30
    line = f"free disk under {tempfile.gettempdir()}: {free:.1f} GiB"
    if free < 3:
        line += " (under 3 GiB: the real-model tests may fail with 'No space left on device')"
    return line


@pytest.fixture(scope="session")
def searched_decoder(tmp_path_factory):
    """``run <tiny decoder> --rewrites search`` once for the session (decoder_tiny.searched_run):
    read by the search's tests and the report's browser test."""
    from decoder_tiny import searched_run

    return searched_run(tmp_path_factory.mktemp("decsearch"))
