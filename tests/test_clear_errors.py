"""Every bad configuration or file is one clear error (issue 29, item 7), never a raw traceback
or a silent pick: a collective named twice in COLLECTIVES_ALGO, a tuning table of any wrong
JSON shape, a damaged MNIST file, a full or read-only --out, a benchmark flag out of range."""
import errno
import gzip
import json
import os
import subprocess

import pytest

from benchmarks import call_overhead, sweep, tune
from collectives import settings, tuning
from collectives.tools.launch import SetupError
from collectives.train import checkpoint, data, lock


# --- COLLECTIVES_ALGO ---------------------------------------------------------------------------

def test_a_collective_named_twice_in_collectives_algo_is_an_error(monkeypatch):
    monkeypatch.setenv("COLLECTIVES_ALGO", "all_reduce:ring,all_reduce:tree")
    with pytest.raises(ValueError, match=r"COLLECTIVES_ALGO: all_reduce is named twice .*all_reduce:ring"):
        settings.algorithm_overrides()


# --- tuning tables ------------------------------------------------------------------------------

BAD_TABLES = {
    "a list": ([["all_reduce", "ring"]], r"a JSON array, not an object"),
    "a string": ("ring", r"a JSON string, not an object"),
    "choices as a list": ({"choices": [["all_reduce", "ring"]]}, r'"choices" is a JSON array'),
    "sizes as strings": ({"choices": {"all_reduce": {"2": [["4096", "ring"]]}}},
                         r'"choices"."all_reduce"."2" holds \["4096", "ring"\], not a \[size in bytes'),
    "group sizes as a list": ({"choices": {"all_reduce": [[4096, "ring"]]}}, r"not an object of group sizes"),
    "an unknown algorithm": ({"choices": {"all_reduce": {"2": [[4096, "rong"]]}}}, r"unknown algorithm 'rong'"),
    "an unknown collective": ({"choices": {"allreduce": {"2": [[4096, "ring"]]}}},
                              r"unknown collective 'allreduce'"),
    "a group size that is no number": ({"choices": {"all_reduce": {"two": [[4096, "ring"]]}}},
                                       r"group size 'two'"),
    "a model without beta": ({"model": {"alpha": 1e-5, "gamma": 1e-9}}, r'"model" lacks a finite number \'beta\''),
    "models as a list": ({"models": [1, 2]}, r'"models" is a JSON array'),
}


@pytest.mark.parametrize("case", sorted(BAD_TABLES))
def test_a_corrupt_tuning_table_names_the_file_and_what_is_wrong(case, tmp_path, monkeypatch):
    table, wrong = BAD_TABLES[case]
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    monkeypatch.setenv("COLLECTIVES_TUNING_TABLE", str(path))
    tuning.reload()
    try:
        with pytest.raises(ValueError, match=wrong) as info:
            tuning.choose("all_reduce", 4096, 2)
        assert str(path) in str(info.value) and "damaged" in str(info.value)
    finally:
        monkeypatch.delenv("COLLECTIVES_TUNING_TABLE")
        tuning.reload()


@pytest.mark.parametrize("content, wrong", [('{"choices": {"all_reduce"', "it is not JSON"),
                                             ('[["all_reduce", "ring"]]', "a JSON array, not an object")])
def test_this_machines_damaged_cache_is_named_once_and_the_shipped_table_used(content, wrong, tmp_path,
                                                                             monkeypatch):
    # The per-user cache is disposable (collectives-tune writes it again): a damaged one must not
    # make every algorithm=None call raise, as it did.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("COLLECTIVES_TUNING_TABLE", raising=False)
    tuning.reload()
    shipped_choice = [tuning.choose("all_reduce", size, n) for size in (64, 2 ** 20) for n in (2, 4)]
    os.makedirs(os.path.dirname(tuning.cache_path()))
    with open(tuning.cache_path(), "w") as f:
        f.write(content)
    tuning.reload()
    try:
        with pytest.warns(RuntimeWarning) as warned:
            chosen = [tuning.choose("all_reduce", size, n) for size in (64, 2 ** 20) for n in (2, 4)]
            chosen += [tuning.choose("all_reduce", size, n) for size in (64, 2 ** 20) for n in (2, 4)]
        assert chosen == shipped_choice * 2
        [message] = [str(w.message) for w in warned]           # once, not per call
        assert tuning.cache_path() in message and wrong in message and "shipped" in message, message
    finally:
        tuning.reload()


