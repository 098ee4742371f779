"""Following other processes' runs cheaply: what one round of ``Broker.follow`` looks at.

A round has to notice, in every run of the log directory, what another process did since the
last round: records appended to the head segment (the only file a writer changes in place), and
files created, renamed or removed (a new segment, a compacted block, an index checkpoint). Listing
and statting every file of every run finds both, but costs a directory listing and a stat per
file of every run, each round, even when nothing changed (about 40 ms of CPU a round over 1,000
finished runs).

Here a round looks at two things per run, without listing it:

* the run directory's ``(st_ino, st_size, st_mtime_ns)``: a directory's modification time
  changes whenever an entry in it is created, removed or renamed;
* the head segment's size and modification time, compared with the run's last signature: an
  append always grows it.

Only a run where either changed is listed and statted in full (``sign``), as before. The same
holds for discovery: a directory of the log directory is listed again only when its own key
changed, so finding new runs costs one stat per directory.

Two things make a directory's modification time a weaker witness than a listing, and both are
covered:

* Coarse timestamps. A directory's mtime has the granularity of the filesystem (a kernel tick
  on Linux, 1 s on ext3 and HFS+, 2 s on FAT): an entry created in the same tick as the mtime
  last seen leaves it unchanged. So a key is trusted only when its mtime is at least
  ``RACY_NS`` older than the moment it was taken (as git treats "racily clean" index entries);
  a directory changed more recently is listed again every round until it has been quiet that
  long.
* Filesystems that do not keep directory mtimes faithfully (some network mounts with attribute
  caching, FUSE mounts of object stores, or a server whose clock is far from ours). As a safety
  net every run and every directory is listed in full once every ``RECHECK_ROUNDS`` rounds,
  spread over the rounds (each name has its own turn), so no round pays for all of them.

All functions here block (they stat and list files): the broker calls them in a worker thread.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from recorder.catalog import SEGMENT_RE

#: A directory's modification time is trusted only once it is this much older than the moment
#: it was read (covers 2 s timestamp granularity, the coarsest of common filesystems).
RACY_NS = 2_500_000_000
#: Every run and directory is listed in full at least once every this many rounds, whatever
#: its modification times say.
RECHECK_ROUNDS = 30

#: A directory's ``(st_ino, st_size, st_mtime_ns)`` and when it was read (``time.time_ns()``).
DirKey = tuple[tuple[int, int, int], int]
#: A run's signature: its data files' ``(name, size, mtime_ns)``, sorted by name.
Signature = tuple


@dataclass(frozen=True)
class FollowStatistics:
    """What the follow loop looked at (``Broker.follow_statistics()``).

    Attributes:
        rounds: rounds of the follow loop so far.
        dirs_statted: directories of the log directory statted by the last round's discovery.
        dirs_listed: directories it listed (new, changed, or on their recheck turn).
        runs_probed: followed runs the last round checked.
        runs_listed: runs it listed and statted file by file (changed, racy, or on their
            recheck turn); an idle round over finished runs lists about
            ``runs / RECHECK_ROUNDS``.
        files_statted: files statted one by one by the last round (each probed run's head
            segment, and every data file of each listed run).
    """

    rounds: int
    dirs_statted: int
    dirs_listed: int
    runs_probed: int
    runs_listed: int
    files_statted: int


def dir_key(path: str | os.PathLike[str], follow: bool = False) -> DirKey:
    """Stat directory ``path`` (following a symbolic link only if ``follow``) and return its
    :data:`DirKey`.

    Raises:
        OSError: it cannot be statted.
    """
    now = time.time_ns()
    st = os.stat(path, follow_symlinks=follow)
    return (st.st_ino, st.st_size, st.st_mtime_ns), now


def _trusted(key: DirKey | None) -> bool:
    """Whether an unchanged ``key`` proves that the directory's entries did not change."""
    return key is not None and key[0][2] <= key[1] - RACY_NS


def _turn(name: str, round_: int) -> bool:
    """Whether ``name`` is listed in full this round whatever its keys say (the safety net)."""
    return (zlib.crc32(name.encode()) + round_) % RECHECK_ROUNDS == 0


def head_segment(signature: Signature | None) -> tuple[str, int, int] | None:
    """The head segment's entry in ``signature``: the highest-numbered one, the only file a
    writer appends to or truncates in place (None when there is none)."""
    heads = [e for e in signature or () if SEGMENT_RE.match(e[0])]
    if not heads:
        return None
    return max(heads, key=lambda e: int(SEGMENT_RE.match(e[0]).group(1)))


@dataclass
class _Dir:
    key: DirKey
    subdirs: tuple[str, ...]
    is_run: bool


