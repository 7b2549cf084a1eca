"""The ``kstore`` command: Kafka's admin tools for a kstore store.

Exit codes: 0 success; 1 an error (one ``error: ...`` line on stderr, no traceback unless
``--debug``) or, for ``verify``, problems found; 2 a usage error; 130 interrupted (Ctrl-C),
except ``consume`` and ``produce``, for which Ctrl-C is the normal way to stop (exit 0).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from kstore.cli import consume as consume_cmd
from kstore.cli import groups, topics
from kstore.cli import housekeeping as housekeeping_cmd
from kstore.cli import jobs as jobs_cmd
from kstore.cli import maintain as maintain_cmd
from kstore.cli import produce as produce_cmd
from kstore.cli import ui as ui_cmd
from kstore.cli.common import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    WaitNotes,
    begin_invocation,
    exit_process,
    human_bytes,
    open_store,
    report_error,
    silence_stdout,
    usage_line,
)
from kstore.cli.kafka_flags import translate as translate_kafka_flags
from kstore.cli.options import (
    ConfigFileOpt,
    DebugOpt,
    OptionOpt,
    OutputOpt,
    StoreOpt,
    share_options,
    shared,
)
from kstore.cli.output import OutputFormat, TextOutput
from typer.core import TyperGroup

# typer's own exceptions (usage errors, exits, aborts) pass through untouched. typer >= 0.20
# vendors click, so they are found from typer's public classes rather than imported from click.
_CLICK_EXCEPTION: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"
)
_PASS_THROUGH: tuple[type[BaseException], ...] = (typer.Exit, typer.Abort, _CLICK_EXCEPTION)


def _reflow(text: str) -> str:
    """A docstring's paragraphs each on one line: the help formatter keeps single line breaks,
    so source-wrapped lines came out ragged once rewrapped to the terminal's width."""
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n") if p.strip())


def _reflow_help(command: Any) -> None:
    if isinstance(getattr(command, "help", None), str):
        command.help = _reflow(command.help)
    for sub in getattr(command, "commands", {}).values():
        _reflow_help(sub)


class KstoreGroup(TyperGroup):
    """The root command: gives every subcommand the shared options (options.py), and turns
    every error raised by a command into one redacted line on stderr and exit code 1 (usage
    errors keep their exit code 2)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        share_options(self)
        _reflow_help(self)

    def make_context(
        self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any
    ) -> Any:
        begin_invocation()  # before parsing: --debug is recorded while the options are parsed
        if parent is None:
            args = translate_kafka_flags(self, args)
        return super().make_context(info_name, args, parent, **extra)

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        extra["windows_expand_args"] = windows_expand_args
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        # Usage errors as one 'error:' line, like every other error (not a boxed panel).
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except _CLICK_EXCEPTION as raised:
            exc: Any = raised  # click's exception class, found at run time
            if type(exc).__name__ == "NoArgsIsHelpError":
                exc.show()  # a bare group name: its help, as before
                sys.exit(exc.exit_code)
            sys.stderr.write(f"error: {usage_line(exc)}\n")
            sys.exit(exc.exit_code)
        except typer.Abort:
            sys.stderr.write("error: aborted\n")
            sys.exit(EXIT_FAILURE)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: Any) -> Any:
        from kstore.storage import set_wait_reporter

        # What a slow storage call waits for goes to stderr: stdout stays the command's output.
        set_wait_reporter(WaitNotes())
        try:
            return super().invoke(ctx)
        except _PASS_THROUGH:
            raise
        except KeyboardInterrupt:
            sys.stderr.write("interrupted\n")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except BrokenPipeError:
            silence_stdout()  # the reader of our output went away (| head): not an error
            raise typer.Exit(0) from None
        except Exception as exc:
            report_error(exc)
            raise typer.Exit(EXIT_FAILURE) from None
        finally:
            set_wait_reporter(None)


app = typer.Typer(
    name="kstore",
    cls=KstoreGroup,
    help="Administer a kstore store: Kafka's log model on local disk or S3, with no brokers.",
    epilog="Examples:\n\n"
    "  export KSTORE_STORE=s3://bucket/ks\n\n"
    "  export KSTORE_OPTION_CLIENT_KWARGS__ENDPOINT_URL=http://127.0.0.1:8333\n\n"
    "  kstore topics create orders --partitions 3\n\n"
    "  echo 'k1:hello' | kstore produce orders --key-separator :\n\n"
    "  kstore consume orders --from-beginning --print-key\n\n"
    "Exit codes: 0 ok, 1 failure (or problems found by verify), 2 usage error.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,  # tracebacks with locals could show secrets
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(topics.app, name="topics")
app.add_typer(groups.app, name="groups")
housekeeping_cmd.register(app)  # cli/housekeeping.py
app.add_typer(maintain_cmd.app, name="maintain")


def _version(value: bool) -> None:
    if value:
        from kstore import __version__

        sys.stdout.write(f"kstore {__version__}\n")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    store: StoreOpt = None,
    option: OptionOpt = None,
    config_file: ConfigFileOpt = None,
    output: OutputOpt = OutputFormat.table,
    debug: DebugOpt = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Administer a kstore store: Kafka's log model on local disk or S3, with no brokers."""
    shared(ctx).given(
        store=store, option=option, config_file=config_file, output=output, debug=debug
    )


app.command(
    "produce",
    epilog="Examples:\n\n"
    "  kstore produce orders < records.txt\n\n"
    "  printf 'k1:v1\\nk2:v2\\n' | kstore produce orders --key-separator :\n\n"
    "  printf 'src:web\\tk1:v1\\n' | kstore produce orders --headers --key-separator :\n\n"
    "  kstore consume orders -o json | kstore produce orders-copy --format json\n\n"
    '  echo \'{"key": "k1", "value": {"n": 1}, "headers": {"src": "cli"}}\' | kstore produce orders --format json',
)(produce_cmd.produce)

