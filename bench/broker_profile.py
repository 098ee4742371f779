"""Summarise a ``py-spy record --format raw`` profile (collapsed stacks): where the server's time goes.

Usage: python bench/broker_profile.py PROFILE.txt [--top N] [--thread SUBSTRING] [--match SUBSTRING]

Prints, per thread, the share of samples, then the top functions by inclusive share (the function
is anywhere on the stack) and by self share (the function is the innermost frame). ``--match``
keeps only stacks containing that substring; idle samples (py-spy's ``--idle`` is off by default,
so they are absent) are never counted.
"""

from __future__ import annotations

import argparse
import collections
import re


def _frame(name: str) -> str:
    # "func (path/to/file.py:123)" -> "func (file.py)": line numbers split one function in many
    m = re.match(r"(.*?) \((.*?)(?::\d+)?\)$", name.strip())
    if not m:
        return name.strip()
    func, path = m.groups()
    return f"{func} ({path.rsplit('/', 1)[-1]})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--thread", help="only threads whose label contains this")
    parser.add_argument("--match", help="only stacks containing this substring")
    args = parser.parse_args()
    threads: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    self_: collections.Counter[str] = collections.Counter()
    total = 0
    with open(args.profile) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            n = int(count)
            frames = stack.split(";")
            thread = frames[0] if frames[0].startswith(("thread", "process")) else "?"
            if args.thread and args.thread not in thread:
                continue
            if args.match and args.match not in stack:
                continue
            threads[thread] += n
            total += n
            names = [_frame(x) for x in frames[1:]] or [thread]
            for name in set(names):
                inclusive[name] += n
            self_[names[-1]] += n
    print(f"{total} samples")
    for thread, n in threads.most_common():
        print(f"  {n / total:6.1%}  {thread}")
    print("\ninclusive:")
    for name, n in inclusive.most_common(args.top):
        print(f"  {n / total:6.1%}  {name}")
    print("\nself:")
    for name, n in self_.most_common(args.top):
        print(f"  {n / total:6.1%}  {name}")


if __name__ == "__main__":
    main()
