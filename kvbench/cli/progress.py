"""The run's progress on the terminal (kvbench.run.case.Progress): a bar over the cases, the
running case's status, one line per finished case. Where cases run side by side (`--gpus`,
Ray), a row per running case under the bar: where it runs, the case and its status."""
from __future__ import annotations

import threading

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvbench.cli.common import console, err


class RichProgress:
    def __init__(self):
        self.bar = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("{task.fields[status]}"), console=console,
        )
        self.task = None
        self.case_id = ""
        # per started case: its claims against another case, judged when the run ends
        self.judged_later: dict[str, int] = {}
        self.rows: dict[str, object] = {}  # a case running beside others -> its row
        self.lock = threading.Lock()  # side by side, cases report from several threads

    def start(self, total, skipped):
        if skipped:
            console.print(f"resuming: {skipped} finished case(s) kept, {total} to run")
        self.bar.start()
        self.task = self.bar.add_task("cases", total=total, status="")

    def notice(self, text):
        err.print(f"[yellow]note:[/] {escape(text)}", soft_wrap=True)

    def case_started(self, case, where=None):
        with self.lock:
            self.judged_later[case.id] = sum(claim.reference is not None
                                             for claim in case.claims)
            if where is None:
                self.case_id = case.id
                self.bar.update(self.task, status=escape(case.id))
                return
            self.rows[case.id] = self.bar.add_task(escape(where), total=None,
                                                   status=escape(case.id))

    def status(self, text, case_id=None):
        with self.lock:
            row = self.rows.get(case_id)
            if row is None:
                self.bar.update(self.task, status=escape(f"{case_id or self.case_id}: {text}"))
            else:
                self.bar.update(row, status=escape(f"{case_id}: {text}"))

    def case_finished(self, result):
        with self.lock:
            row = self.rows.pop(result.id, None)
            if row is not None:
                self.bar.remove_task(row)
            self._finished(result)

    def _finished(self, result):
        mark = {"ok": "[green]ok[/]", "error": "[red]error[/]", "timeout": "[red]timeout[/]",
                "refused": "[yellow]refused[/]"}
        line = f"{mark[result.status]} {escape(result.id)} ({result.duration_s:.1f} s)"
        line += _claims(result, self.judged_later.pop(result.id, 0))
        if result.error:
            line += f"  [red]{escape(result.error.type)}: {escape(result.error.message[:200])}[/]"
        self.bar.console.print(line)
        self.bar.advance(self.task)

    def stop(self):
        self.bar.stop()


def _claims(result, judged_later: int) -> str:
    """The claims of a finished case's line, "claims 1/1, 1 skipped, 2 judged at the end": its
    own claims that held of those it judged, those it skipped (calibrated on another model), and
    those against another case, judged once the run has finished (an ok case's only)."""
    later = judged_later if result.status == "ok" else 0
    parts = []
    skipped = sum(c.verdict == "skipped" for c in result.claims)
    if len(result.claims) > skipped:
        held = sum(c.verdict == "held" for c in result.claims)
        parts.append(f"{held}/{len(result.claims) - skipped}")
    if skipped:
        parts.append(f"{skipped} skipped")
    if later:
        parts.append(f"{later} judged at the end")
    return f"  claims {', '.join(parts)}" if parts else ""
