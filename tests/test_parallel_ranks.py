"""parallel/ranks.py and rendezvous.py on the CPU: the environment a launcher gives, the unique
id handed from rank 0 to the others, a rank that never joins or joins as another world size
(one ParallelError by the deadline), and the launcher: a spawned rank that fails ends rank 0
with one line on stderr and exit 2 within seconds, the others killed; `--tp` on the CLI."""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from impnb.errors import ParallelError
from impnb.parallel import ranks, rendezvous

ROOT = Path(__file__).parents[1]


def test_rank_from_env():
    assert ranks.from_env({}) is None
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "29500"}
    r = ranks.from_env(env)
    assert (r.rank, r.world, r.local_rank, r.addr, r.port, r.leader) == (1, 2, 1, "10.0.0.2", 29500, False)
    assert ranks.from_env({**env, "TORCHELASTIC_RUN_ID": "x"}).port == 29501  # torchrun's store keeps MASTER_PORT
    assert ranks.from_env({**env, "IMPNB_TP_PORT": "4000"}).port == 4000
    assert ranks.from_env({k: v for k, v in env.items() if k != "LOCAL_RANK"}).local_rank == 1
    with pytest.raises(ParallelError, match="RANK and MASTER_PORT not"):
        ranks.from_env({"WORLD_SIZE": "2"})
    with pytest.raises(ParallelError, match="must be integers"):
        ranks.from_env({**env, "RANK": "one"})
    with pytest.raises(ParallelError, match="do not fit together"):
        ranks.from_env({**env, "RANK": "2"})
    with pytest.raises(ParallelError, match="IMPNB_TP_TIMEOUT"):
        ranks.from_env({**env, "IMPNB_TP_TIMEOUT": "-3"})


def test_start_checks_tp_against_the_environment(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(ParallelError, match="--tp 2 but WORLD_SIZE=4"):
        ranks.start(2, ["true"])
    with pytest.raises(ParallelError, match="--tp must be >= 1"):
        ranks.start(0, ["true"])
    monkeypatch.delenv("WORLD_SIZE")
    assert ranks.start(1, ["true"]) is None


def test_the_id_reaches_every_rank():
    port, world, uid = rendezvous.free_port(), 3, os.urandom(128)
    got, errors = {}, []

    def rank(r):
        try:
            got[r] = rendezvous.fetch_id(r, world, "127.0.0.1", port, 20.0, 128)
        except Exception as e:
            errors.append(e)
    threads = [threading.Thread(target=rank, args=(r,)) for r in (1, 2)]
    for t in threads:
        t.start()
    time.sleep(0.3)  # the ranks retry until rank 0 listens
    rendezvous.serve_id(uid, world, "127.0.0.1", port, 20.0)
    for t in threads:
        t.join(20)
    assert not errors and got == {1: uid, 2: uid}


def test_a_rank_that_never_joins_times_out():
    t0 = time.monotonic()
    with pytest.raises(ParallelError, match=r"rank\(s\) 1, 2 of 3 did not join within 0.5 s"):
        rendezvous.serve_id(b"\1" * 128, 3, "127.0.0.1", rendezvous.free_port(), 0.5)
    assert time.monotonic() - t0 < 3
    with pytest.raises(ParallelError, match="could not reach rank 0"):
        rendezvous.fetch_id(1, 2, "127.0.0.1", rendezvous.free_port(), 0.5, 128)


def test_a_rank_of_another_world_is_refused():
    port, errors = rendezvous.free_port(), []

    def wrong():
        try:
            rendezvous.fetch_id(1, 4, "127.0.0.1", port, 10.0, 128)
        except ParallelError as e:
            errors.append(str(e))
    t = threading.Thread(target=wrong)
    t.start()
    with pytest.raises(ParallelError, match="joined as rank 1 of 4, this run has 2 ranks"):
        rendezvous.serve_id(b"\2" * 128, 2, "127.0.0.1", port, 10.0)
    t.join(10)
    assert errors and "refused" in errors[0]


def _run(code: str, timeout: float = 60, **env) -> tuple[subprocess.CompletedProcess, float]:
    e = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        e.pop(name, None)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=timeout)
    return r, time.monotonic() - t0


def test_a_failing_rank_ends_the_run_with_one_line(tmp_path):
    worker = "import sys; print('impnb: error: GPU 1 cannot be used: no such device', file=sys.stderr); sys.exit(3)"
    code = (f"import sys, time\nfrom impnb.parallel import ranks\n"
            f"r = ranks.start(3, [sys.executable, '-c', {worker!r}])\n"
            f"assert r.rank == 0 and r.world == 3\ntime.sleep(60)\n")
    r, took = _run(code, IMPNB_TP_LOG_DIR=str(tmp_path))
    assert r.returncode == 2 and took < 30
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("impnb: error: tensor-parallel rank ")
    assert "exited with status 3: impnb: error: GPU 1 cannot be used: no such device" in lines[0]


def test_spawned_ranks_get_the_environment_and_end_with_rank_0(tmp_path):
    """Each spawned rank sees its RANK / WORLD_SIZE / port and NCCL_NVLS_ENABLE=0; rank 0's
    normal end waits for them; a rank still running when rank 0 dies is killed (PDEATHSIG)."""
    worker = ("import os, sys, time\nfrom impnb.parallel import ranks\n"
              "r = ranks.start(2, [])\n"
              "open(os.environ['OUT'] + f'/rank{r.rank}', 'w').write("
              "f\"{r.rank} {r.world} {r.port} {os.environ['NCCL_NVLS_ENABLE']} {os.getpid()}\")\n"
              "time.sleep(float(os.environ['SLEEP']))\n")
    code = (f"import sys\nfrom impnb.parallel import ranks\n"
            f"r = ranks.start(2, [sys.executable, '-c', {worker!r}])\nprint(r.port)\n")
    r, took = _run(code, OUT=str(tmp_path), SLEEP="0.5", IMPNB_TP_LOG_DIR=str(tmp_path))
    assert r.returncode == 0, r.stderr
    rank, world, port, nvls, _ = (tmp_path / "rank1").read_text().split()
    assert (rank, world, int(port), nvls) == ("1", "2", int(r.stdout), "0")
    (tmp_path / "rank1").unlink()
    code_dies = code.replace("print(r.port)", "import os, time\nwhile not os.path.exists(os.environ['OUT'] + '/rank1'): "
                             "time.sleep(0.05)\nos._exit(0)")
    r, _ = _run(code_dies, OUT=str(tmp_path), SLEEP="120", IMPNB_TP_LOG_DIR=str(tmp_path))
    assert r.returncode == 0, r.stderr
    pid = int((tmp_path / "rank1").read_text().split()[-1])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    assert not _alive(pid), "a spawned rank outlived rank 0"


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie left for a reaper)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_cli_tp_on_the_cpu_is_one_line_exit_2(tmp_path):
    from tests.tiny_models import write_tiny_model

    path = write_tiny_model(tmp_path, "llama")
    code = (f"import sys\nfrom impnb.cli import main\n"
            f"sys.exit(main(['generate', '-m', {str(path)!r}, '--device', 'cpu', '--tp', '2', '-n', '4', 'hi']))")
    r, took = _run(code, IMPNB_TP_LOG_DIR=str(tmp_path), timeout=120)
    assert r.returncode == 2 and took < 100
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--tp 2" in lines[0] and "GPU" in lines[0], r.stderr
