"""Files kvbench writes: whole or not at all (a temp file in the same folder, then a rename), and
readable as any file the user makes (the mode open() would give: 0666 less the umask), since
reports and figures are published."""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def new_file_mode() -> int:
    """The mode open() gives a new file under the process's umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextmanager
def replacing(path: str | Path) -> Iterator[str]:
    """A temp path beside `path` to write to; when the block ends it takes open()'s mode and is
    renamed over `path`; if the block fails it is removed and `path` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, new_file_mode())  # mkstemp makes it private to its owner
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path`: readers never see half a file."""
    with replacing(path) as tmp, open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
