"""Doc tests: the examples in the documentation run, and the errors it explains are the real ones.

Every fenced ``python`` block of README.md, README.zh-CN.md and docs/**/*.md (English and Chinese)
runs as its own program, in a fresh temporary directory, against this checkout. HTML comments
directly above a block (GitHub does not render them) say what the block needs:

``<!-- doctest: setup`` ... ``-->``
    Code run before the block, in the same program: stand-ins for what an example takes from the
    reader's own code (``loader``, ``train_step``, ``model``) or a run for it to read. Visible in
    the Markdown source, so a reader of the source sees exactly what was run.
``<!-- doctest: needs paddle -->``
    The block imports these modules (space-separated); it is skipped, with a reason naming the
    missing one, where they are not installed. (PaddlePaddle is in the ``test`` extra, so CI runs
    these blocks.)
``<!-- doctest: migration before -->`` / ``<!-- doctest: migration after -->``
    The two sides of a "change one import" example: they must differ only in import lines.

An unknown directive fails the collection, so a typo cannot skip a block. Every ``vdl-stream ...``
command in the other fenced blocks (shell examples) is parsed by the command line's own parser, so
a renamed option fails here too; those are not run. Relative links must reach an existing file
and heading, and the signatures written out for ``attach``, ``LogWriter`` and ``SummaryWriter``
must be the code's. The error table of the
Chinese guide (docs/zh-CN/guide.md, "报错信息") is checked against the code: every message it lists
is produced, word for word, by a trigger below, and every trigger's message is listed.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Seconds one block may run (PaddlePaddle's import alone takes a few).
BLOCK_TIMEOUT = 180

# Examples show the default port 8040; a fixed port would collide with whatever else runs on the
# machine (a dashboard left open, a parallel test run), so the blocks serve on a free port.
PRELUDE = """\
import vdl_stream.session as _doctest_session
_doctest_session.attach.__kwdefaults__["port"] = 0
del _doctest_session
"""

_DIRECTIVE = re.compile(r"<!--\s*doctest:\s*(.*?)\s*-->", re.S)
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_PYTHON_INFOS = {"python", "py", "python3", "pycon"}


@dataclass
class Block:
    """One fenced ``python`` block and the directives above it."""

    path: Path
    line: int  # of the opening fence, 1-based
    code: str
    setup: str = ""
    needs: list[str] = field(default_factory=list)
    migration: str | None = None  # "before" or "after"

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT).as_posix()}:{self.line}"


def doc_files() -> list[Path]:
    """The Markdown files whose examples are tested."""
    files = [ROOT / "README.md", ROOT / "README.zh-CN.md"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    return [f for f in files if f.is_file()]


def _apply(block: Block, directive: str, where: str) -> None:
    head, _, rest = directive.partition("\n")
    words = head.split()
    if not words:
        raise ValueError(f"{where}: empty doctest directive")
    if words[0] == "setup" and len(words) == 1:
        block.setup += rest.strip("\n") + "\n"
    elif words[0] == "needs" and len(words) > 1 and not rest.strip():
        block.needs += words[1:]
    elif words[0] == "migration" and words[1:] in (["before"], ["after"]) and not rest.strip():
        block.migration = words[1]
    else:
        raise ValueError(f"{where}: unknown doctest directive {head!r}")


def parse_blocks(path: Path) -> list[Block]:
    """Return the ``python`` blocks of one Markdown file, with their directives applied.

    Raises:
        ValueError: an unknown directive, a directive above something other than a python block,
            or an unclosed fence, naming the file and line.
    """
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    blocks: list[Block] = []
    pending: list[tuple[str, int]] = []  # directives waiting for the next block
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence:
            marker, indent = fence["fence"], len(fence["indent"])
            info = fence["info"].strip().split()
            start = i
            body: list[str] = []
            i += 1
            while i < len(lines) and not re.match(rf"^\s*{re.escape(marker)}\s*$", lines[i]):
                body.append(lines[i][indent:] if lines[i][:indent].isspace() else lines[i])
                i += 1
            if i == len(lines):
                raise ValueError(f"{path}:{start + 1}: unclosed code fence")
            i += 1
            if info and info[0].lower() in _PYTHON_INFOS:
                block = Block(path, start + 1, "\n".join(body) + "\n")
                for directive, at in pending:
                    _apply(block, directive, f"{path}:{at}")
                blocks.append(block)
            elif pending:
                raise ValueError(
                    f"{path}:{pending[0][1]}: doctest directive above a non-python block"
                )
            pending = []
            continue
        stripped = line.strip()
        if stripped.startswith("<!--") and "doctest:" in stripped.split("-->")[0]:
            end = i
            while "-->" not in lines[end]:
                end += 1
                if end == len(lines):
                    raise ValueError(f"{path}:{i + 1}: unclosed HTML comment")
            comment = "\n".join(lines[i : end + 1])
            match = _DIRECTIVE.search(comment)
            if match is None:
                raise ValueError(f"{path}:{i + 1}: malformed doctest directive")
            pending.append((match.group(1), i + 1))
            i = end + 1
            continue
        if stripped and pending:
            raise ValueError(
                f"{path}:{pending[0][1]}: doctest directive not directly above a block"
            )
        i += 1
    if pending:
        raise ValueError(f"{path}:{pending[0][1]}: doctest directive at the end of the file")
    return blocks


def all_blocks() -> list[Block]:
    return [block for path in doc_files() for block in parse_blocks(path)]


def run_block(block: Block, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run one block (prelude, setup, code) as a program in ``cwd``; kill it after the timeout."""
    script = cwd / "doc_block.py"
    script.write_text(
        f"# {block.id}\n{PRELUDE}\n# --- setup\n{block.setup}\n# --- the example\n{block.code}",
        encoding="utf-8",
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM"):
        env.pop(name, None)  # the examples are single-process jobs
    proc = subprocess.Popen(
        # A RuntimeWarning from vdl-stream means the example is broken (an unreachable broker, a
        # flush not confirmed), so it fails the block.
        [sys.executable, "-W", "error::RuntimeWarning", str(script)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # so that a timeout kills whatever the block started
    )
    try:
        out, _ = proc.communicate(timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return subprocess.CompletedProcess(proc.args, -signal.SIGKILL, out + "\n[timed out]")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out)


BLOCKS = all_blocks()


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_example_runs(block: Block, tmp_path: Path) -> None:
    missing = [name for name in block.needs if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"{block.id} needs {', '.join(missing)}, which is not installed")
    result = run_block(block, tmp_path)
    assert result.returncode == 0, f"{block.id} failed (exit {result.returncode}):\n{result.stdout}"


def test_every_document_with_examples_is_collected() -> None:
    counts: dict[str, int] = {}
    for block in BLOCKS:
        name = block.path.relative_to(ROOT).as_posix()
        counts[name] = counts.get(name, 0) + 1
    for name, least in {
        "README.md": 1,
        "README.zh-CN.md": 3,
        "docs/guide.md": 3,
        "docs/zh-CN/guide.md": 3,
        "docs/zh-CN/integrations.md": 2,
        "docs/interop.md": 1,
    }.items():
        assert counts.get(name, 0) >= least, f"{name}: {counts.get(name, 0)} python blocks found"


def test_a_broken_example_fails(tmp_path: Path) -> None:
    """The runner reports a block that raises, and one that uses a name nobody defined."""
    path = ROOT / "docs" / "guide.md"
    for code in ("import vdl_stream\nvdl_stream.attach(run='/abs')\n", "print(loader)\n"):
        result = run_block(Block(path, 1, code), tmp_path)
        assert result.returncode != 0, code
        assert "Error" in result.stdout, result.stdout


def test_a_timed_out_example_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "BLOCK_TIMEOUT", 1)
    result = run_block(Block(ROOT / "README.md", 1, "import time\ntime.sleep(60)\n"), tmp_path)
    assert result.returncode != 0
    assert "[timed out]" in result.stdout


def test_directives_are_checked(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "<!-- doctest: setup\nx = 1\n-->\n<!-- doctest: needs paddle -->\n```python\nprint(x)\n```\n"
    )
    [block] = parse_blocks(doc)
    assert block.setup == "x = 1\n" and block.needs == ["paddle"] and block.code == "print(x)\n"
    for bad in (
        "<!-- doctest: need paddle -->\n```python\npass\n```\n",
        "<!-- doctest: needs paddle -->\nsome text\n```python\npass\n```\n",
        "<!-- doctest: needs paddle -->\n```bash\nls\n```\n",
        "```python\npass\n",
    ):
        doc.write_text(bad)
        with pytest.raises(ValueError):
            parse_blocks(doc)


def cli_examples() -> list[tuple[str, list[str]]]:
    """Each ``vdl-stream ...`` command in a fenced block that is not python: (file:line, argv)."""
    found = []
    for path in doc_files():
        fence = None
        pending = ""  # a shell line continued with a trailing backslash
        for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
            if fence is not None and line.endswith("\\"):
                pending += line[:-1]
                continue
            line, pending = pending + line, ""
            match = _FENCE.match(line)
            if match and (fence is None or match["fence"] == fence):
                fence = None if fence else match["fence"]
                continue
            if fence is None:
                continue
            if not re.search(r"(^|[\s;&|])vdl-stream\s", line):
                continue
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            command: list[str] = []
            for token in [*lexer, ";"]:  # a shell line: commands joined by operators
                if token and set(token) <= set(";&|<>()"):
                    if command[:1] == ["vdl-stream"]:
                        where = f"{path.relative_to(ROOT).as_posix()}:{number}"
                        found.append((where, command[1:]))
                    # a redirection's target is not a command
                    command = ["<redirect>"] if set(token) <= set("<>") else []
                elif command[:1] != ["<redirect>"]:
                    command.append(token)
    return found


CLI_EXAMPLES = cli_examples()


@pytest.mark.parametrize(("where", "argv"), CLI_EXAMPLES, ids=[w for w, _ in CLI_EXAMPLES])
def test_command_line_example_parses(where: str, argv: list[str]) -> None:
    """The commands shown are accepted by the command line (parsed, not run)."""
    from vdl_stream.cli import build_parser

    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"{where}: vdl-stream {shlex.join(argv)} is refused (exit {exc.code})")


