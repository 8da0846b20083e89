"""The `gmjit` console script: runs the command-line tool the wheel carries (gmjit/bin/gmjit,
the same program a CMake install puts in bin/), with this process's arguments and environment."""

from __future__ import annotations

import os
import pathlib
import sys


def executable() -> pathlib.Path:
    """bin/gmjit beside the extension: the wheel installs both into one folder, which is not
    this file's in an editable install (the Python sources stay in the source tree)."""
    from gmjit import _C

    return pathlib.Path(_C.__file__).resolve().parent / "bin" / "gmjit"


def main() -> None:
    tool = executable()
    if not os.access(tool, os.X_OK):
        sys.stderr.write(
            f"gmjit: this installation has no command-line tool: {tool} is missing or not "
            "executable. A wheel built without CLI11 or nlohmann_json (both needed at build "
            "time: Debian's libcli11-dev, nlohmann-json3-dev) has none; reinstall with them, or "
            "build the CMake project (README.md)\n")  # fmt: skip
        sys.exit(2)
    os.execv(tool, [str(tool), *sys.argv[1:]])


if __name__ == "__main__":
    main()