# --- MNIST ----------------------------------------------------------------------------------------

def test_a_damaged_mnist_file_is_named_and_called_damaged(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in data.FILES:   # all four there, one of them truncated: gzip of the wrong bytes
        with gzip.open(raw / f"{name}.gz", "wb") as f:
            f.write(b"\0" * 64)
    with pytest.raises(data.DamagedFile, match=r"train-images-idx3-ubyte\.gz is damaged") as info:
        data.prepare_mnist(str(tmp_path), download=True)
    assert "not in" not in str(info.value)
    from collectives.train.loop import data_root
    with pytest.raises(SetupError, match="is damaged"):    # the trainer says it in one line
        data_root(str(tmp_path), download=True)


def _idx(path, dims):
    """An IDX file as MNIST's (big-endian magic 0x08 0x0N, the dims, then uint8 values)."""
    import struct
    values = 1
    for d in dims:
        values *= d
    path.write_bytes(struct.pack(f">I{len(dims)}I", 0x800 + len(dims), *dims) + bytes(values))


def test_a_truncated_unpacked_mnist_file_is_named_before_any_rank_reads_it(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in data.FILES:
        _idx(raw / name, [3, 28, 28] if "images" in name else [3])
    assert data.prepare_mnist(str(tmp_path), download=False) == str(tmp_path)     # whole: accepted
    damaged = raw / "train-images-idx3-ubyte"
    damaged.write_bytes(damaged.read_bytes()[:-100])
    with pytest.raises(data.DamagedFile) as info:
        data.prepare_mnist(str(tmp_path), download=False)
    said = str(info.value)
    assert said.startswith(f"{damaged} is damaged: ") and "truncated" in said, said
    assert "it has 2,268 bytes, its header promises 2,368" in said, said
    assert "delete it" in said and "download" in said, said
    from collectives.train.loop import data_root
    with pytest.raises(SetupError, match="is damaged"):
        data_root(str(tmp_path), download=True)


# --- --out: full, read-only -----------------------------------------------------------------------

def _full_disk(obj, path, *args, **kwargs):
    with open(path, "wb") as f:
        f.write(b"partial")
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_during_a_checkpoint_says_so_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint.torch, "save", _full_disk)
    path = tmp_path / "checkpoint.pt"
    with pytest.raises(SetupError, match=r"cannot write .*checkpoint\.pt: the disk is full"):
        checkpoint.save_checkpoint({"step": 1}, str(path))
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)


def test_torch_saves_own_write_failure_is_said_the_same_way(tmp_path, monkeypatch):
    def failed(obj, path, *args, **kwargs):
        open(path, "wb").close()
        raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file")
    monkeypatch.setattr(checkpoint.torch, "save", failed)
    with pytest.raises(SetupError, match=r"most likely a full disk"):
        checkpoint.save_checkpoint({"step": 1}, str(tmp_path / "checkpoint.pt"))
    assert os.listdir(tmp_path) == []


