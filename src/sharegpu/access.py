"""Who may open the host-side region files: the tenant's owner and the agent, nobody else.

A tenant's usage region is mode 0600, owned by the user whose processes run the tenant. A GPU's
arbiter region is shared by the tenants of that GPU, whose owners may be different users: it is
mode 0600, owned by its creator (the agent: root), with a POSIX ACL entry granting read and write
to each tenant owner (``system.posix_acl_access``, the format of the kernel's
``posix_acl_xattr``). tmpfs (``/run``) and the usual disk filesystems support ACLs; where they
are not supported the region falls back to mode 0666, which ``sharegpu doctor`` reports.
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
from pathlib import Path

_XATTR = "system.posix_acl_access"
_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_UNDEFINED = 0xFFFFFFFF
_RW = 0o6
_ENTRY = struct.Struct("<HHI")
_UNSUPPORTED = {errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}


def acl_users(path: Path) -> set[int]:
    """The users the file's ACL grants (named user entries); empty without an ACL."""
    try:
        raw = os.getxattr(path, _XATTR)
    except OSError:
        return set()
    return {
        uid
        for tag, _perm, uid in (_ENTRY.unpack_from(raw, at) for at in range(4, len(raw), _ENTRY.size))
        if tag == _USER
    }


def _acl(users: set[int]) -> bytes:
    entries = [(_USER_OBJ, _RW, _UNDEFINED)]
    entries += [(_USER, _RW, uid) for uid in sorted(users)]
    entries += [(_GROUP_OBJ, 0, _UNDEFINED), (_MASK, _RW, _UNDEFINED), (_OTHER, 0, _UNDEFINED)]
    return struct.pack("<I", _VERSION) + b"".join(_ENTRY.pack(*e) for e in entries)


def grant(path: Path, uid: int) -> bool:
    """Let `uid` read and write `path` besides its owner.  False when the filesystem has no
    POSIX ACLs: then the file is made mode 0666 (everyone; doctor warns)."""
    if os.stat(path).st_uid == uid:
        return True
    users = acl_users(path)
    if uid in users:
        return True
    try:
        os.setxattr(path, _XATTR, _acl(users | {uid}))
    except OSError as err:
        if err.errno not in _UNSUPPORTED:
            raise
        os.chmod(path, 0o666)
        return False
    return True


def give_to(path: Path, uid: int) -> None:
    """Make `uid` the owner of `path` (mode unchanged); only root can give a file away."""
    if os.stat(path).st_uid != uid:
        os.chown(path, uid, -1)


def world_writable(path: Path) -> bool:
    with contextlib.suppress(OSError):
        return bool(os.stat(path).st_mode & 0o002)
    return False