def test_command_line_examples_are_collected() -> None:
    commands = {argv[0] for _, argv in CLI_EXAMPLES}
    assert {"demo", "import", "export", "replay"} <= commands, commands


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    anchors: set[str] = set()
    in_fence = False
    for line in path.read_text(encoding="utf-8").split("\n"):
        if _FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and (heading := re.match(r"#{1,6}\s+(.*)", line)):
            slug, n = _slug(heading.group(1)), 1
            while slug in anchors:  # repeated headings get -1, -2, ...
                slug = f"{_slug(heading.group(1))}-{n}"
                n += 1
            anchors.add(slug)
    return anchors


def test_links_between_documents_resolve() -> None:
    """Relative links name files that exist and, after ``#``, headings that exist."""
    broken = []
    for path in doc_files():
        text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):  # http:, mailto:
                continue
            file_part, _, fragment = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
            elif fragment and linked.suffix == ".md" and fragment not in _anchors(linked):
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def _signature_text(func: Callable[..., object]) -> str:
    """``name(a=1, *, b="x", **kwargs)`` as the docs write it: defaults, no annotations."""
    import inspect

    parts, star = [], False
    for param in inspect.signature(func).parameters.values():
        if param.kind is param.VAR_KEYWORD:
            parts.append(f"**{param.name}")
            continue
        if param.kind is param.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        default = param.default
        text = param.name
        if default is not param.empty:
            text += "=" + (f'"{default}"' if isinstance(default, str) else repr(default))
        parts.append(text)
    return f"{func.__name__}({', '.join(parts)})"


