import sys
from pathlib import Path

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