app.command(
    "consume",
    epilog="Examples:\n\n"
    "  kstore consume orders                          (everything, then exit)\n\n"
    "  kstore consume orders --follow                 (new records until Ctrl-C)\n\n"
    "  kstore consume orders -p 0 --offset 42 --max-messages 10 --print-key --print-offset\n\n"
    "  kstore consume orders --from-time 2h -o json | jq .value\n\n"
    "  kstore consume orders --group billing --follow",
)(consume_cmd.consume)


app.command(
    "delete-records",
    epilog="Examples:\n\n"
    "  kstore delete-records orders --offset 1000            (every partition)\n\n"
    "  kstore delete-records orders -p 0 --offset -1         (all of partition 0)\n\n"
    "  kstore delete-records --offset-json-file offsets.json (kafka-delete-records' file)",
)(topics.delete_records)

app.command(
    "ui",
    epilog="Examples:\n\n"
    "  kstore --store s3://bucket/ks ui                 (http://127.0.0.1:8080/)\n\n"
    "  kstore ui --port 9000 --refresh 30s              (a large store on S3: fewer requests)\n\n"
    "  kstore ui --allow-writes                         (offset resets, record deletion)\n\n"
    "  curl -s http://127.0.0.1:8080/metrics | grep kafka_consumergroup_group_lag",
)(ui_cmd.ui)

# The maintenance jobs (Spark, or in this process); pyspark is imported only when one runs.
for _verb, _command in jobs_cmd.COMMANDS.items():
    app.command(_verb, epilog=jobs_cmd.EPILOGS[_verb])(_command)


@app.command(
    epilog="Examples:\n\n  kstore info --store s3://bucket/ks\n\n  kstore info -o json",
)
def info(ctx: typer.Context) -> None:
    """Show the store: its URL and storage options (secrets hidden), id, topics and groups."""
    from kstore.groups import list_groups
    from kstore.storage import redact_options, redact_url
    from kstore.store import STORE_FORMAT_VERSION

    settings = shared(ctx).settings()
    handle = open_store(settings)
    data = {
        "store": redact_url(settings.url),
        "storage_options": redact_options(settings.options),
        "store_id": handle.store_id,
        "format_version": STORE_FORMAT_VERSION,
        "topics": len(handle.list_topics()),
        "groups": len(list_groups(handle)),
    }
    shared(ctx).output.record(data, view=lambda text: text.properties(data))


@app.command(
    epilog="Examples:\n\n  kstore verify                 (every topic)\n\n  kstore verify orders users -o json\n\n"
    "Exit code 1 when a problem is found; warnings (orphan files) do not fail.",
)
def verify(
    ctx: typer.Context,
    topics_: Annotated[
        list[str] | None,
        typer.Argument(metavar="TOPIC", help="Topics to check (default: all).", show_default=False),
    ] = None,
    no_data: Annotated[
        bool,
        typer.Option(
            "--no-data", help="Check the logs and the file listing only; do not read segment data."
        ),
    ] = False,
) -> None:
    """Check topics: every log file and segment, checksums, offsets, manifest consistency.

    Lists the problems found and exits 1 when there are any.
    """
    from kstore.cli.verify import planned_bytes, verify_topic

    options = shared(ctx)
    out = options.output
    # No segment cache: every segment is read once, and memory stays flat.
    handle = options.open_store(segment_cache_bytes=0)
    names = topics_ or handle.list_topics()
    reports = []
    with out.progress("verifying", total=lambda: planned_bytes(handle, names)) as bar:
        for name in names:
            if bar is not None:
                bar.update(f"verifying {name}")
            advance = bar.advance if bar is not None else None
            reports.append(verify_topic(handle, name, progress=advance, read_data=not no_data))
    problems = [f for r in reports for f in r.problems]
    warnings = [f for r in reports for f in r.warnings]

    def view(text: TextOutput) -> None:
        # One finding per line (paths are long; a table would fold them): grep-friendly.
        text.lines(
            f"{f.severity}: {f.topic if f.partition is None else f'{f.topic}-{f.partition}'}: "
            f"{f.path + ': ' if f.path else ''}{f.message}"
            for f in problems + warnings
        )
        status = "OK" if not problems else f"{len(problems)} problem(s)"
        text.message(
            f"Verified {len(reports)} topic(s), {sum(r.partitions for r in reports)} partition(s), "
            f"{sum(r.log_files for r in reports)} log file(s), "
            f"{sum(r.segments for r in reports)} segment(s), {sum(r.records for r in reports)} "
            f"record(s), {human_bytes(sum(r.bytes for r in reports))}: {status}"
            + (f", {len(warnings)} warning(s)" if warnings else "")
            + "."
        )

    out.record({"ok": not problems, "topics": [r.to_json() for r in reports]}, view)
    if problems:
        raise typer.Exit(EXIT_FAILURE)


def main() -> None:
    """Console script entry point. The process ends through :func:`exit_process`, not the
    interpreter's teardown, which can abort it once deltalake is loaded (exit_process says
    why); typer's runner and tests call the app itself and exit as usual."""
    try:
        app(prog_name="kstore")
    except SystemExit as done:
        code = done.code
        if code is not None and not isinstance(code, int):
            sys.stderr.write(f"{code}\n")  # as the interpreter reports a non-integer code
            code = EXIT_FAILURE
        exit_process(code or 0)
    exit_process(0)


if __name__ == "__main__":
    main()