def test_documented_signatures_match_the_code() -> None:
    """Each ``attach(logdir=...)``, ``LogWriter(logdir=...)``, ``SummaryWriter(log_dir=...)`` span."""
    import vdl_stream

    objects = {
        "attach": vdl_stream.attach,
        "LogWriter": vdl_stream.LogWriter.__init__,
        "SummaryWriter": vdl_stream.SummaryWriter.__init__,
    }
    expected = {
        name: _signature_text(func).replace("__init__(self, ", f"{name}(")
        for name, func in objects.items()
    }
    seen, wrong = 0, []
    for path in doc_files():
        text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
        for span in re.findall(r"`([^`]+)`", text):
            span = re.sub(r"\s+", " ", span).removeprefix("vdl_stream.")
            match = re.match(r"(attach|LogWriter|SummaryWriter)\((logdir|log_dir)=", span)
            if match:
                seen += 1
                if span != expected[match.group(1)]:
                    wrong.append(
                        f"{path.relative_to(ROOT)}: {span}\n  code: {expected[match.group(1)]}"
                    )
    assert seen >= 5, f"only {seen} documented signatures found"
    assert not wrong, "\n".join(wrong)


def _import_lines(code: str) -> tuple[list[str], list[str]]:
    lines = code.strip("\n").split("\n")
    imports = [line for line in lines if re.match(r"\s*(import|from)\s", line)]
    return imports, [line for line in lines if line not in imports]