def test_torch_saves_unexpected_pos_on_a_full_disk_is_said_the_same_way(tmp_path, monkeypatch):
    # torch.save on a full disk says only "[enforce fail at inline_container.cc] . unexpected pos
    # N vs M" (no "write" in it): the text is taken from a real save to /dev/full, always full.
    real_save = checkpoint.torch.save
    try:
        real_save({"w": checkpoint.torch.ones(100000)}, "/dev/full")
    except RuntimeError as exc:
        said = str(exc)
    else:
        pytest.skip("torch.save to /dev/full did not fail here")

    def full(obj, path, *args, **kwargs):
        real_save(obj, path)
        raise RuntimeError(said)
    checkpoint.save_checkpoint({"step": 1}, str(tmp_path / "checkpoint.pt"))
    monkeypatch.setattr(checkpoint.torch, "save", full)
    with pytest.raises(SetupError, match=r"cannot write .*checkpoint\.pt: .*full"):
        checkpoint.save_checkpoint({"step": 2}, str(tmp_path / "checkpoint.pt"))
    assert os.listdir(tmp_path) == ["checkpoint.pt"]
    assert checkpoint.load_checkpoint(str(tmp_path / "checkpoint.pt")) == {"step": 1}


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs: a disk that really fills (needs root and mount; skipped elsewhere). More than
    the 1 MiB under which a disk counts as full, so only a write that fills it is called so."""
    where = tmp_path / "disk"
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)   # -l: torch may hold a file open


def test_a_really_full_disk_says_so_names_the_path_and_keeps_the_previous_checkpoint(small_disk):
    import torch
    path = small_disk / "checkpoint.pt"
    checkpoint.save_checkpoint({"w": torch.ones(100)}, str(path))
    with pytest.raises(SetupError, match=rf"cannot write {path}: the disk is full") as info:
        checkpoint.save_checkpoint({"w": torch.ones(2 ** 21)}, str(path))     # 8 MiB
    assert len(str(info.value).splitlines()) == 1
    assert torch.equal(checkpoint.load_checkpoint(str(path))["w"], torch.ones(100))
    assert os.listdir(small_disk) == ["checkpoint.pt"]
    from collectives.train.curves import write_outputs      # the metrics, written the same way
    history = [{"epoch": 1, "train_loss": 1.0, "test_loss": 1.0, "test_accuracy": 0.5, "world_size": 1,
                "note": "x" * 2 ** 23}]
    with pytest.raises(SetupError, match=rf"cannot write {small_disk}/metrics.json: the disk is full"):
        write_outputs(str(small_disk), history)
    assert os.listdir(small_disk) == ["checkpoint.pt"]


def test_a_read_only_out_says_so(tmp_path, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(lock.os, "makedirs", read_only)
    with pytest.raises(SetupError, match=r"cannot write .*train\.lock: the file system is read-only"):
        lock.acquire_lock(str(tmp_path / "out"))
    monkeypatch.undo()
    monkeypatch.setattr(lock.os, "open", read_only)
    with pytest.raises(SetupError, match=r"read-only"):
        lock.acquire_lock(str(tmp_path / "out"))
    assert not [n for n in os.listdir(tmp_path / "out") if "tmp" in n]


# --- benchmark flags ------------------------------------------------------------------------------

@pytest.mark.parametrize("parse,argv,flag", [
    (sweep.parse_args, ["-b", "inf"], "-b"),
    (sweep.parse_args, ["-e", "nan"], "-e"),
    (sweep.parse_args, ["--timeout", "-1"], "--timeout"),
    (sweep.parse_args, ["--timeout", "inf"], "--timeout"),
    (sweep.parse_args, ["--threads", "0"], "--threads"),
    (sweep.parse_args, ["-f", "0"], "-f"),
    (sweep.parse_args, ["-n", "0"], "-n"),
    (sweep.parse_args, ["-w", "-1"], "-w"),
    (sweep.parse_args, ["--batch", "-3"], "--batch"),
    (tune.parse_args, ["--budget", "-1"], "--budget"),
    (tune.parse_args, ["--budget", "nan"], "--budget"),
    (tune.parse_args, ["--top", "0"], "--top"),
], ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_every_benchmark_flag_out_of_range_is_refused_by_name(parse, argv, flag, capsys):
    with pytest.raises(SystemExit) as info:
        parse(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and "Traceback" not in err, err


def test_call_overhead_batch_is_checked_too(capsys):
    with pytest.raises(SystemExit):
        call_overhead.main(["--batch", "1,-3"])
    assert "argument --batch" in capsys.readouterr().err
