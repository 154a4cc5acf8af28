"""A Kubernetes ConfigMap volume laid out on disk as the kubelet does it."""

from __future__ import annotations

import os
from pathlib import Path


def configmap_volume(mount: Path, data: dict[str, str], stamp: str) -> None:
    """Lay out (or update) a ConfigMap volume as the kubelet does: the files in a new
    ``..<stamp>`` directory, the ``..data`` link swapped to it atomically, one link per key,
    then the previous version removed."""
    mount.mkdir(parents=True, exist_ok=True)
    versioned = mount / f"..{stamp}"
    versioned.mkdir()
    for key, value in data.items():
        (versioned / key).write_text(value)
    link = mount / "..data_tmp"
    link.symlink_to(versioned.name)
    old = os.readlink(mount / "..data") if (mount / "..data").is_symlink() else None
    os.replace(link, mount / "..data")
    for key in data:
        if not (mount / key).is_symlink():
            (mount / key).symlink_to(f"..data/{key}")
    if old is not None:
        for f in (mount / old).iterdir():
            f.unlink()
        (mount / old).rmdir()