def test_migration_examples_change_only_imports() -> None:
    pairs: dict[Path, dict[str, Block]] = {}
    for block in BLOCKS:
        if block.migration:
            sides = pairs.setdefault(block.path, {})
            assert block.migration not in sides, f"{block.id}: two 'migration {block.migration}'"
            sides[block.migration] = block
    assert pairs, "no migration example found"
    for path, sides in pairs.items():
        assert set(sides) == {"before", "after"}, f"{path}: a migration example lacks a side"
        before_imports, before_rest = _import_lines(sides["before"].code)
        after_imports, after_rest = _import_lines(sides["after"].code)
        assert before_rest == after_rest, f"{path}: the migration example changes more than imports"
        assert before_imports != after_imports
        assert any("visualdl" in line for line in before_imports)
        assert any("vdl_stream" in line for line in after_imports)


# --- the error table of the Chinese guide ----------------------------------------------------

ERROR_DOC = ROOT / "docs" / "zh-CN" / "guide.md"


def documented_errors() -> list[tuple[str, str]]:
    """The rows of the tables under "## 报错信息" of the zh guide: (message, what raises it).

    What raises it is an exception or warning class (its last dotted part counts) or, for the
    command line, ``退出码 N`` (the exit status).
    """
    text = ERROR_DOC.read_text(encoding="utf-8")
    section = text.split("\n## 报错信息", 1)[1].split("\n## ", 1)[0]
    messages = []
    for line in section.split("\n"):
        cell = re.match(r"\|\s*`([^`]+)`\s*\|\s*([^|]+?)\s*\|", line)
        if cell:
            kind = cell.group(2).strip("`").rsplit(".", 1)[-1]
            messages.append((cell.group(1), kind))
    return messages


def _pattern(documented: str) -> re.Pattern[str]:
    """``<name>`` in a documented message stands for a part that varies (a path, a pid)."""
    parts = re.split(r"<[a-z_]+>", documented)
    return re.compile(".+?".join(re.escape(part) for part in parts), re.S)


#: What a trigger saw: (exception or warning class name, or "退出码 N"; the message).
Produced = list[tuple[str, str]]


