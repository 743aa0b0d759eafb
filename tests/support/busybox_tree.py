"""A microVM template for tests: a root directory holding the static busybox
(Debian's busybox-static) and a link per applet (sh, cat, wget, nc...)."""

import os
import shutil
import subprocess
import tempfile

BUSYBOX = "/bin/busybox"


def missing():
    """Why a busybox tree cannot be made here ("" when it can)."""
    if not os.access(BUSYBOX, os.X_OK):
        return f"no {BUSYBOX} (apt-get install busybox-static; make deps installs it)"
    return ""


def busybox_tree(prefix="moat-vm-tree-"):
    """The tree (root's, 0755, as a microVM template must be); the caller
    removes it."""
    tree = tempfile.mkdtemp(prefix=prefix)
    os.chmod(tree, 0o755)
    os.makedirs(tree + "/bin", 0o755)
    shutil.copy(BUSYBOX, tree + "/bin/busybox")
    os.chmod(tree + "/bin/busybox", 0o755)
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True).stdout.split()
    for applet in applets:
        if applet != "busybox":
            os.symlink("busybox", f"{tree}/bin/{applet}")
    return tree
