"""The command line's edges: the options every command takes, what it writes, and how it ends.

Global options (``-v``, ``-q``, ``--log-format``) belong to the group and to every command,
so they may come before the command or after it. With ``--log-format json`` every line the
process writes is one JSON object: log lines on stderr, each command's result on stdout
(`say`), usage errors, and even a bug's traceback (exit 1), so a log collector never meets a
line that is not JSON.

Library code raises the package's exceptions; here each becomes one clear message on stderr
(or one JSON log line) and the documented exit status, and SIGTERM and SIGHUP stop a run the
way Ctrl-C does.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import click

from batchscore.errors import BatchscoreError
from batchscore.observe.logs import json_line, setup_logging
from batchscore.observe.streams import Standard

log = logging.getLogger("batchscore")
SETTINGS = "batchscore.logging"  # the key of `Settings` in click's context meta
FORMATS = ("text", "json")  # --log-format's values


@dataclass
class Settings:
    """The global options (``-v``, ``-q``, ``--log-format``) of one command line, given before
    the command or after it: one object shared by the group's and the command's contexts."""

    verbose: bool = False
    quiet: bool = False
    log_format: str = "text"
    applied: tuple[int, str] | None = None  # the logging set up so far: (level, format)


def settings(ctx: click.Context | None = None) -> Settings:
    """This command line's global options (the defaults outside a command line)."""
    ctx = ctx or click.get_current_context(silent=True)
    if ctx is None:
        return Settings()
    return ctx.meta.setdefault(SETTINGS, Settings())


def json_logs(ctx: click.Context | None = None) -> bool:
    return settings(ctx).log_format == "json"


def remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A global option's callback: given before the command or after it, it counts the same
    (`Settings` is shared by both contexts); one not given leaves the other's."""
    if value:
        setattr(settings(ctx), str(param.name), value)
    return value


def global_options() -> list[click.Option]:
    """``-v``, ``-q`` and ``--log-format``: options of the group and of every command, so a
    user (or cron) may put them before the command or after it."""
    return [
        click.Option(
            ["-v", "--verbose"],
            is_flag=True,
            expose_value=False,
            callback=remember,
            help="Log debugging detail: why each choice was made, each chunk committed.",
        ),
        click.Option(
            ["-q", "--quiet"],
            is_flag=True,
            expose_value=False,
            callback=remember,
            help="Log warnings and errors only; `run` prints no summary.",
        ),
        click.Option(
            ["--log-format"],
            type=click.Choice(FORMATS, case_sensitive=False),
            expose_value=False,
            callback=remember,
            help="Log lines for people (text, the default), or one JSON object per line, "
            "results on stdout included, for log collectors.",
        ),
    ]


def configure(ctx: click.Context) -> None:
    """Set up logging as the global options say, once they are all parsed (again when an
    option after the command changed what the group set up)."""
    given = settings(ctx)
    if given.verbose and given.quiet:
        raise click.UsageError("-v and -q ask for opposite things; give one of them", ctx)
    level = logging.DEBUG if given.verbose else logging.WARNING if given.quiet else logging.INFO
    if given.applied != (level, given.log_format):
        setup_logging(level, given.log_format, terminal=sys.stderr.isatty())
        given.applied = (level, given.log_format)


def configured(ctx: click.Context) -> None:
    """`configure`, its usage error written as JSON where the command line asks for JSON."""
    try:
        configure(ctx)
    except click.UsageError as exc:
        if not json_logs():
            raise
        click.echo(usage_error_line(exc, ctx), err=True)
        raise click.exceptions.Exit(exc.exit_code) from None