class Triggers:
    """Each documented message and a function that makes the code produce it (what it saw)."""

    def __init__(self, tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.tmp = tmp
        self.capsys = capsys
        self._writer = None

    def writer(self):
        import vdl_stream

        if self._writer is None:
            self._writer = vdl_stream.attach(self.tmp / "logs", run="exp1", telemetry=False)
        return self._writer

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

    @staticmethod
    def raised(call: Callable[[], object]) -> Produced:
        try:
            call()
        except Exception as exc:
            return [(type(exc).__name__, str(exc))]
        return []

    def cli(self, *argv: object) -> Produced:
        from vdl_stream import cli

        self.capsys.readouterr()
        try:
            status: object = cli.main([str(a) for a in argv])
        except SystemExit as exc:  # argparse's errors exit
            status = exc.code
        lines = self.capsys.readouterr().err.strip().split("\n")
        return [(f"退出码 {status}", line) for line in lines]

    def warned(self, call: Callable[[], object]) -> Produced:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        return [(w.category.__name__, str(w.message)) for w in caught]

    def table(self) -> dict[str, Callable[[], Produced]]:
        import vdl_stream
        from vdl_stream import LogWriter

        w = self.writer
        tmp = self.tmp
        (tmp / "a-file").touch()
        run = tmp / "logs" / "exp1"

        def closed() -> Produced:
            other = vdl_stream.attach(tmp / "logs", run="closed", telemetry=False)
            other.close()
            return self.raised(lambda: other.add_scalar("loss", 1.0, 1))

        def locked() -> Produced:
            w()  # holds logs/exp1
            return self.raised(lambda: vdl_stream.attach(run.parent, run="exp1"))

        def port_taken(call: Callable[[int], Produced]) -> Produced:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                sock.listen()
                return call(sock.getsockname()[1])

        def unreachable() -> Produced:
            def go() -> None:
                with socket.socket() as sock:  # a port that nobody listens on
                    sock.bind(("127.0.0.1", 0))
                    port = sock.getsockname()[1]
                remote = vdl_stream.attach(
                    url=f"ws://127.0.0.1:{port}", run="remote", telemetry=False
                )
                remote.add_scalar("loss", 1.0, 1)
                remote.flush(timeout=1.0)
                remote.add_scalar("loss", 1.0, 2)
                remote.close(timeout=0.5)

            return self.warned(go)

        def existing_import() -> Produced:
            source = tmp / "vdl_log"
            source.mkdir(exist_ok=True)
            fixture = ROOT / "tests" / "data" / "visualdl" / "vdlrecords.1700000000.log"
            (source / fixture.name).write_bytes(fixture.read_bytes())
            self.cli("import", source, "--logdir", tmp / "imported", "--quiet")
            return self.cli("import", source, "--logdir", tmp / "imported", "--quiet")

        return {
            "tag must be a non-empty str, got int 3": lambda: self.raised(
                lambda: w().add_scalar(3, 0.5, 1)
            ),
            "step must be an int, got float 1.0": lambda: self.raised(
                lambda: w().add_scalar("loss", 0.5, 1.0)
            ),
            "step must be in the int64 range [-2**63, 2**63 - 1], got 9223372036854775808": lambda: (
                self.raised(lambda: w().add_scalar("loss", 0.5, 2**63))
            ),
            "value must be a real number or a one-element tensor, got str '0.5'": lambda: (
                self.raised(lambda: w().add_scalar("loss", "0.5", 1))
            ),
            "walltime must be a finite number of seconds, got nan": lambda: self.raised(
                lambda: w().add_scalar("loss", 0.5, 1, walltime=float("nan"))
            ),
            "img must be uint8 (0..255) or float (0..1), got dtype int64": lambda: self.raised(
                lambda: w().add_image("img", np.zeros((8, 8, 3), dtype=np.int64), 1)
            ),
            "img with dataformats='CHW' must have C of 1, 3 or 4 channels, got shape (5, 8, 8)": (
                lambda: self.raised(
                    lambda: w().add_image(
                        "img", np.zeros((5, 8, 8), np.uint8), 1, dataformats="CHW"
                    )
                )
            ),
            "buckets must be from 1 to 10000, got 0": lambda: self.raised(
                lambda: w().add_histogram("fc/w", [1.0, 2.0], 1, buckets=0)
            ),
            "text_string must be a str, got bytes b'done'": lambda: self.raised(
                lambda: w().add_text("log", b"done", 1)
            ),
            "hparams_dict['lr'] must be a str, int, float or bool, got NoneType": lambda: (
                self.raised(lambda: w().add_hparams({"lr": None}, ["train/loss"]))
            ),
            "labels must be 0 or 1 (or bool), got 2.0": lambda: self.raised(
                lambda: w().add_pr_curve("pr", [0, 2], [0.1, 0.2], 1)
            ),
            "predictions must be probabilities in [0, 1], got 1.5": lambda: self.raised(
                lambda: w().add_pr_curve("pr", [0, 1], [0.1, 1.5], 1)
            ),
            "writer for run 'closed' is closed": closed,
            "run must be a relative path of plain names, got '/abs'": lambda: self.raised(
                lambda: vdl_stream.attach(tmp / "logs", run="/abs")
            ),
            "run must not contain invisible, control or unencodable characters, got '\\u202e' "
            "(U+202E) in 'a\\u202eb'": lambda: self.raised(
                lambda: vdl_stream.attach(tmp / "logs", run="a\u202eb")
            ),
            "<path>/exp1: the run is already open in another RunWriter (process <pid>)": locked,
            "[Errno 20] cannot record a run in <path>/a-file/exp1: Not a directory": lambda: (
                self.raised(lambda: vdl_stream.attach(tmp / "a-file", run="exp1"))
            ),
            "[Errno <n>] port <port> on 127.0.0.1 is already in use; choose another with --port "
            "(or port= in attach()), or 0 for any free port": lambda: port_taken(
                lambda port: self.raised(
                    lambda: vdl_stream.attach(tmp / "logs", run="p", serve=True, port=port)
                )
            ),
            "refusing to serve on 0.0.0.0 without a token: anyone who can reach it could read "
            "and write your runs. Pass --token T (the page then needs ?token=T), or --insecure.": (
                lambda: self.raised(lambda: vdl_stream.attach(serve=True, host="0.0.0.0"))
            ),
            "token must not be empty or blank, got ''; is the variable that should hold it set?": (
                lambda: self.raised(lambda: vdl_stream.attach(serve=True, token=""))
            ),
            "serve=True runs a broker in this process; it cannot go with url=": lambda: self.raised(
                lambda: vdl_stream.attach(serve=True, url="ws://127.0.0.1:8040")
            ),
            "unexpected keyword argument 'sync'": lambda: self.raised(
                lambda: LogWriter(tmp / "logs" / "facade", sync=True)
            ),
            "logdir must name a directory under a parent, got '/'": lambda: self.raised(
                lambda: LogWriter("/")
            ),
            "vdl-stream: cannot reach the broker at ws://127.0.0.1:<port>/ws/ingest (<reason>); "
            "training continues and batches are re-sent when it is back": unreachable,
            "vdl-stream: flush of run 'remote' not confirmed within the timeout; the data stays "
            "queued": unreachable,
            "vdl-stream: --logdir <path> is not a directory": lambda: self.cli(
                "serve", "--logdir", tmp / "a-file"
            ),
            "vdl-stream: port <port> on 127.0.0.1 is already in use; choose another with --port "
            "(or port= in attach()), or 0 for any free port": lambda: port_taken(
                lambda port: self.cli("serve", "--logdir", tmp / "logs", "--port", port)
            ),
            "vdl-stream serve: error: argument --cache-mb: must be a positive integer, got '0'": (
                lambda: self.cli("serve", "--cache-mb", "0")
            ),
            "vdl-stream import: <path>: no such file or directory": lambda: self.cli(
                "import", tmp / "missing", "--logdir", tmp / "imported"
            ),
            "vdl-stream import: <path>: not a TensorBoard event file (events.out.tfevents.*) or a "
            "VisualDL record file (vdlrecords.*.log)": lambda: self.cli(
                "import", tmp / "a-file", "--logdir", tmp / "imported"
            ),
            "vdl-stream import: run 'vdl_log' already exists in <path>; import into another "
            "--logdir or remove it first": existing_import,
            "vdl-stream export: <path>: not a run directory (no such directory)": lambda: self.cli(
                "export", tmp / "logs" / "missing"
            ),
            "vdl-stream export: --tag is not a valid regular expression: <reason>": lambda: (
                self.cli("export", run, "--tag", "(")
            ),
            "vdl-stream export: no scalar tags in <path> match": lambda: self.cli(
                "export", run, "--tag", "^nothing$", "-o", tmp / "out.csv"
            ),
            "vdl-stream replay: <path>: neither a run directory nor a log directory of runs": (
                lambda: self.cli("replay", tmp / "missing")
            ),
            "vdl-stream replay: speed must be a positive number or 'max', got '0'": lambda: (
                self.cli("replay", run, "--speed", "0")
            ),
        }


def test_the_zh_guide_explains_the_real_error_messages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    documented = documented_errors()
    messages = [message for message, _ in documented]
    triggers = Triggers(tmp_path, capsys)
    try:
        table = triggers.table()
        assert len(messages) == len(set(messages)), "a message is listed twice"
        assert sorted(messages) == sorted(table), (
            "the zh guide's error table and the triggers in tests/test_docs.py differ: "
            f"only documented {sorted(set(messages) - set(table))}, "
            f"only triggered {sorted(set(table) - set(messages))}"
        )
        for message, kind in documented:
            produced = table[message]()
            pattern = _pattern(message)
            assert (kind, True) in {(k, bool(pattern.fullmatch(text))) for k, text in produced}, (
                f"documented: {kind} {message!r}\nproduced:   {produced!r}"
            )
    finally:
        triggers.close()
