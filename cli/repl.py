"""The interactive ``infer run`` loop, like ``ollama run``: ``>>> `` prompts, ``\"\"\"`` blocks, slash commands.

Ctrl+C stops a reply (the part generated so far stays in the history) or, on an empty line, says how
to leave; Ctrl+D and ``/bye`` leave. Help goes to stderr, answers to commands to stdout, as in Ollama.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterator

import typer

from core.errors import BackendError, ModelNotFound
from registry.errors import InvalidName, RegistryError
from registry.names import parse_name

from .chat_session import ChatSession, parse_parameter
from .remote_session import RemoteChatSession
from .common import settings
from .repl_text import USAGE, USAGE_PARAMETERS, USAGE_SET, USAGE_SHORTCUTS, USAGE_SHOW, show

QUOTES = '"""'


def say(text: str = "") -> None:
    typer.echo(text)


def help_text(text: str) -> None:
    typer.echo(text, err=True)


class Repl:
    def __init__(self, session: ChatSession | RemoteChatSession, runner: asyncio.Runner, readline=None) -> None:
        self.session, self.runner, self.readline = session, runner, readline
        self.buffer = ""
        self.multiline: str | None = None  # None, "prompt" or "system"
        self.commands: dict[str, Callable[[list[str]], bool | None]] = {
            "/bye": lambda _: True, "/exit": lambda _: True, "/clear": self.clear, "/set": self.set,
            "/show": self.show, "/load": self.load, "/save": self.save, "/?": self.help, "/help": self.help,
            "/list": lambda _: self.session.list_models(),
        }

    def loop(self) -> None:
        while True:
            try:
                line = input("... " if self.multiline else ">>> ")
            except EOFError:
                say()
                return
            except KeyboardInterrupt:
                if not self._typed():
                    say("\nUse Ctrl + d or /bye to exit.")
                self.buffer, self.multiline = "", None
                continue
            if self.handle(line):
                return

    def handle(self, line: str) -> bool:
        """Process one input line; True means leave."""
        if self.multiline:
            if not self._block_line(line):
                return False
            if self.multiline == "system":
                self._set_system(self.buffer)
                self.buffer = ""
            self.multiline = None
        elif line.startswith(QUOTES):
            if not self._block_line(line[len(QUOTES):], first=True):
                self.multiline = "prompt"
                return False
        elif line.startswith("/"):
            args = line.split()
            command = self.commands.get(args[0])
            if command is None:
                say(f"Unknown command '{args[0]}'. Type /? for help")
                return False
            return bool(command(args))
        else:
            self.buffer += line
        if self.buffer:
            text, self.buffer = self.buffer, ""
            self.send(text)
        return False

    def _block_line(self, text: str, *, first: bool = False) -> bool:
        """Add a line of a \"\"\" block to the buffer; True when it closes the block."""
        if text.endswith(QUOTES):
            self.buffer += text[: -len(QUOTES)]
            return True
        self.buffer += text + "\n" if text or not first else ""
        return False

    def send(self, text: str) -> None:
        try:
            self.runner.run(self.session.send(text))
        except KeyboardInterrupt:
            say("\n")
            self.runner.run(self.session.settle())
        except BackendError as exc:
            say(f"Error: {exc.message}")

    # -- commands: each gets the line split on whitespace; a true result ends the session ------

    def clear(self, args: list[str]) -> None:
        self.session.messages.clear()
        say("Cleared session context")

    def help(self, args: list[str]) -> None:
        topic = args[1] if len(args) > 1 else None
        texts = {"set": USAGE_SET, "/set": USAGE_SET, "show": USAGE_SHOW, "/show": USAGE_SHOW,
                 "shortcut": USAGE_SHORTCUTS, "shortcuts": USAGE_SHORTCUTS}
        if topic is None:
            help_text(USAGE)
        elif topic in texts:
            help_text(texts[topic])

    def set(self, args: list[str]) -> None:
        if len(args) < 2:
            help_text(USAGE_SET)
            return
        what, s = args[1], self.session
        simple = {"wordwrap": "Set 'wordwrap' mode.", "nowordwrap": "Set 'nowordwrap' mode.",
                  "verbose": "Set 'verbose' mode.", "quiet": "Set 'quiet' mode.", "noformat": "Disabled format."}
        if what in ("history", "nohistory"):
            if self.readline is not None:
                self.readline.set_auto_history(what == "history")
        elif what in simple:
            if what in ("verbose", "quiet"):
                s.verbose = what == "verbose"
            if what == "noformat":
                s.format = None
            say(simple[what])
        elif what == "format":
            if len(args) < 3 or args[2] != "json":
                say("Invalid or missing format. For 'json' mode use '/set format json'")
            else:
                s.format = "json"
                say("Set format to 'json' mode.")
        elif what == "parameter":
            self._set_parameter(args[2:])
        elif what == "system":
            self._begin_system(args[2:])
        else:
            say(f"Unknown command '/set {what}'. Type /? for help")

    def _set_parameter(self, args: list[str]) -> None:
        if len(args) < 2:
            help_text(USAGE_PARAMETERS)
            return
        name, values = args[0], args[1:]
        try:
            value = parse_parameter(name, values)
        except ValueError as exc:
            say(f"Couldn't set parameter: {json.dumps(str(exc), ensure_ascii=False)}")
            return
        self.session.options[name] = value
        say(f"Set parameter '{name}' to '{', '.join(values)}'")

    def _begin_system(self, words: list[str]) -> None:
        if not words:
            help_text(USAGE_SET)
            return
        text = " ".join(words)
        if text.startswith(QUOTES):
            self.buffer = ""
            if not self._block_line(text[len(QUOTES):], first=True):
                self.multiline = "system"
                return
            text, self.buffer = self.buffer, ""
        self._set_system(text)

    def _set_system(self, text: str) -> None:
        self.session.system = text
        say("Set system message.")

    def show(self, args: list[str]) -> None:
        if len(args) < 2:
            help_text(USAGE_SHOW)
            return
        show(self.session, args[1])

    def load(self, args: list[str]) -> None:
        if len(args) != 2:
            say("Usage:\n  /load <modelname>")
            return
        say(f"Loading model '{args[1]}'")
        try:
            self.session.details(args[1])
        except ModelNotFound:
            say(f"Couldn't find model '{args[1]}'")
            return
        self.session.model, self.session.messages = args[1], []

    def save(self, args: list[str]) -> None:
        if len(args) != 2:
            say("Usage:\n  /save <modelname>")
            return
        try:
            parse_name(args[1])
        except InvalidName:
            say(f"error: The model name '{args[1]}' is invalid")
            return
        try:
            self.session.save(args[1])
        except RegistryError as exc:
            say(f"Error: {exc}")
            return
        except BackendError as exc:
            say(f"Error: {exc.message}")
            return
        say(f"Created new model '{args[1]}'")

    def _typed(self) -> bool:
        if self.buffer or self.readline is None:
            return bool(self.buffer)
        with contextlib.suppress(Exception):
            return bool(self.readline.get_line_buffer())
        return False


@contextlib.contextmanager
def _line_editing() -> Iterator[object | None]:
    """GNU readline (history in ``$INFER_HOME/history``) when available, plain ``input()`` otherwise."""
    try:
        import readline
    except ImportError:
        yield None
        return
    path = settings().home / "history"
    with contextlib.suppress(OSError):
        readline.read_history_file(path)
    readline.set_history_length(1000)
    try:
        yield readline
    finally:
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(path)


def run_repl(session: ChatSession | RemoteChatSession) -> None:
    with asyncio.Runner() as runner, _line_editing() as readline:
        try:
            for message in session.details().messages:
                _replay(message)
            Repl(session, runner, readline).loop()
        finally:
            runner.run(session.aclose())


def _replay(message: dict) -> None:
    if message.get("role") == "user":
        say(f">>> {message.get('content', '')}")
    elif message.get("role") == "assistant":
        say(f"{message.get('content', '')}\n")