class JsonUsage:
    """What click itself writes is one JSON object a line when the command line asks for JSON
    logs, as every other line is (else click's text): a usage error (an unknown option or
    command, a bad value, a missing argument) is one error line on stderr, and help one
    object on stdout. JSON is asked for by ``--log-format json`` anywhere on the line, so it
    is known before click parses a thing: help and the first parse error come before the
    option's own turn."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if asked := asked_format(args):  # the last one given counts, as click takes it
            settings(ctx).log_format = asked
        if any("\x00" in arg for arg in args):  # no path or value holds one (os.stat raises)
            raise click.UsageError("an argument holds a NUL byte, which no path or value can", ctx)
        return super().parse_args(ctx, args)  # type: ignore[misc]

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        asked = asked_format(args) == "json"  # before click's parser consumes the list
        try:
            return super().make_context(info_name, args, parent, **extra)  # type: ignore[misc]
        except click.ClickException as exc:
            raise as_json(exc, getattr(exc, "ctx", None) or parent, asked) from None

    def get_help_option(self, ctx: click.Context) -> click.Option | None:
        """The help option, whose help is one JSON object under JSON logs."""
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            option.callback = show_help
        return option


def show_help(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """-h and --help: the help as click writes it, or under JSON logs one object whose
    ``message`` is its first line and ``help`` the whole text."""
    if not value or ctx.resilient_parsing:
        return
    text = ctx.get_help()
    if json_logs(ctx):
        say(text, event="help", product=True, help=text)
    else:
        deliver(text, color=ctx.color)
    ctx.exit()


def version_option(version: str) -> Callable[[Any], Any]:
    """--version: ``batchscore, version X``, or under JSON logs one object carrying it."""

    def show(ctx: click.Context, param: click.Parameter, value: bool) -> None:
        if not value or ctx.resilient_parsing:
            return
        text = f"batchscore, version {version}"
        if json_logs(ctx):
            say(text, event="version", product=True, version=version)
        else:
            deliver(text, color=ctx.color)
        ctx.exit()

    return click.option(
        "--version",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=show,
        help="Show the version and exit.",
    )


def as_json(exc: click.ClickException, ctx: click.Context | None, asked: bool = False) -> Exception:
    """``exc`` for click to show, or under JSON logs (``asked`` on the command line, or set
    up in ``ctx``) written here as one JSON error line, leaving an `Exit` with its status."""
    if not asked and (ctx is None or not json_logs(ctx)):
        return exc
    click.echo(usage_error_line(exc, ctx), err=True)
    return click.exceptions.Exit(exc.exit_code)


class Command(JsonUsage, click.Command):
    """A batchscore command: the global options are its own too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.extend(global_options())

    def invoke(self, ctx: click.Context) -> Any:
        configured(ctx)
        return super().invoke(ctx)


class Group(JsonUsage, click.Group):
    """The `batchscore` group: its commands are `Command`s."""

    command_class = Command

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.extend(global_options())

    def invoke(self, ctx: click.Context) -> Any:
        """The command named (a name it does not know, or none, is a usage error here)."""
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            raise as_json(exc, getattr(exc, "ctx", None) or ctx) from None


def chosen_progress(progress: str) -> str:
    """``--progress``: "auto" is a bar on a terminal and log lines elsewhere (or with -q)."""
    if progress == "auto":
        quiet = settings().quiet
        return "bar" if sys.stderr.isatty() and not json_logs() and not quiet else "log"
    if progress == "bar" and json_logs():
        return "log"  # a bar is no JSON line: its counts go out as log lines instead
    return progress


SET = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="SECTION.KEY=VALUE",
    help="Override a job key; the value is read as TOML (repeatable).",
)
PROGRESS = click.option(
    "--progress",
    type=click.Choice(["auto", "bar", "log", "off"]),
    default="auto",
    show_default=True,
    help="A bar on a terminal, log lines elsewhere (auto), or nothing.",
)


def say(
    text: str, *, event: str, message: str | None = None, product: bool = False, **fields: Any
) -> None:
    """A command's result on stdout: ``text`` for people; with ``--log-format json`` one JSON
    object (a log line's keys, ``message`` (default: ``text``'s first line), ``event`` and
    ``fields``), so every line the process writes is JSON. ``product``: it is what the command
    makes (`deliver`), not a summary of work done elsewhere."""
    if json_logs():
        first = text.splitlines()[0] if text else ""
        message = message if message is not None else first.removeprefix("batchscore: ")
        text = json_line(message, event=event, **fields)
    if product:
        deliver(text)
    else:
        click.echo(text)


