"""A wheel without some of its files, RECORD updated: what the GPU kit carries instead of two large wheels.

Only files that the check's import and run chain never open are dropped, each named with the reason
(`SLIM` below); pip installs the slimmed wheel like the original (same name; RECORD lists exactly what is left).
The result is byte-for-byte the same for the same input: entries keep their order and zip metadata.
"""

from __future__ import annotations

import fnmatch
import zipfile
from pathlib import Path

from qrewrite.errors import QrewriteError
from qrewrite.io_utils import atomic_path

# project (canonical name) -> [(glob inside the wheel, why it can go)]
SLIM: dict[str, list[tuple[str, str]]] = {
    "ray": [("ray/jars/*", "Java workers only: ray/_private/services.py sets ray_java_installed from this "
                           "folder's existence; the check runs Python workers")],
    "xgrammar": [("xgrammar/lib/libxgrammar.a", "a static C++ archive for linking against xgrammar; nothing "
                                                "loads it at run time (the Python module loads the .so)")],
}


def slim_wheel(src: str | Path, dest: str | Path, drop: list[str]) -> list[str]:
    """Copy wheel `src` to `dest` without the members matching `drop` (globs); returns the dropped names."""
    src, dest = Path(src), Path(dest)
    with zipfile.ZipFile(src) as zin:
        names = zin.namelist()
        gone = [n for n in names if any(fnmatch.fnmatchcase(n, g) for g in drop)]
        missing = [g for g in drop if not any(fnmatch.fnmatchcase(n, g) for n in names)]
        if missing:
            raise QrewriteError(f"{src.name} has no member matching {missing}: the slimming list is stale",
                                hint="update tools/gpukit/slim.py for this version")
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        with atomic_path(dest) as tmp, zipfile.ZipFile(tmp, "w") as zout:
            for info in zin.infolist():
                if info.filename in gone:
                    continue
                data = zin.read(info)
                if info.filename == record:
                    keep = [ln for ln in data.decode().splitlines(keepends=True)
                            if ln.split(",", 1)[0] not in gone]
                    data = "".join(keep).encode()
                zout.writestr(info, data, compress_type=info.compress_type)
    return gone