class FollowState:
    """What the follow loop of one broker remembers between rounds: each directory of the log
    directory with its key and entries, and the counters of :class:`FollowStatistics`.

    Args:
        logdir: the log directory.
    """

    def __init__(self, logdir: str | os.PathLike[str]) -> None:
        self.root = os.fspath(logdir)
        self._dirs: dict[str, _Dir] = {}  # relative path ("." for the root) -> what it held
        # run name -> (its signature, that signature's head segment), found once per signature
        self._heads: dict[str, tuple[Signature, tuple[str, int, int] | None]] = {}
        # This round's keys of the directories discovery statted (by run name): the tail's
        # check uses them rather than statting each run directory a second time.
        self._keys: dict[str, DirKey] = {}
        self.rounds = 0
        self._now = [0, 0, 0, 0, 0]  # this round's dirs_statted .. files_statted
        self._last = (0, 0, 0, 0, 0)

    def start_round(self) -> None:
        """Begin a round: the counters of the round before become :meth:`statistics`."""
        if self.rounds:
            self._last = tuple(self._now)
        self._now = [0, 0, 0, 0, 0]
        self._keys.clear()
        self.rounds += 1

    def statistics(self) -> FollowStatistics:
        """Return the counters of the last complete round."""
        return FollowStatistics(self.rounds, *self._last)

    # -- discovery --------------------------------------------------------------------------------

    def find_runs(self) -> list[str]:
        """Names of the runs under the log directory, as :func:`recorder.list_runs` gives them
        (relative, "/"-separated, sorted; symbolic links to directories are not entered), but
        listing only directories whose key changed since the last call (blocking).

        Raises:
            NotADirectoryError: the log directory exists but is not a directory.
        """
        if not os.path.exists(self.root):
            self._dirs.clear()
            return []
        if not os.path.isdir(self.root):
            raise NotADirectoryError(f"{self.root}: logdir is not a directory")
        runs = []
        seen = set()
        stack = ["."]
        while stack:
            rel = stack.pop()
            path = self.root if rel == "." else os.path.join(self.root, rel)
            try:
                # The log directory itself may be a link (as os.walk, its target is walked):
                # its key is the target's, whose mtime moves when a run is created there.
                key = dir_key(path, follow=rel == ".")
            except OSError:
                continue  # removed meanwhile, or unreadable: as os.walk, left out
            self._now[0] += 1
            old = self._dirs.get(rel)
            if (
                old is None
                or old.key[0] != key[0]
                or not _trusted(old.key)
                or _turn(rel, self.rounds)
            ):
                try:
                    old = self._list_dir(path, key)
                except OSError:
                    self._dirs.pop(rel, None)
                    continue
                self._dirs[rel] = old
                self._now[1] += 1
            seen.add(rel)
            if old.is_run and rel != ".":
                name = rel.replace(os.sep, "/")
                runs.append(name)
                self._keys[name] = key
            stack.extend(name if rel == "." else os.path.join(rel, name) for name in old.subdirs)
        for rel in [r for r in self._dirs if r not in seen]:
            del self._dirs[rel]  # removed: forgotten, so a directory made there is listed anew
        return sorted(runs)

    @staticmethod
    def _list_dir(path: str, key: DirKey) -> _Dir:
        subdirs, is_run = [], False
        with os.scandir(path) as it:
            for entry in it:
                if entry.is_dir():
                    if not entry.is_symlink():  # as os.walk(followlinks=False)
                        subdirs.append(entry.name)
                elif SEGMENT_RE.match(entry.name):
                    is_run = True
        return _Dir(key, tuple(subdirs), is_run)

    # -- tailing ----------------------------------------------------------------------------------

    def check_runs(
        self,
        runs: Sequence[tuple[str, Path, Signature | None, DirKey | None]],
        sign: Callable[[Path], Signature],
        errors: tuple[type[BaseException], ...],
    ) -> list[tuple[bool, Signature | None, DirKey | None]]:
        """Check which of ``runs`` changed since their signatures were taken (blocking).

        Args:
            runs: ``(name, path, signature, key)`` of each followed run: its last signature,
                and its directory's key read before that signature was taken (None: unknown).
            sign: lists and stats one run's files (the broker's signature).
            errors: what ``sign`` raises for a run it cannot read.

        Returns:
            For each run, ``(listed, signature, key)``: ``listed`` False when the run's
            directory and head segment are as its signature says (then nothing else is
            returned); otherwise its fresh signature (None where ``sign`` or a stat failed:
            the run is polled, and its error reported there) and the directory key read just
            before it.
        """
        out: list[tuple[bool, Signature | None, DirKey | None]] = []
        for name, path, signature, key in runs:
            self._now[2] += 1
            # Read earlier in this round by discovery, or now: either is older than a listing
            # made below, which is what a key kept with a signature must be.
            now = self._keys.get(name)
            if now is None:
                try:
                    now = dir_key(path)
                except OSError:
                    out.append((True, None, None))
                    continue
            if (
                signature is not None
                and key is not None
                and now[0] == key[0]
                and _trusted(key)
                and not _turn(name, self.rounds)
                and self._head_unchanged(name, path, signature)
            ):
                out.append((False, None, None))
                continue
            self._now[3] += 1
            try:
                fresh = sign(path)
            except (OSError, *errors):
                out.append((True, None, None))
                continue
            self._now[4] += len(fresh)
            out.append((True, fresh, now))
        if len(self._heads) > len(runs):
            names = {name for name, _, _, _ in runs}
            for name in [n for n in self._heads if n not in names]:
                del self._heads[name]
        return out

    def _head_unchanged(self, name: str, path: Path, signature: Signature) -> bool:
        cached = self._heads.get(name)
        if cached is not None and cached[0] is signature:
            head = cached[1]
        else:
            head = head_segment(signature)
            self._heads[name] = (signature, head)
        if head is None:
            return True  # only blocks: a writer that comes back creates a segment (a new entry)
        self._now[4] += 1
        try:
            st = os.stat(os.path.join(path, head[0]), follow_symlinks=False)
        except OSError:
            return False  # compacted away, or replaced: the listing tells
        return (st.st_size, st.st_mtime_ns) == (head[1], head[2])


def signed(path: Path, sign: Callable[[Path], Signature]) -> tuple[Signature, DirKey | None]:
    """``sign(path)`` and the directory key read just before it (blocking), to keep as a
    run's signature and key (a key that cannot be read is None: the run is listed next round).

    Raises:
        whatever ``sign`` raises.
    """
    try:
        key: DirKey | None = dir_key(path)
    except OSError:
        key = None
    return sign(path), key