def deliver(text: str, color: bool | None = None) -> None:
    """The command's product on stdout (a status, a plan, ``--json``'s data, the help): where
    it does not reach its reader, the command fails (`batchscore.observe.streams.answered`),
    where a summary of work done elsewhere (`run`'s) lost is only a warning."""
    ctx = click.get_current_context(silent=True)
    streams = ctx.obj.get("streams") if ctx is not None and isinstance(ctx.obj, dict) else None
    if isinstance(streams, Standard):
        streams.stdout.carries = True
    click.echo(text, color=color)


def data(value: Any) -> str:
    """``--json``'s output: indented for people, one line under ``--log-format json``."""
    return json.dumps(value, indent=None if json_logs() else 2, default=str)


def reports_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Turn library errors into one clear message on stderr and the documented exit code
    (with ``--log-format json``, one JSON log line carrying the message and the code)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except BatchscoreError as exc:
            if json_logs():
                extra = {"error": type(exc).__name__, "exit_code": exc.exit_code}
                log.error("%s", exc, extra=extra)
                sys.exit(exc.exit_code)
            lines = str(exc).splitlines() or [type(exc).__name__]
            click.echo(f"batchscore: error: {lines[0]}", err=True)
            for line in lines[1:]:
                click.echo(f"  {line}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt as exc:
            code, how = (128 + exc.signum, exc.name) if isinstance(exc, Stopped) else (130, "")
            message = f"{'stopped by ' + how if how else 'interrupted'}; committed chunks are kept"
            if json_logs():
                log.error(message, extra={"exit_code": code})
            else:
                click.echo(f"batchscore: {message}, the next run resumes", err=True)
            sys.exit(code)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise  # click's own: usage errors and exits (`usage_errors` writes them as JSON)
        except Exception as exc:
            if not json_logs() and is_broken_pipe(exc):  # click would end it silently, exit 1
                traceback.print_exc()  # not stdout's (guarded, `streams`): a socket's, a bug
                sys.exit(1)
            if not json_logs():
                raise  # a bug: the traceback, exit 1
            extra = {"error": type(exc).__name__, "exit_code": 1}
            log.exception("internal error (a bug: please report it): %s", exc, extra=extra)
            sys.exit(1)

    return wrapper


def is_broken_pipe(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno == errno.EPIPE


def asked_format(args: list[str]) -> str | None:
    """The log format a command line asks for, before click has parsed it: the last of its
    ``--log-format`` values that is one (in any case), up to a ``--``; None where none is."""
    asked = None
    for i, arg in enumerate(args):
        if arg == "--":
            break
        value = arg.partition("=")[2] if arg.startswith("--log-format=") else None
        if arg == "--log-format" and i + 1 < len(args):
            value = args[i + 1]
        if value is not None and value.lower() in FORMATS:
            asked = value.lower()
    return asked


def usage_error_line(exc: click.ClickException, ctx: click.Context | None) -> str:
    """A usage error (an unknown option, a missing argument) as one JSON log line."""
    where = f" Try '{ctx.command_path} --help' for help." if ctx is not None else ""
    return json_line(
        f"{exc.format_message()}{where}",
        level="error",
        error=type(exc).__name__,
        exit_code=exc.exit_code,
    )


class Stopped(KeyboardInterrupt):
    """SIGTERM (what systemd, Kubernetes and `timeout` send) or SIGHUP, handled like Ctrl-C:
    the in-flight chunk is abandoned, the report and metrics are written, the lock released."""

    def __init__(self, signum: int) -> None:
        self.signum, self.name = signum, signal.Signals(signum).name
        super().__init__(self.name)


@contextlib.contextmanager
def stopping_on_signals() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise `Stopped` in the main thread (a second one
    waits for the clean-up the first started); the previous handlers come back after."""
    numbers = (signal.SIGTERM, signal.SIGHUP)

    def handler(signum: int, frame: object) -> None:
        for number in numbers:
            signal.signal(number, signal.SIG_IGN)
        raise Stopped(signum)

    previous = {number: signal.signal(number, handler) for number in numbers}
    try:
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old)
