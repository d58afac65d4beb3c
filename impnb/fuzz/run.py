"""Run `impnb info` / `impnb generate` on a file and classify the outcome.

Outcomes: "exit0"; "exit2" (status 2 and exactly one stderr line, `impnb: error: ...`);
"other" (a traceback, another status, several lines, a signal, a hang). A case's verdict is
"ok" when its outcome is one the case allows (FAIL: exit2; PASS: exit0; ANY: either).
`run_in_process` calls the CLI's main in this process under an alarm (CI: no interpreter start
per case); `run_in_subprocess` runs `python -m impnb` in a fresh process with a timeout, so
that a crash or a hung GPU stays there.
"""

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import traceback
from dataclasses import dataclass

from impnb.fuzz.mutate import ANY, FAIL, PASS

PROMPT = "hello"


@dataclass(frozen=True)
class Outcome:
    outcome: str  # exit0, exit2, other
    status: int | str
    stderr: str

    def allowed(self, expect: str) -> bool:
        return {FAIL: ("exit2",), PASS: ("exit0",), ANY: ("exit0", "exit2")}[expect].__contains__(self.outcome)


def argv_for(command: str, path, device: str = "cpu", chat: bool = False) -> list[str]:
    if command == "info":
        return ["info", str(path)]
    return ["generate", PROMPT, "--model", str(path), "--device", device, "--max-tokens", "1",
            "--temperature", "0"] + (["--chat"] if chat else [])


PROGRESS = re.compile(r"^impnb: compiling kernels \d+/\d+")  # the first start's progress, not an error


def classify(status, stderr: str) -> Outcome:
    lines = [line for line in stderr.splitlines() if line.strip() and not PROGRESS.match(line)]
    if status == 0:
        return Outcome("exit0", status, stderr)
    if status == 2 and len(lines) == 1 and lines[0].startswith("impnb: error: "):
        return Outcome("exit2", status, stderr)
    return Outcome("other", status, stderr)


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


def run_in_process(argv: list[str], timeout_s: int = 60) -> Outcome:
    """cli.main(argv) here, stdout and stderr captured, an alarm as the hang detector."""
    from impnb.cli import main

    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout_s)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(argv)
            except SystemExit as e:
                status = e.code if isinstance(e.code, int) else 1
    except _Hang:
        return Outcome("other", "hang", err.getvalue() + f"\nno result after {timeout_s} s")
    except BaseException:  # a traceback is the finding
        return Outcome("other", "traceback", err.getvalue() + traceback.format_exc())
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return classify(status, err.getvalue())


def run_forked(argv: list[str], timeout_s: int = 120) -> Outcome:
    """cli.main(argv) in a child forked from this process (imports already done): a crash or a
    hang stays in the child; a signal or the timeout is an `other`."""
    import tempfile
    import time

    with tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # the child: no return from here
            status = 70
            try:
                devnull = os.open(os.devnull, os.O_RDWR)
                os.dup2(devnull, 0)
                os.dup2(devnull, 1)
                os.dup2(err.fileno(), 2)
                from impnb.cli import main

                try:
                    status = main(argv)
                except SystemExit as e:
                    status = e.code if isinstance(e.code, int) else 1
            except BaseException:
                traceback.print_exc()
                status = 70
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(status if isinstance(status, int) else 70)
        deadline = time.monotonic() + timeout_s
        while True:
            done, wstatus = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return Outcome("other", "hang", f"no result after {timeout_s} s")
            time.sleep(0.005)
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace")
    if os.WIFSIGNALED(wstatus):
        return Outcome("other", f"signal {os.WTERMSIG(wstatus)}", stderr)
    return classify(os.WEXITSTATUS(wstatus), stderr)


def run_in_subprocess(argv: list[str], timeout_s: int = 120, env=None) -> Outcome:
    """`python -m impnb argv` in a fresh process; a signal or the timeout is an `other`."""
    try:
        p = subprocess.run([sys.executable, "-m", "impnb", *argv], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout_s,
                           env=env or os.environ.copy())
    except subprocess.TimeoutExpired:
        return Outcome("other", "hang", f"no result after {timeout_s} s")
    stderr = p.stderr.decode("utf-8", "replace")
    if p.returncode < 0:
        return Outcome("other", f"signal {-p.returncode}", stderr)
    return classify(p.returncode, stderr)
